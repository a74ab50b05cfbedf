"""The documented exit codes of every entry point: one clear line on stderr instead of a traceback.

BadInput -> 2; an error carrying its own `exit_code` (IslandLost -> 3) -> that code; any other
exception -> 1, with its kind named unless it is one of the library's own failures (ValueError,
OSError, RuntimeError say what failed already); Ctrl-C -> 130. Typer's and click's own exits pass
through unchanged, so the same decorator serves the `syncsafe` commands and the thin `stages/*.py`
entries. `SYNCSAFE_TRACEBACK=1` lets the traceback through, for debugging.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

import click
import typer

from syncsafe.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, BadInput, Terminated

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
        except Terminated:
            print("error: terminated (SIGTERM)", file=sys.stderr)
            raise SystemExit(EXIT_TERMINATED) from None
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            raise SystemExit(EXIT_INTERRUPTED) from None
        except Exception as err:
            if os.environ.get("SYNCSAFE_TRACEBACK") == "1":
                raise
            own = isinstance(err, (ValueError, OSError, RuntimeError))
            text = str(err).strip()
            line = (text or type(err).__name__) if own else (f"{type(err).__name__}: {text}" if text else type(err).__name__)
            print(f"error: {line}", file=sys.stderr)
            raise SystemExit(getattr(err, "exit_code", EXIT_FAILED)) from None

    return wrapper  # type: ignore[return-value]

