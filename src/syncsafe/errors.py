"""The error kinds every entry point maps to an exit code.

The bottom of the import graph: any module may raise these, and the CLI turns
them into one line on stderr and an exit code, never a traceback.

- :class:`BadInput` (exit 2): params, arguments or input files that are not
  what the stage expects. The message names the key, argument, file or column
  and what was expected; nothing is written.
- exit 3: a lost island (`syncsafe.diloco.launch.IslandLost`).
- anything else that fails a run (a server that dies, a process that fails,
  an unexpected exception): exit 1, one line naming it.
- Ctrl-C: exit 130; SIGTERM where a command stops cleanly on it (`procs.sigterm_raises`): exit 143.
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
#: The line an island writes before exiting 2 on bad input; its launcher repeats what follows it.
BAD_INPUT_MARK = "bad input:"
EXIT_ISLAND_LOST = 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread was (`procs.sigterm_raises`): the cleanup Ctrl-C runs, runs."""


class BadInput(ValueError):
    """Input that is not what a stage expects; its message names what and where."""
