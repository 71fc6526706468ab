"""Parking lot for requests waiting to be admitted, driven by one timer on the running loop."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred

from .core import Lease, Limiter

logger = logging.getLogger(__name__)


try:  # a timer on whatever loop Scrapy runs (asyncio or the Twisted reactor)
    from scrapy.utils.asyncio import call_later  # Scrapy >= 2.14
except ImportError:  # pragma: no cover - Scrapy 2.13

    def call_later(delay: float, func: Callable[[], Any]) -> Any:  # type: ignore[misc]
        from twisted.internet import reactor

        return reactor.callLater(delay, func)


class HandedBack(Exception):
    """A parked request was released without admission (spider closing)."""


class ExitsUnavailable(Exception):
    """No exit could serve the request's origin for EXITLIMIT_STALL_TIMEOUT (all banned/dead)."""


@dataclass
class Waiter:
    origin: str
    parked_at: float
    deferred: Deferred = field(default_factory=Deferred)


class AdmissionQueue:
    """FIFO per origin; one timer, armed for the earliest moment anything could be admitted.

    Nothing polls: the timer is re-armed only when the earliest time changes,
    and a lease release wakes the queue at once (coalesced into one call).
    """

    def __init__(self, limiter: Limiter, on_admit: Callable[[Waiter | None, Lease, float], None]):
        self.limiter = limiter
        self.on_admit = on_admit
        self.queues: dict[str, deque[Waiter]] = {}
        self.parked = 0
        self._timer: Any = None
        self._timer_at = math.inf
        self._soon: Any = None
        self.closed = False

    def acquire(self, origin: str) -> Lease | Deferred:
        """A lease now, or a Deferred that fires with one (or fails with HandedBack)."""
        if self.closed:
            raise HandedBack
        now = self.limiter.clock()
        if not self.queues.get(origin):
            got = self.limiter.try_admit(origin, now)
            if isinstance(got, Lease):
                self.on_admit(None, got, now)
                return got
        waiter = Waiter(origin, now)
        self.queues.setdefault(origin, deque()).append(waiter)
        self.parked += 1
        self._process()
        return waiter.deferred

    def wake(self) -> None:
        """State changed (a lease was released, a cooldown set): look again soon."""
        if self._soon is None and self.parked:
            self._soon = call_later(0, self._wake_now)

    def _wake_now(self) -> None:
        self._soon = None
        self._process()

    def _process(self) -> None:
        now = self.limiter.clock()
        earliest = math.inf
        active = [o for o, q in self.queues.items() if q]
        # round-robin over origins so one busy origin cannot take every lease first
        while active:
            still = []
            for origin in active:
                queue = self.queues[origin]
                got = self.limiter.try_admit(origin, now)
                if isinstance(got, Lease):
                    waiter = queue.popleft()
                    self.parked -= 1
                    self.on_admit(waiter, got, now)
                    waiter.deferred.callback(got)
                    if queue:
                        still.append(origin)
                    else:
                        del self.queues[origin]
                else:
                    earliest = min(earliest, got)
            active = still
        self._arm(earliest, now)

    def _arm(self, when: float, now: float) -> None:
        if when == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = when
        if math.isfinite(when):
            self._timer = call_later(max(0.0, when - now), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._process()

    def fail(self, origin: str, exc: Exception) -> int:
        """Fail every request parked for ``origin``; returns how many."""
        queue = self.queues.pop(origin, None) or deque()
        self.parked -= len(queue)
        for waiter in queue:
            waiter.deferred.errback(exc)
        return len(queue)

    def close(self) -> int:
        """Hand every parked request back; returns how many there were."""
        self.closed = True
        handed = 0
        for queue in self.queues.values():
            while queue:
                queue.popleft().deferred.errback(HandedBack())
                handed += 1
        self.queues.clear()
        self.parked = 0
        for timer in (self._timer, self._soon):
            if timer is not None:
                timer.cancel()
        self._timer = self._soon = None
        return handed
