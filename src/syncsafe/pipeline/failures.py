"""The documented exit codes of every entry point: one clear line on stderr instead of a traceback.

BadInput -> 2; an error carrying its own `exit_code` (IslandLost -> 3) -> that code; any other
failed run (ValueError, OSError, RuntimeError) -> 1. Typer's and click's own exits pass through unchanged, so
the same decorator serves the `syncsafe` commands and the thin `stages/*.py` entries.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

import click
import typer

from syncsafe.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput

F = TypeVar("F", bound=Callable[..., object])


def fails_cleanly(fn: F) -> F:
    """Turn the library's errors into one line on stderr and the documented exit code (SystemExit)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise  # typer's Exit is a RuntimeError of its own, not click's
        except BadInput as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(EXIT_BAD_INPUT) from None
        except (ValueError, OSError, RuntimeError) as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(getattr(err, "exit_code", EXIT_FAILED)) from None

    return wrapper  # type: ignore[return-value]
