"""The one clock every timed part of a replay or a live run reads: CLOCK_MONOTONIC.

A replay coordinates several processes on one timeline: the load generator
sends each request at its scheduled instant, the merge workers work inside
the windows they are handed, the /metrics scraper and the live islands stamp
what they see. The wall clock (`time.time`) is the wrong clock for that: it
is stepped and slewed (NTP, or a virtual machine's agent catching up after
the host paused it). On the 2-core VM the CPU profile was measured on, it
moved about 18 s ahead of the monotonic clock during one 18-minute replay
stage, in steps of 1.4 and 15 s and in slews of about 4 ms a second; every
request after a step looked seconds late (send lag), and its latencies
seconds long, though nothing was late.

CLOCK_MONOTONIC never steps and, on Linux, is one clock for all processes of
a machine, so instants taken in different processes compare. In this code
base an *epoch* (``start_epoch``, ``window_end_epoch``) is an instant on this
clock: seconds since an arbitrary point (boot), meaningful only on the
machine that took it, and only as a difference. asyncio's loop time is the
same clock, so `asyncio.sleep` waits on it too.
"""

from __future__ import annotations

import time


def now() -> float:
    """The current instant (seconds, CLOCK_MONOTONIC)."""
    return time.monotonic()
