"""What `syncsafe run` shows while items run: each running item's own progress bar and the time left.

A running item's progress is the last state of the tqdm bar in its log (count and its own estimate of
the time left). An item not yet started is estimated from this run's finished or running items of the
same stage, else from the last run's timings (logs/run/timings.json), else from the wall its stage
declares (the real arm: its budget, `StageSpec.declared_wall`); any other item of a stage never timed
is left out of the estimate and counted as such. The time left is the larger of the longest running
item's and the remaining core-seconds spread over the cores.

On a terminal the status is one line redrawn in place (rich); elsewhere (a log, CI) it is printed every
`every_s` seconds.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.text import Text

if TYPE_CHECKING:
    from syncsafe.pipeline.parallel import Item

_BAR = re.compile(r"(?P<count>\d+/\d+) \[(?P<elapsed>[\d:]+)<(?P<left>[\d:]+|\?)")


def _seconds(clock: str) -> float:
    value = 0.0
    for part in clock.split(":"):
        value = value * 60 + float(part)
    return value


def bar_state(log: Path, tail_bytes: int = 4096) -> tuple[str, float | None] | None:
    """The last tqdm state in `log`: (``"35/80"``, seconds left or None when tqdm has no estimate yet)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - tail_bytes))
            text = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    for segment in reversed(re.split(r"[\r\n]", text)):
        match = _BAR.search(segment)
        if match:
            left = match["left"]
            return match["count"], None if left == "?" else _seconds(left)
    return None


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """The runner's terminal output; `update` is called every poll with what runs and what waits."""

    def __init__(self, jobs: int, timings: dict[str, float], every_s: float = 60.0) -> None:
        self.jobs = jobs
        self.timings = timings
        self.every_s = every_s
        self.finished_walls: dict[str, list[float]] = {}
        self.projected: dict[str, float] = {}  # stage -> projected wall of a running item of it
        self.console = Console(stderr=False)
        self.live: Live | None = None
        self._last_print = time.monotonic()

    @contextlib.contextmanager
    def shown(self) -> Iterator[None]:
        if not self.console.is_terminal:
            yield
            return
        with Live(Text(""), console=self.console, refresh_per_second=2, transient=True) as live:
            self.live = live
            try:
                yield
            finally:
                self.live = None

    def say(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        if self.live is not None:
            self.live.console.print(f"{stamp} {line}", highlight=False, markup=False)
        else:
            print(f"{stamp} {line}", flush=True, file=sys.stdout)

    def finished(self, item: Item, wall: float) -> None:
        self.finished_walls.setdefault(item.spec.name, []).append(wall)

    def estimate(self, item: Item) -> float | None:
        """Expected wall of a not yet started item, or None when nothing like it was timed."""
        walls = self.finished_walls.get(item.spec.name)
        if walls:
            return statistics.fmean(walls)
        if item.spec.name in self.projected:
            return self.projected[item.spec.name]
        timed = self.timings.get(item.name)
        return timed if timed is not None else item.declared_s

    def left(self, running: Sequence[tuple[Item, Path, float]], pending: Sequence[Item]) -> tuple[float, int, list[str]]:
        """(seconds left, items not timed, one status fragment per running item)."""
        fragments, work, longest, untimed = [], 0.0, 0.0, 0
        for item, log, elapsed in running:
            state = bar_state(log)
            known = self.estimate(item)
            left = state[1] if state and state[1] is not None else None
            if known is not None:
                left = max(left or 0.0, known - elapsed)
            if left is not None:
                self.projected[item.spec.name] = elapsed + left
                longest = max(longest, left)
                work += min(item.cores, self.jobs) * left
            else:
                untimed += 1
            fragments.append(f"{item.name} {state[0] if state else ''} {clock(elapsed)}".replace("  ", " "))
        for item in pending:
            expected = self.estimate(item)
            if expected is None:
                untimed += 1
            else:
                work += min(item.cores, self.jobs) * expected
        return max(longest, work / self.jobs), untimed, fragments

    def update(self, running: Sequence[tuple[Item, Path, float]], pending: Sequence[Item]) -> None:
        if not running:
            return
        seconds, untimed, fragments = self.left(running, pending)
        line = " | ".join(fragments) + f" | about {clock(seconds)} left"
        if untimed:
            line += f" (+{untimed} item{'s' if untimed > 1 else ''} not yet timed)"
        if self.live is not None:
            self.live.update(Text(line, overflow="ellipsis", no_wrap=True))
        elif time.monotonic() - self._last_print >= self.every_s:
            self._last_print = time.monotonic()
            self.say(line)
