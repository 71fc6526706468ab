"""The admission decision: one origin token, one pair token and one exit lease, together."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .bucket import TokenBucket
from .exits import Exit
from .limits import StaticLimits

Clock = Callable[[], float]
#: ``Limiter.try_admit`` returns this wait when only a lease release can help.
UNTIL_RELEASE = math.inf
#: how fast ``PairState.min_latency`` forgets a fast sample (the path may get slower)
LATENCY_FORGET = 0.02


@dataclass
class PairState:
    """(origin, exit): where the server's per-IP limit lives."""

    bucket: TokenBucket
    cooldown_until: float = -math.inf
    streak_429: int = 0
    in_flight: int = 0
    #: no answer seen yet: the first request may sit behind a cold connection and
    #: reach the server late, so the second one would land too close behind it
    proven: bool = False
    #: the fastest admission-to-answer time seen lately (drifts up slowly)
    min_latency: float = math.inf

    @property
    def probing(self) -> bool:
        return not self.proven and self.in_flight > 0

    def ready_at(self, now: float) -> float:
        return max(self.bucket.ready_at(now), self.cooldown_until)


@dataclass
class ExitState:
    exit: Exit
    limit: int
    in_flight: int = 0

    @property
    def free(self) -> bool:
        return self.in_flight < self.limit


@dataclass
class OriginState:
    key: str
    budget: TokenBucket | None
    pairs: dict[str, PairState] = field(default_factory=dict)


@dataclass(frozen=True)
class Lease:
    """One admitted request: holds a place on its exit until released."""

    id: int
    origin: str
    exit_id: str
    admitted_at: float


class Limiter:
    """Pure, in-memory admission control. The caller supplies time and waits.

    ``try_admit(origin)`` either returns a :class:`Lease` on the best exit that
    is ready now (not cooling down, pair token available, lease free, least
    loaded) having consumed the origin token, the pair token and a lease all
    at once, or the earliest time anything could be admitted for that origin
    (``UNTIL_RELEASE`` when every exit's leases are taken).
    """

    def __init__(
        self,
        exits: Sequence[Exit],
        limits: StaticLimits,
        *,
        clock: Clock,
        margin: float = 0.0,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if not exits:
            raise ValueError("a Limiter needs at least one exit")
        self.limits = limits
        self.clock = clock
        self.margin = margin
        self.jitter = jitter
        self.rng = rng or random.Random()
        self.exits: dict[str, ExitState] = {
            ex.id: ExitState(ex, limits.exit_concurrency(ex.id)) for ex in exits
        }
        self.origins: dict[str, OriginState] = {}
        self.leases: dict[int, Lease] = {}
        self._lease_ids = itertools.count(1)

    # -- state -------------------------------------------------------------
    def origin_state(self, origin: str) -> OriginState:
        state = self.origins.get(origin)
        if state is None:
            ol = self.limits.origin(origin)
            budget = TokenBucket(ol.rate, ol.burst) if ol.rate is not None else None
            state = self.origins[origin] = OriginState(origin, budget)
        return state

    def pair_state(self, origin: str, exit_id: str) -> PairState:
        ostate = self.origin_state(origin)
        pair = ostate.pairs.get(exit_id)
        if pair is None:
            pl = self.limits.pair(origin, exit_id)
            pair = ostate.pairs[exit_id] = PairState(TokenBucket(pl.rate, pl.burst, self.margin))
        return pair

    # -- admission ---------------------------------------------------------
    def try_admit(self, origin: str, now: float | None = None) -> Lease | float:
        now = self.clock() if now is None else now
        ostate = self.origin_state(origin)
        best: tuple[tuple[float, float], ExitState, PairState] | None = None
        earliest = UNTIL_RELEASE
        for estate in self.exits.values():
            if not estate.free:
                continue
            pair = ostate.pairs.get(estate.exit.id) or self.pair_state(origin, estate.exit.id)
            if pair.probing:
                continue  # its first answer will wake the queue
            ready = pair.ready_at(now)
            if ready > now:
                earliest = min(earliest, ready)
                continue
            # least loaded first, then the pair that has waited longest
            key = (estate.in_flight / estate.limit, pair.bucket.tat)
            if best is None or key < best[0]:
                best = (key, estate, pair)
        if best is None:
            return earliest
        if ostate.budget is not None:
            origin_ready = ostate.budget.ready_at(now)
            if origin_ready > now:
                return origin_ready
            ostate.budget.consume(now)
        _, estate, pair = best
        pair.bucket.consume(now)
        pair.in_flight += 1
        estate.in_flight += 1
        lease = Lease(next(self._lease_ids), origin, estate.exit.id, now)
        self.leases[lease.id] = lease
        return lease

    def release(self, lease_id: int, answered: bool = True) -> Lease | None:
        """Return a lease's place to its exit; releasing twice is a no-op.

        ``answered``: the server answered (any status), so the pair's path is warm.
        """
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            self.exits[lease.exit_id].in_flight -= 1
            pair = self.pair_state(lease.origin, lease.exit_id)
            pair.in_flight -= 1
            if answered:
                self._answered(pair, lease)
        return lease

    def _answered(self, pair: PairState, lease: Lease) -> None:
        """Re-anchor the pair's pacing on when its request can at the latest have arrived.

        The server counts arrivals, we count admissions. A request delayed on
        its way (a cold connection, a busy event loop) arrives late, and the
        next one, sent on schedule, lands too close behind it. The answer tells
        how late: a request answered ``latency`` after admission reached the
        server no later than ``now - min_latency``.
        """
        now = self.clock()
        latency = now - lease.admitted_at
        if not pair.proven:
            pair.proven = True
            pair.min_latency = latency
            arrived_by = now  # nothing to compare with yet: assume the worst
        else:
            drift = pair.min_latency + LATENCY_FORGET * (latency - pair.min_latency)
            pair.min_latency = min(latency, drift)
            arrived_by = now - pair.min_latency
        pair.bucket.arrived(arrived_by)

    def stale_leases(self, older_than: float, now: float | None = None) -> Iterable[Lease]:
        now = self.clock() if now is None else now
        return [lease for lease in self.leases.values() if now - lease.admitted_at > older_than]

    # -- feedback ----------------------------------------------------------
    def rate_limited(self, origin: str, exit_id: str, retry_after: float,
                     now: float | None = None) -> float:
        """A 429 on the pair: it cools down for ``retry_after`` plus jitter.

        A later, shorter Retry-After never shortens a cooldown already set;
        the bucket is held so the cooldown ends with one request, not a burst.
        Returns the cooldown's end.
        """
        now = self.clock() if now is None else now
        pair = self.pair_state(origin, exit_id)
        until = now + retry_after * (1.0 + self.rng.uniform(0.0, self.jitter))
        pair.cooldown_until = max(pair.cooldown_until, until)
        pair.bucket.hold_until(pair.cooldown_until)
        pair.streak_429 += 1
        return pair.cooldown_until

    def succeeded(self, origin: str, exit_id: str) -> None:
        pair = self.origin_state(origin).pairs.get(exit_id)
        if pair is not None:
            pair.streak_429 = 0

    def __repr__(self) -> str:
        busy = sum(e.in_flight for e in self.exits.values())
        return f"<Limiter exits={len(self.exits)} origins={len(self.origins)} in_flight={busy}>"
