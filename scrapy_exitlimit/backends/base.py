"""The backend interface, and the default backend: state in this process only."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core import Event, Lease, Limiter
from ..core.changes import Feedback
from ..core.scopes import Scope
from ..core.views import ExitLoad

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
    ready_at: float
    #: whether a lease released before ``ready_at`` could admit more (else it need not
    #: wake us)
    release_helps: bool = True


class Backend:
    """Decides admissions and takes feedback; the control laws live in ``self.limiter``.

    A backend owns a :class:`~scrapy_exitlimit.core.Limiter` running on the
    backend's clock. ``admit`` grants up to ``want`` leases for an origin; a
    synchronous backend answers at once, an asynchronous one with a Deferred or
    an asyncio future.
    The feedback methods apply the control laws locally and return their
    events; a shared backend also publishes their effect.

    The limiter is the backend's own: the glue (middleware, progress line,
    telemetry) asks the backend, through the methods below, for what it needs
    (a lease, whether an exit can serve, how loaded an exit is), so a backend
    is free to keep its state another way.
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

    def admit(self, origin: str, want: int, now: float, pinned: str | None = None,
              scopes: Sequence[Scope] = ()) -> Admission | Deferred | asyncio.Future:
        """Up to ``want`` leases for ``origin`` (on exit ``pinned`` only, when given: a
        sticky session's), each also taking a token of every one of ``scopes``."""
        raise NotImplementedError

    def admit_here(self, origin: str, want: int, now: float, pinned: str | None = None,
                   scopes: Sequence[Scope] = ()) -> Admission:
        """Up to ``want`` leases from this process's own state."""
        leases: list[Lease] = []
        while len(leases) < want:
            lease_or_time = self.limiter.try_admit(origin, now, pinned, scopes)
            if not isinstance(lease_or_time, Lease):
                return Admission(leases, lease_or_time)
            leases.append(lease_or_time)
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
    def _replicate(self, origin: str, feedback: Feedback) -> list[Event]:
        """What a piece of feedback changed (``origin``: where, "" for none): a backend
        sharing state copies its typed changes; every backend returns its events."""
        return feedback.events

    def release(self, lease_id: int, answered: bool = True) -> Lease | None:
        return self.limiter.release(lease_id, answered)

    def success(self, lease: Lease, latency: float | None = None) -> list[Event]:
        return self._replicate(lease.origin, self.limiter.success(lease, latency))

    def cpu_bound(self, busy: bool) -> None:
        """Whether this process is CPU-bound now: exits' in-flight limits shrink back to
        where they start instead of growing."""
        self.limiter.cpu_bound(busy)

    def rate_limited(self, lease: Lease, retry_after: float) -> list[Event]:
        return self._replicate(lease.origin, self.limiter.rate_limited(
            lease.origin, lease.exit_id, retry_after, lease))

    def announced(self, lease: Lease, rate: float | None, remaining: float | None,
                  reset: float | None) -> list[Event]:
        return self._replicate(lease.origin,
                               self.limiter.announced(lease, rate, remaining, reset))

    def banned(self, lease: Lease) -> list[Event]:
        return self._replicate(lease.origin, self.limiter.banned(lease))

    def overloaded(self, lease: Lease, retry_after: float | None) -> list[Event]:
        return self._replicate(lease.origin, self.limiter.overloaded(lease, retry_after))

    def proxy_fault(self, lease: Lease | None, exit_id: str, origin: str | None = None,
                    timeout: bool = False) -> list[Event]:
        return self._replicate(lease.origin if lease else origin or "",
                               self.limiter.proxy_fault(lease, exit_id, origin, timeout))

    def exit_ip_seen(self, exit_id: str, ip: str) -> list[Event]:
        """The provider says this exit's requests leave from ``ip`` (pair state follows)."""
        return self._replicate("", self.limiter.exit_ip_seen(exit_id, ip))

    # -- what the glue may ask -------------------------------------------------
    def lease(self, lease_id: int) -> Lease | None:
        """The lease still held under this id, if any."""
        return self.limiter.leases.get(lease_id)

    def stale_leases(self, older_than: float, now: float) -> list[Lease]:
        """Leases held longer than ``older_than`` seconds (their requests went astray)."""
        return self.limiter.stale_leases(older_than, now)

    def forget_idle(self, now: float) -> int:
        """Drop idle pair and origin state; returns how many pairs were dropped."""
        return self.limiter.forget_idle(now)

    def usable(self, origin: str, exit_id: str, now: float | None = None) -> bool:
        """Whether this exit could serve this origin now (not dead, banned or broken)."""
        return self.limiter.usable(origin, exit_id, now)

    def any_usable(self, origin: str, now: float) -> bool:
        return self.limiter.any_usable(origin, now)

    def pool_alive(self, now: float) -> bool:
        """Whether any exit is not evicted."""
        return self.limiter.pool_alive(now)

    def exit_states(self, now: float, origins: Iterable[str] = ()) -> dict[str, int]:
        """Exits by state: ``ready``, ``cooling``, ``banned``, ``dead`` (see Limiter)."""
        return self.limiter.exit_states(now, origins)

    def exit_load(self, exit_id: str) -> ExitLoad:
        """An exit's in-flight limit now, its leases, and the ceiling of its limit."""
        return self.limiter.exit_load(exit_id)

    def paced_rate(self, origin: str, exit_id: str) -> float:
        """The rate the pair is paced at now (requests/s)."""
        return self.limiter.paced_rate(origin, exit_id)

    def scope_rates(self) -> dict[str, float | None]:
        """Each named scope's id and the rate it is paced at now (None: not limited)."""
        return self.limiter.scope_view()

    def origin_rates(self) -> dict[str, float]:
        """The origins paced as a whole (a site rate, EXITLIMIT_ORIGIN_RATE, 503s) and the
        rate each is paced at now."""
        return self.limiter.origin_rates()

    def stats(self) -> dict[str, Any]:
        return {}


class MemoryBackend(Backend):
    """All state in this process: right for one ``scrapy crawl`` per pool of exits."""

    def admit(self, origin: str, want: int, now: float, pinned: str | None = None,
              scopes: Sequence[Scope] = ()) -> Admission:
        return self.admit_here(origin, want, now, pinned, scopes)
