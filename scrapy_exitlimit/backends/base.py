"""The backend interface, and the default backend: state in this process only."""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core import Event, Lease, Limiter

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

    from ..config import ExitLimitConfig
    from ..core.warm import Recalled
    from ..state_file import StateFile


class Admission(NamedTuple):
    """What one admission call granted, and when to ask again for the rest."""

    leases: list[Lease]
    #: the earliest time (backend clock) anything more could be admitted;
    #: ``math.inf`` when only a released lease can help
    wait: float
    #: whether a lease released before ``wait`` could admit more (else it need not wake us)
    release_helps: bool = True


class Backend:
    """Decides admissions and takes feedback; the control laws live in ``self.limiter``.

    A backend owns a :class:`~scrapy_exitlimit.core.Limiter` running on the
    backend's clock. ``admit`` grants up to ``want`` leases for an origin; a
    synchronous backend answers at once, an asynchronous one with a Deferred or
    an asyncio future.
    The feedback methods apply the control laws locally and return their
    events; a shared backend also publishes their effect.
    """

    #: ``admit`` returns an :class:`Admission`, not a Deferred
    synchronous = True

    def __init__(self, config: ExitLimitConfig) -> None:
        self.config = config
        self.limiter = Limiter(config.exits, config.limits, clock=self.clock,
                               tuning=config.tuning, rng=random.Random())

    @classmethod
    def from_crawler(cls, crawler: Crawler, config: ExitLimitConfig) -> Backend:
        return cls(config)

    def clock(self) -> float:
        return time.monotonic()

    def admit(self, origin: str, want: int, now: float,
              only: str | None = None) -> Admission | Deferred | asyncio.Future:
        """Up to ``want`` leases for ``origin`` (on exit ``only``, when given)."""
        raise NotImplementedError

    def admit_here(self, origin: str, want: int, now: float,
                   only: str | None = None) -> Admission:
        """Up to ``want`` leases from this process's own state."""
        leases: list[Lease] = []
        while len(leases) < want:
            got = self.limiter.try_admit(origin, now, only)
            if not isinstance(got, Lease):
                return Admission(leases, got)
            leases.append(got)
        return Admission(leases, now)

    def open(self) -> None:
        """The crawl started (called on the running event loop)."""

    def close(self) -> Deferred | None:
        """The crawl ended: stop background work."""
        return None

    def warm_start(self, state_file: StateFile) -> Recalled | None:
        """Start from what an earlier run learned (EXITLIMIT_STATE_FILE), before ``open``;
        ``recalled`` follows, after it."""
        return state_file.load(self.limiter)

    def recalled(self, origins: list[str]) -> None:
        """These origins start from what an earlier run learned (``warm_start``); a shared
        backend shares it."""

    def save_state(self, state_file: StateFile) -> bool:
        """Write what was learned to EXITLIMIT_STATE_FILE; True when written."""
        return state_file.save(self.limiter)

    def describe(self) -> str:
        return "memory"

    # -- feedback: the control laws, then whatever the backend shares ------------
    def release(self, lease_id: int, answered: bool = True) -> Lease | None:
        return self.limiter.release(lease_id, answered)

    def success(self, lease: Lease, latency: float | None = None) -> list[Event]:
        return self.limiter.success(lease, latency)

    def rate_limited(self, lease: Lease, retry_after: float) -> list[Event]:
        return self.limiter.rate_limited(lease.origin, lease.exit_id, retry_after, lease)

    def announced(self, lease: Lease, rate: float | None, remaining: float | None,
                  reset: float | None) -> list[Event]:
        return self.limiter.announced(lease, rate, remaining, reset)

    def banned(self, lease: Lease) -> list[Event]:
        return self.limiter.banned(lease)

    def overloaded(self, lease: Lease, retry_after: float | None) -> list[Event]:
        return self.limiter.overloaded(lease, retry_after)

    def proxy_fault(self, lease: Lease | None, exit_id: str, origin: str | None = None,
                    timeout: bool = False) -> list[Event]:
        return self.limiter.proxy_fault(lease, exit_id, origin, timeout)

    def stats(self) -> dict[str, Any]:
        return {}


class MemoryBackend(Backend):
    """All state in this process: right for one ``scrapy crawl`` per pool of exits."""

    def admit(self, origin: str, want: int, now: float,
              only: str | None = None) -> Admission:
        return self.admit_here(origin, want, now, only)
