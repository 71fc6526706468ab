"""Exit health and per-exit concurrency: AIMD on latency, eviction on proxy faults."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: a latency this many times the exit's baseline (and LATENCY_KNEE_FLOOR above it) is a knee
LATENCY_KNEE = 3.0
LATENCY_KNEE_FLOOR = 0.25
#: how fast the baseline forgets a fast sample
BASELINE_FORGET = 0.01
#: a process busy on the CPU this share of the wall time is CPU-bound: more requests in
#: flight would only wait in its own event loop (and cost it memory and GC)
BUSY_SHARE = 0.9
#: seconds over which that share is measured
BUSY_WINDOW = 0.25
#: the in-flight limit an exit starts at
START_LIMIT = 2
#: what an exit full of work shrinks back to while the process is CPU-bound: one request
#: on its way per exit. Every answer beyond that waits in this process's event loop, and
#: with it the tasks Scrapy starts for it (lab, no limit, 10 exits, 8 alternated rounds:
#: learned / bare 0.977 at one, 0.936 at two; bare Scrapy itself ran 0.935 of its pace
#: with 20 in flight instead of 8)
BUSY_LIMIT = 1
#: while CPU-bound, requests the downloader may hold parked per queue (an origin, a pinned
#: exit, a set of scopes), beyond what it has in flight (``narrowed_total``)
BUSY_ROOM = 16


@dataclass
class ConcurrencyLimit:
    """AIMD in-flight limit for one exit, clamped to [1, ceiling].

    +1 after ``limit`` successes that each found the limit in use, but -1 instead
    (down to BUSY_LIMIT) while this process is CPU-bound (``busy``); x0.5 on a
    timeout or proxy fault; x0.75 on a latency knee (latency far above the exit's
    own baseline); at most one decrease per ``limit`` answers.
    """

    ceiling: int
    limit: int = 2
    baseline: float = math.inf
    _successes: int = 0
    _since_decrease: int = 0

    def __post_init__(self) -> None:
        self.limit = max(1, min(self.limit, self.ceiling))

    def success(self, latency: float, was_full: bool, busy: bool = False) -> str | None:
        """A clean answer; returns "increase"/"decrease" when the limit moved. ``busy``:
        the process is CPU-bound, so a full exit is not what holds it back."""
        self._since_decrease += 1
        knee = self.baseline * LATENCY_KNEE
        if math.isfinite(self.baseline) and latency > max(knee, self.baseline + LATENCY_KNEE_FLOOR):
            self._observe(latency)
            return "decrease" if self._decrease(0.75) else None
        self._observe(latency)
        if busy:
            # CPU-bound: what is in flight beyond one request waits in this process's own
            # loop; give it back one at a time (it grows again once the CPU has room)
            may_move, step, moved = self.limit > BUSY_LIMIT, -1, "decrease"
        else:
            may_move, step, moved = self.limit < self.ceiling, 1, "increase"
        if was_full and may_move:
            self._successes += 1
            if self._successes >= self.limit:
                self._successes = 0
                self.limit += step
                return moved
        return None

    def fault(self) -> bool:
        return self._decrease(0.5)

    def _observe(self, latency: float) -> None:
        if latency < self.baseline:
            self.baseline = latency
        else:
            self.baseline += BASELINE_FORGET * (latency - self.baseline)

    def _decrease(self, factor: float) -> bool:
        if self._since_decrease < self.limit:
            return False  # answers to requests sent before the last decrease
        self._since_decrease = 0
        self._successes = 0
        new = max(1, int(self.limit * factor))
        changed = new != self.limit
        self.limit = new
        return changed


class CpuLoad:
    """Whether this process is CPU-bound: its CPU time over the last ``window`` seconds
    of wall time. Plain arithmetic on the two clocks the caller reads."""

    def __init__(self, window: float = BUSY_WINDOW, share: float = BUSY_SHARE) -> None:
        self.window = window
        self.share = share
        self.busy = False
        self._since: tuple[float, float] | None = None  # (wall, cpu) the window began at

    def due(self, wall: float) -> bool:
        """Whether a sample at ``wall`` would start the first window or end one (only
        then can ``busy`` change: the CPU clock need not be read otherwise)."""
        return self._since is None or wall - self._since[0] >= self.window

    def sample(self, wall: float, cpu: float) -> bool:
        """``busy`` as of the last window that ended by ``wall`` (``cpu``: the process's
        CPU seconds then)."""
        if not self.due(wall):
            return self.busy
        if self._since is not None:
            began_wall, began_cpu = self._since
            self.busy = (cpu - began_cpu) >= self.share * (wall - began_wall)
        self._since = (wall, cpu)
        return self.busy


def narrowed_total(configured: int, busy: bool, held: int, parked: int,
                   room: int = BUSY_ROOM, queues: int = 1) -> int:
    """How many requests Scrapy's downloader should hold, parked ones included:
    ``configured`` (CONCURRENT_REQUESTS; 0: no limit) unless the process is ``busy``; then
    those it holds past admission (``held`` less ``parked``) and ``room`` more for each of
    the ``queues`` its parked requests wait in, if that is fewer. A request parked while
    the CPU is the limit gains nothing and costs memory and collections; in the scheduler
    it costs nothing (``room.py``)."""
    if not busy:
        return configured
    total = max(held - parked, 0) + max(room * max(queues, 1), 1)
    return total if configured <= 0 or total < configured else configured


#: consecutive proxy faults that evict an exit, and seconds before its first probe
#: (EXITLIMIT_EVICT_AFTER, EXITLIMIT_REANIMATE_AFTER; Tuning's defaults too)
EVICT_AFTER = 3
REANIMATE_AFTER = 10.0


@dataclass
class ExitHealth:
    """Consecutive proxy faults evict an exit; it comes back through a single probe."""

    evict_after: int = EVICT_AFTER
    backoff: float = REANIMATE_AFTER
    max_backoff: float = 300.0
    faults: int = 0
    dead_until: float = -math.inf
    evictions: int = 0

    def dead(self, now: float) -> bool:
        return now < self.dead_until

    @property
    def suspect(self) -> bool:
        """Evicted before and not yet proven alive again: one probe at a time."""
        return self.evictions > 0 and self.faults > 0

    def fault(self, now: float) -> bool:
        """A proxy fault; True when it evicts the exit."""
        self.faults += 1
        if self.dead(now):
            return False  # a request sent before the eviction: already counted
        if self.faults >= self.evict_after or self.evictions:
            wait = min(self.backoff * 2**self.evictions, self.max_backoff)
            self.evictions += 1
            self.dead_until = now + wait
            return True
        return False

    def success(self) -> None:
        self.faults = 0
        self.evictions = 0
