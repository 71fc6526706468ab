"""The admission decision: one origin token, one pair token and one exit lease, together."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .bucket import TokenBucket
from .events import Event
from .exits import Exit
from .health import EVICT_AFTER, REANIMATE_AFTER, ConcurrencyLimit, ExitHealth
from .learner import OriginLearner, PairLearning, estimate_data, load_estimate
from .learning import RateEstimate
from .limits import Limits

Clock = Callable[[], float]
#: ``Limiter.try_admit`` returns this wait when only a lease release can help.
UNTIL_RELEASE = math.inf
#: how fast ``PairState.min_latency`` forgets a fast sample (the path may get slower)
LATENCY_FORGET = 0.02
#: answers a pair needs before its fastest latency is trusted to bound arrival times
WARM_ANSWERS = 3
#: latency samples the arrival spread of a pair is read from (its 90th percentile)
SPREAD_SAMPLES = 16
#: timeouts on several exits of one origin within this many seconds blame the origin
TIMEOUT_WINDOW = 30.0
#: pools larger than this are searched through a per-origin index, not a scan
INDEX_ABOVE = 64
#: pair state untouched this long (seconds), with nothing to remember, is dropped
PAIR_IDLE = 600.0
#: origin state untouched this long is dropped, what it learned included
ORIGIN_IDLE = 3600.0


@dataclass
class Tuning:
    """Knobs of the control laws (settings map onto these). No margin and no jitter by
    default: exact arithmetic; a crawl's are ``limits.CRAWL_TUNING``."""

    margin: float = 0.0
    jitter: float = 0.0
    start_rate: float = 2.0
    max_rate: float = 1000.0
    min_rate: float = 0.05
    breaker_after: int = 5
    breaker_cooldown: float = 30.0
    ban_cooldown: float = 300.0
    evict_after: int = EVICT_AFTER
    reanimate_after: float = REANIMATE_AFTER
    overload_backoff: float = 0.5


@dataclass
class PairState:
    """(origin, exit): where the server's per-IP limit lives."""

    bucket: TokenBucket
    #: what the answers taught about this pair's limit (its own rate, trust, probes)
    learning: PairLearning = field(default_factory=PairLearning)
    cooldown_until: float = -math.inf
    streak_429: int = 0
    in_flight: int = 0
    #: no answer seen yet: the first request may sit behind a cold connection and
    #: reach the server late, so the second one would land too close behind it
    proven: bool = False
    #: the fastest admission-to-answer time seen lately (drifts up slowly)
    min_latency: float = math.inf
    answers: int = 0
    #: how much later than the fastest an answer comes (recent samples), and their 90th
    #: percentile: how far apart in time requests paced evenly may reach the server
    lateness: deque[float] = field(default_factory=lambda: deque(maxlen=SPREAD_SAMPLES))
    spread: float = 0.0
    breaker_opened: int = 0  # times the breaker opened without a success since
    half_open: bool = False
    banned_until: float = -math.inf
    bans: int = 0
    last_admit: float = -math.inf
    last_success: float = -math.inf

    @property
    def own(self) -> RateEstimate | None:
        """The pair's own limit (configured, announced, or learned as slower than the pool)."""
        return self.learning.own

    @own.setter
    def own(self, value: RateEstimate | None) -> None:
        self.learning.own = value

    @property
    def single_file(self) -> bool:
        """One request at a time: a new pair, or a half-open breaker or ban."""
        return (not self.proven or self.half_open) and self.in_flight > 0

    def ready_at(self, now: float) -> float:
        return max(self.bucket.ready_at(now), self.cooldown_until, self.banned_until)


@dataclass
class ExitState:
    exit: Exit
    concurrency: ConcurrencyLimit
    health: ExitHealth
    in_flight: int = 0
    #: origins whose index set this exit aside until a lease on it is released
    waiting: set[str] = field(default_factory=set)

    @property
    def limit(self) -> int:
        return 1 if self.health.suspect else self.concurrency.limit

    def usable(self, now: float) -> bool:
        return not self.health.dead(now) and self.in_flight < self.limit


@dataclass
class OriginState:
    key: str
    #: the origin as a whole: paced at the learned (or configured) site rate and
    #: the 503 budget, whichever is lower; None while neither applies
    budget: TokenBucket | None
    #: what the origin's answers taught: the pool's per-IP rate, the site's, scouts
    learner: OriginLearner
    pairs: dict[str, PairState] = field(default_factory=dict)
    overloaded_until: float = -math.inf  # 503: no budget increase before this
    overload_at: float = -math.inf  # the last 503 decrease
    overload_rate: float | None = None  # the 503 budget, growing back while clean
    last_admit: float = -math.inf  # the origin's latest admission, any exit
    #: large pools: exits by the time they could next be admitted (a lower bound,
    #: checked when taken); exits set aside until a release are in neither
    index: list[tuple[float, int, str]] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)  # ready exits, the warmest last
    indexed: set[str] = field(default_factory=set)  # exits on the heap or the stack
    #: large pools, shared backends: where the next plan starts looking (round robin)
    plan_from: int = 0
    last_used: float = -math.inf
    #: exit -> its last timeout here (recent ones only): many exits at once is the origin
    timeouts: dict[str, float] = field(default_factory=dict)

    @property
    def estimate(self) -> RateEstimate:
        """The origin's typical per-IP limit, learned once for the whole pool."""
        return self.learner.pool

    @property
    def scout(self) -> str | None:
        return self.learner.scout


@dataclass(frozen=True)
class Candidate:
    """An exit a shared backend may admit on: its pair's pacing and the exit's lease cap."""

    exit_id: str
    interval: float  # seconds between the pair's requests (GCRA emission interval)
    tolerance: float  # how far ahead of schedule a burst may run
    limit: int  # the exit's in-flight cap
    pair: str  # where the pair's state lives: the exit IP when known, else the exit id


@dataclass(frozen=True)
class Lease:
    """One admitted request: holds a place on its exit until released."""

    id: int
    origin: str
    exit_id: str
    admitted_at: float
    rate: float  # the pair's pacing rate at admission
    gap: float  # time since the pair's previous admission
    was_full: bool  # this lease filled the exit's limit
    pair: str = ""  # the pair key (exit IP or exit id) that counts it in flight
    site_gap: float = math.inf  # time since the origin's previous admission, any exit


class Limiter:
    """Pure, in-memory admission control. The caller supplies time and waits.

    ``try_admit(origin)`` either returns a :class:`Lease` on the best exit that
    is ready now (not cooling down, banned or dead, pair token available, lease
    free, least loaded) having consumed the origin token, the pair token and a
    lease all at once, or the earliest time anything could be admitted for that
    origin (``UNTIL_RELEASE`` when only a lease release can help). Feedback
    methods return :class:`Event` lists for the caller to log and count.
    """

    def __init__(
        self,
        exits: Sequence[Exit],
        limits: Limits,
        *,
        clock: Clock,
        tuning: Tuning | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not exits:
            raise ValueError("a Limiter needs at least one exit")
        self.limits = limits
        self.clock = clock
        self.tuning = tuning or Tuning()
        self.rng = rng or random.Random()
        t = self.tuning
        self.exits: dict[str, ExitState] = {
            ex.id: ExitState(
                ex,
                ConcurrencyLimit(limits.exit_concurrency(ex.id),
                                 min(2, limits.exit_concurrency(ex.id))),
                ExitHealth(evict_after=t.evict_after, backoff=t.reanimate_after),
            )
            for ex in exits
        }
        self._exit_order = list(self.exits)
        self.origins: dict[str, OriginState] = {}
        self.leases: dict[int, Lease] = {}
        self._next_lease_id = 1
        self._index_seq = itertools.count()
        #: exit id -> the address its requests leave from, when the provider tells
        self.exit_ips: dict[str, str] = {}
        #: this process's share of every pair's rate: below 1 when processes that
        #: normally share state through a backend must each pace on their own
        self.share = 1.0
        #: the exits this process may admit on (None: all); see ``restrict``
        self.allowed: frozenset[str] | None = None

    # -- state -------------------------------------------------------------
    def origin_state(self, origin: str) -> OriginState:
        state = self.origins.get(origin)
        if state is None:
            ol = self.limits.origin(origin)
            budget = TokenBucket(ol.rate, ol.burst) if ol.rate is not None else None
            t = self.tuning
            # the start rate is a guess, not knowledge: the scout proves it first
            pool = RateEstimate(t.start_rate, floor=t.min_rate, ceiling=t.max_rate,
                                proven=False)
            learner = OriginLearner(pool, t.min_rate, t.max_rate,
                                    learning_of=partial(self._learning_of, origin),
                                    site_ceiling=ol.rate)
            state = self.origins[origin] = OriginState(origin, budget, learner,
                                                       last_used=self.clock())
        return state

    def _learning_of(self, origin: str, exit_id: str) -> PairLearning | None:
        pair = self.origins[origin].pairs.get(self.pair_key(exit_id))
        return None if pair is None else pair.learning

    def pair_key(self, exit_id: str) -> str:
        """Where an exit's pair state lives: its exit IP when known, else its id (two
        sessions the provider puts on one IP share one limit, as the server sees it)."""
        return self.exit_ips.get(exit_id, exit_id)

    def pair_state(self, origin: str, exit_id: str) -> PairState:
        return self._pair(self.origin_state(origin), exit_id)

    def _pair(self, ostate: OriginState, exit_id: str) -> PairState:
        key = self.exit_ips.get(exit_id, exit_id)
        pair = ostate.pairs.get(key)
        if pair is None:
            pl = self.limits.pair(ostate.key, exit_id)
            t = self.tuning
            if pl.rate is not None:  # configured: a ceiling, lowered only by 429s
                own = self._fixed_estimate(pl.rate)
                bucket = TokenBucket(pl.rate, pl.burst, t.margin)
            else:  # learned: even pacing, no burst the server has not shown it takes
                own = None
                bucket = TokenBucket(ostate.estimate.lo, 1, t.margin)
            pair = ostate.pairs[key] = PairState(bucket, PairLearning(own))
        return pair

    def _fixed_estimate(self, rate: float) -> RateEstimate:
        """A limit known from configuration or the server: no probing above it."""
        return RateEstimate(rate, floor=min(self.tuning.min_rate, rate), ceiling=rate)

    def pair_rate(self, ostate: OriginState, exit_id: str, pair: PairState) -> float:
        """The rate this pair should pace at now."""
        return ostate.learner.pair_rate(exit_id, pair.learning)

    def _sync_rate(self, ostate: OriginState, exit_id: str, pair: PairState) -> float:
        rate = self.pair_rate(ostate, exit_id, pair) * self.share
        # near a known limit, requests are spaced by what the network does to them too:
        # paced 1/rate apart, they may reach the server ``spread`` closer than that
        # (at most 1.5 intervals: past that, the learned rate takes the rest)
        margin = self.tuning.margin
        if pair.spread and ostate.learner.near_limit(pair.learning):
            margin += min(pair.spread, 1.5 / rate)
        bucket = pair.bucket
        if rate != bucket.rate or margin != bucket.margin:
            slower = rate < bucket.rate
            bucket.set_rate(rate, margin=margin)
            if slower:  # the next request one new interval after the last, not sooner
                bucket.arrived(pair.last_admit)
        return rate

    def _sync_budget(self, ostate: OriginState) -> TokenBucket | None:
        """The origin budget at the lower of the site rate and the 503 budget."""
        rates = [r for r in (ostate.learner.site_rate(), ostate.overload_rate) if r is not None]
        if not rates:
            ostate.budget = None
            return None
        rate = min(rates)
        budget = ostate.budget
        if budget is None:
            budget = ostate.budget = TokenBucket(rate, self.limits.origin(ostate.key).burst,
                                                 self.tuning.margin)
        elif rate != budget.rate:
            budget.set_rate(rate)
        return budget

    # -- admission ---------------------------------------------------------
    def restrict(self, exit_ids: Iterable[str] | None) -> None:
        """Admit only on these exits from now on (None: on every exit again).

        For processes that normally share state through a backend and must
        for a while split the pool between them instead (each its own exits,
        at their full rate). A sticky request pinned elsewhere waits.
        """
        self.allowed = None if exit_ids is None else frozenset(exit_ids)
        for ostate in self.origins.values():  # large pools: the index starts over
            ostate.index.clear()
            ostate.ready[:] = [e for e in reversed(self.exits) if self._allowed(e)]
            ostate.indexed = set(ostate.ready)

    def _allowed(self, exit_id: str) -> bool:
        return self.allowed is None or exit_id in self.allowed

    def _pool(self, only: str | None) -> Iterable[tuple[str, ExitState]]:
        if only is not None:
            return ((only, self.exits[only]),) if self._allowed(only) else ()
        if self.allowed is None:
            return self.exits.items()
        return ((e, self.exits[e]) for e in self.allowed)

    def try_admit(self, origin: str, now: float | None = None,
                  only: str | None = None) -> Lease | float:
        """``only``: admit on this exit or not at all (a sticky session's)."""
        now = self.clock() if now is None else now
        ostate = self.origin_state(origin)
        ostate.last_used = now
        self._tick_estimate(ostate, now)
        if only is None and len(self.exits) > INDEX_ABOVE:
            return self._try_admit_indexed(ostate, now)
        best: tuple[tuple[float, float], ExitState, PairState] | None = None
        earliest = UNTIL_RELEASE
        for exit_id, estate in self._pool(only):
            if estate.health.dead(now):
                earliest = min(earliest, estate.health.dead_until)
                continue
            if estate.in_flight >= estate.limit:
                continue
            pair = self._pair(ostate, exit_id)
            if self._awaits_answer(ostate, exit_id, pair):
                continue  # an answer will wake the queue
            self._sync_rate(ostate, exit_id, pair)
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
        _, estate, pair = best
        return self._take(ostate, estate, pair, now)

    @staticmethod
    def _awaits_answer(ostate: OriginState, exit_id: str, pair: PairState) -> bool:
        """One request at a time (new pair, half-open breaker), or discovery holding it."""
        return pair.single_file or ostate.learner.holds(exit_id, pair.learning,
                                                        pair.last_admit > -math.inf)

    def _take(self, ostate: OriginState, estate: ExitState, pair: PairState,
              now: float) -> Lease | float:
        """The origin token, the pair token and a lease, together; or when the origin's
        budget allows the next request (the pair is ready: the caller checked)."""
        budget = self._sync_budget(ostate)
        if budget is not None:
            origin_ready = budget.ready_at(now)
            if origin_ready > now:
                return origin_ready
            budget.consume(now)
        gap = now - pair.last_admit
        pair.bucket.consume(now)
        return self._grant(ostate, estate, pair, now, gap)

    def _try_admit_indexed(self, ostate: OriginState, now: float) -> Lease | float:
        """The large-pool search, in O(log exits): the warmest exit that is ready.

        Exits wait on a heap by the time they could next be admitted (a lower
        bound, checked when taken); those whose time has come move onto a stack
        of ready exits, and the one used most recently is taken first. So a
        crawl keeps a working set of warm exits (open connections, proven
        pairs) and brings in cold ones only when the warm ones are paced out:
        under a rate limit that still spreads the load over as many exits as
        it needs. An exit at its lease limit, or waiting for its pair's first
        answer, is set aside until a release on it puts it back.
        """
        index, ready = ostate.index, ostate.ready
        if not ostate.indexed:  # first use: every exit ready, the first configured on top
            ready.extend(e for e in reversed(self.exits) if self._allowed(e))
            ostate.indexed.update(ready)
        while index and index[0][0] <= now:
            ready.append(heapq.heappop(index)[2])
        while ready:
            exit_id = ready.pop()
            ostate.indexed.discard(exit_id)
            if not self._allowed(exit_id):  # back when the restriction is lifted
                continue
            estate = self.exits[exit_id]
            if estate.health.dead(now):
                self._index(ostate, exit_id, estate.health.dead_until, now)
                continue
            pair = self._pair(ostate, exit_id)
            if estate.in_flight >= estate.limit or self._awaits_answer(ostate, exit_id, pair):
                estate.waiting.add(ostate.key)  # a release puts it back
                continue
            self._sync_rate(ostate, exit_id, pair)
            when = pair.ready_at(now)
            if when > now:
                self._index(ostate, exit_id, when, now)
                continue
            got = self._take(ostate, estate, pair, now)
            # taken: back when its next token is; held up by the origin: still ready
            self._index(ostate, exit_id, pair.ready_at(now) if isinstance(got, Lease) else now,
                        now)
            return got
        return index[0][0] if index else UNTIL_RELEASE

    def _index(self, ostate: OriginState, exit_id: str, when: float, now: float) -> None:
        """Queue an exit for when it could next be admitted (ready now: on the stack)."""
        if exit_id in ostate.indexed:
            return
        ostate.indexed.add(exit_id)
        if when <= now:
            ostate.ready.append(exit_id)
        else:
            heapq.heappush(ostate.index, (when, next(self._index_seq), exit_id))

    def plan(self, origin: str, now: float | None = None, limit: int | None = None,
             only: str | None = None) -> tuple[list[Candidate], float]:
        """For a shared backend: the exits this process would try, best first, and the
        earliest time an exit left out could come back (``UNTIL_RELEASE``: an answer).

        Leaves out what local knowledge rules out (dead exits, exits this
        process alone fills, pairs cooling down, banned or single-file); whether
        a token and a lease are free is for the shared state to say. Pacing
        rates are synced first. Large pools are looked at round robin, from
        where the last plan stopped, until ``limit`` candidates are found: the
        cost follows ``limit``, not the pool's size.
        """
        now = self.clock() if now is None else now
        ostate = self.origin_state(origin)
        ostate.last_used = now
        self._tick_estimate(ostate, now)
        self._sync_budget(ostate)  # the learned site rate reaches the shared script
        ranked: list[tuple[tuple[float, float], Candidate]] = []
        earliest = UNTIL_RELEASE
        pool: Iterable[tuple[str, ExitState]] = self._pool(only)
        enough = math.inf
        if only is None and limit is not None and len(self.exits) > INDEX_ABOVE:
            pool, enough = self._round_robin(ostate), limit
        for exit_id, estate in pool:
            if estate.health.dead(now):
                earliest = min(earliest, estate.health.dead_until)
                continue
            if estate.in_flight >= estate.limit:  # a release here wakes the queue
                continue
            pair = self._pair(ostate, exit_id)
            if self._awaits_answer(ostate, exit_id, pair):
                continue
            blocked = max(pair.cooldown_until, pair.banned_until)
            if blocked > now:
                earliest = min(earliest, blocked)
                continue
            self._sync_rate(ostate, exit_id, pair)
            bucket = pair.bucket
            ranked.append(((estate.in_flight / estate.limit, pair.last_admit),
                           Candidate(exit_id, bucket.interval, bucket.tolerance, estate.limit,
                                     self.pair_key(exit_id))))
            if len(ranked) >= enough:
                break
        ranked.sort(key=lambda item: item[0])
        return [c for _, c in ranked[:limit]], earliest

    def _round_robin(self, ostate: OriginState) -> Iterator[tuple[str, ExitState]]:
        order, start = self._exit_order, ostate.plan_from
        for i in range(len(order)):
            index = (start + i) % len(order)
            ostate.plan_from = index + 1
            if self._allowed(order[index]):
                yield order[index], self.exits[order[index]]

    def reserve_lease_ids(self, count: int) -> int:
        """Set aside ``count`` lease ids (for a shared backend naming leases up front)."""
        first = self._next_lease_id
        self._next_lease_id += count
        return first

    def grant(self, origin: str, exit_id: str, now: float, gap: float,
              lease_id: int | None = None) -> Lease:
        """Record an admission the shared state made (``gap``: since the pair's previous one)."""
        ostate = self.origin_state(origin)
        pair = self.pair_state(origin, exit_id)
        pair.bucket.consume(now)  # keeps the local schedule close, for a fallback
        return self._grant(ostate, self.exits[exit_id], pair, now, gap, lease_id)

    def _grant(self, ostate: OriginState, estate: ExitState, pair: PairState, now: float,
               gap: float, lease_id: int | None = None) -> Lease:
        exit_id = estate.exit.id
        rate = pair.bucket.rate
        if ostate.learner.granted(exit_id, pair.learning, now):  # the new scout
            self._sync_rate(ostate, exit_id, pair)
        pair.last_admit = now
        site_gap, ostate.last_admit = now - ostate.last_admit, now
        pair.in_flight += 1
        estate.in_flight += 1
        if lease_id is None:
            lease_id = self.reserve_lease_ids(1)
        lease = Lease(lease_id, ostate.key, exit_id, now, rate, gap,
                      estate.in_flight >= estate.limit, self.pair_key(exit_id), site_gap)
        self.leases[lease.id] = lease
        return lease

    def _tick_estimate(self, ostate: OriginState, now: float) -> None:
        # a generator: the pairs are walked only on the ticks that drift their ceilings
        ostate.learner.tick(now, (p.learning for p in ostate.pairs.values()))

    def usable(self, origin: str, exit_id: str, now: float | None = None) -> bool:
        """Whether this exit could serve this origin now: not dead, pair not banned/broken."""
        now = self.clock() if now is None else now
        if self.exits[exit_id].health.dead(now):
            return False
        pair = self.origin_state(origin).pairs.get(self.pair_key(exit_id))
        return pair is None or not (pair.banned_until > now or pair.breaker_opened and
                                    pair.cooldown_until > now)

    def any_usable(self, origin: str, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return any(self.usable(origin, exit_id, now) for exit_id in self.exits)

    def exit_states(self, now: float, origins: Iterable[str] = ()) -> dict[str, int]:
        """How many exits are ready, cooling down, banned or dead, for these origins
        (all known origins when none are given): the worst state across them counts."""
        keys = [self.origins[o] for o in origins if o in self.origins] or list(
            self.origins.values())
        counts = {"ready": 0, "cooling": 0, "banned": 0, "dead": 0}
        for exit_id, estate in self.exits.items():
            state = "ready"
            if estate.health.dead(now):
                state = "dead"
            else:
                for ostate in keys:
                    pair = ostate.pairs.get(self.pair_key(exit_id))
                    if pair is None:
                        continue
                    if pair.banned_until > now:
                        state = "banned"
                        break
                    if pair.cooldown_until > now:
                        state = "cooling"
            counts[state] += 1
        return counts

    def pool_alive(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return any(not e.health.dead(now) for e in self.exits.values())

    # -- release and feedback ------------------------------------------------
    def release(self, lease_id: int, answered: bool = True) -> Lease | None:
        """Return a lease's place to its exit; releasing twice is a no-op.

        ``answered``: the server answered (any status), so the pair's path is warm.
        """
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            estate = self.exits[lease.exit_id]
            estate.in_flight -= 1
            if estate.waiting:  # indexed origins that set this exit aside: look again
                for origin in estate.waiting:
                    if origin in self.origins:
                        self._index(self.origins[origin], lease.exit_id, -math.inf, math.inf)
                estate.waiting.clear()
            counted = self.origin_state(lease.origin).pairs.get(lease.pair)
            if counted is not None:
                counted.in_flight -= 1
            pair = self.pair_state(lease.origin, lease.exit_id)
            if answered:
                self._answered(pair, lease)
        return lease

    @staticmethod
    def arrival_slack(pair: PairState) -> float:
        """How long before its answer a request surely reached the server (0 until warm)."""
        return pair.min_latency if pair.answers > WARM_ANSWERS else 0.0

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
        pair.proven = True
        pair.answers += 1
        if pair.answers == 1:
            pair.min_latency = latency
        else:
            drift = pair.min_latency + LATENCY_FORGET * (latency - pair.min_latency)
            pair.min_latency = min(latency, drift)
        pair.lateness.append(latency - pair.min_latency)
        if len(pair.lateness) >= WARM_ANSWERS:
            late = sorted(pair.lateness)
            pair.spread = late[int(0.9 * (len(late) - 1))]
        # until a few answers show what "fast" is for this path, assume the worst
        pair.bucket.arrived(now - self.arrival_slack(pair))

    def success(self, lease: Lease, latency: float | None = None) -> list[Event]:
        """A clean answer (2xx/3xx, or an ordinary 4xx such as 404)."""
        now = self.clock()
        events: list[Event] = []
        ostate = self.origin_state(lease.origin)
        pair = self.pair_state(lease.origin, lease.exit_id)
        estate = self.exits[lease.exit_id]
        pair.streak_429 = 0
        pair.last_success = now
        if pair.half_open or pair.breaker_opened or pair.bans:
            if pair.half_open:
                events.append(Event("recovered", lease.origin, lease.exit_id, "probe succeeded"))
            pair.half_open = False
            pair.breaker_opened = 0
            pair.bans = 0
        estate.health.success()
        if latency is not None:
            moved = estate.concurrency.success(latency, lease.was_full)
            if moved:
                events.append(Event(f"concurrency_{moved}", lease.origin, lease.exit_id,
                                    f"limit {estate.concurrency.limit} (latency {latency:.3f}s, "
                                    f"baseline {estate.concurrency.baseline:.3f}s)"))
        events += ostate.learner.succeeded(
            lease.origin, lease.exit_id, pair.learning, rate=lease.rate, gap=lease.gap,
            margin=pair.bucket.margin, admitted_at=lease.admitted_at, site_gap=lease.site_gap,
            now=now,
            configured=self.limits.pair(lease.origin, lease.exit_id).rate is not None)
        if ostate.overload_rate is not None and now >= ostate.overloaded_until:
            self._recover_budget(ostate)
        return events

    def rate_limited(self, origin: str, exit_id: str, retry_after: float,
                     lease: Lease | None = None, now: float | None = None) -> list[Event]:
        """A 429 on the pair: cool down, and learn from it once per congestion event.

        The pair cools down for ``retry_after`` plus jitter; a later, shorter
        Retry-After never shortens a cooldown already set; the bucket is held so
        the cooldown ends with one request, not a burst. A 429 for a request
        admitted before the estimate last changed is part of the congestion
        event already accounted for: it cools the pair but teaches nothing.
        """
        now = self.clock() if now is None else now
        t = self.tuning
        events: list[Event] = []
        ostate = self.origin_state(origin)
        pair = self.pair_state(origin, exit_id)
        until = now + retry_after * (1.0 + self.rng.uniform(0.0, t.jitter))
        pair.streak_429 += 1
        pair.learning.rate_streak += 1
        if pair.half_open or pair.streak_429 >= t.breaker_after:
            pair.breaker_opened += 1
            pair.half_open = True
            hold = t.breaker_cooldown * 2 ** (pair.breaker_opened - 1)
            until = max(until, now + min(hold, 3600.0))
            events.append(Event("breaker_open", origin, exit_id,
                                f"{pair.streak_429} 429s in a row: open for {until - now:.1f}s"))
        pair.cooldown_until = max(pair.cooldown_until, until)
        pair.bucket.hold_until(pair.cooldown_until)
        events.append(Event("cooldown", origin, exit_id, f"{pair.cooldown_until - now:.2f}s"))
        if lease is None:
            return events
        stated = pair.learning.announced
        if stated is not None and lease.rate <= stated * (1 + 1e-9):
            # a 429 at or under what the server stated: the statement is wrong for this
            # pair until it changes; learning takes over from it
            pair.learning.announced, pair.learning.distrusted = None, stated
            configured = self.limits.pair(origin, exit_id).rate
            pair.own = (self._fixed_estimate(configured) if configured is not None else
                        RateEstimate(stated, floor=t.min_rate, ceiling=t.max_rate))
            events.append(Event("announcement_wrong", origin, exit_id,
                                f"429 at {lease.rate:.3g} r/s, stated {stated:.3g}"))
        events += ostate.learner.rate_limited(
            origin, exit_id, pair.learning, rate=lease.rate, gap=lease.gap,
            admitted_at=lease.admitted_at, now=now, slack=pair.bucket.margin + pair.spread,
            pick_scout=partial(self._pick_scout, ostate, now))
        return events

    def _pick_scout(self, ostate: OriginState, now: float, exclude: Sequence[str]
                    ) -> str | None:
        """Another exit to probe with: one of the pool's (no limit of its own), usable."""
        choices = [e for e in self.exits if e not in exclude and self._allowed(e)
                   and self.usable(ostate.key, e, now)
                   and (p := ostate.pairs.get(self.pair_key(e))) is not None
                   and p.own is None and p.cooldown_until <= now]
        if not choices:
            return None
        chosen = self.rng.choice(choices)
        pair = ostate.pairs[self.pair_key(chosen)]
        pair.learning.confirmations, pair.learning.confirmed_rate = 0, math.inf
        ostate.learner.scout_since = now
        return chosen

    def announced(self, lease: Lease, rate: float | None, remaining: float | None,
                  reset: float | None) -> list[Event]:
        """The server stated its quota (RateLimit / X-RateLimit-* headers): pace by it.

        A stated rate becomes the pair's own, with no probing above it; an
        exhausted quota (remaining 0) holds the pair until the reset, so the
        429 never comes. Headers are a hint, answers the truth: a statement a
        429 contradicted (see ``rate_limited``) is ignored until it changes.
        """
        now = self.clock()
        pair = self.pair_state(lease.origin, lease.exit_id)
        events: list[Event] = []
        if rate is not None and rate > 0:
            rate = min(max(rate, self.tuning.min_rate), self.tuning.max_rate)
            configured = self.limits.pair(lease.origin, lease.exit_id).rate
            if configured is not None:  # a configured rate stays a ceiling
                rate = min(rate, configured)
            learning = pair.learning
            if rate != learning.announced and rate != learning.distrusted:
                learning.announced, learning.distrusted = rate, None
                pair.own = self._fixed_estimate(rate)
                events.append(Event("rate_announced", lease.origin, lease.exit_id,
                                    f"server states {rate:.3g} r/s"))
        elif remaining is not None and reset is not None and remaining < 1 and reset > 0:
            until = now + reset
            if until > pair.cooldown_until:
                pair.cooldown_until = until
                pair.bucket.hold_until(until)
                events.append(Event("quota_exhausted", lease.origin, lease.exit_id,
                                    f"holding {reset:.2f}s until the quota resets"))
        return events

    def banned(self, lease: Lease) -> list[Event]:
        """A 403/block page: this exit is banned by this origin (not everywhere)."""
        now = self.clock()
        pair = self.pair_state(lease.origin, lease.exit_id)
        pair.bans += 1
        hold = self.tuning.ban_cooldown * 2 ** (pair.bans - 1)
        pair.banned_until = max(pair.banned_until, now + min(hold, 86400.0))
        pair.half_open = True  # after the ban, one probe first
        return [Event("pair_banned", lease.origin, lease.exit_id,
                      f"banned for {pair.banned_until - now:.0f}s")]

    def overloaded(self, lease: Lease, retry_after: float | None) -> list[Event]:
        """A 503: the origin as a whole is overloaded; slow its budget, honour Retry-After.

        Once per congestion event (503s to requests sent before the last
        decrease count once): the budget drops to half the rate the origin was
        actually admitted at over the last second, and holds for Retry-After;
        no increase before twice that has passed.
        """
        now = self.clock()
        t = self.tuning
        ostate = self.origin_state(lease.origin)
        if lease.admitted_at <= ostate.overload_at:
            return []
        ostate.overload_at = now
        admitted = ostate.learner.admitted_rate(now)
        current = ostate.budget.rate if ostate.budget is not None else math.inf
        ostate.overload_rate = max(min(admitted, current) * t.overload_backoff, t.min_rate)
        budget = self._sync_budget(ostate)
        assert budget is not None
        hold = retry_after if retry_after is not None else 1.0
        ostate.overloaded_until = now + max(hold, 1.0) * 2
        budget.hold_until(now + max(hold, 0.0))
        return [Event("origin_slowed", lease.origin, None,
                      f"origin budget {budget.rate:.3g} r/s, paused {hold:.1f}s")]

    def _recover_budget(self, ostate: OriginState) -> None:
        """The 503 budget grows back about +1 r/s per second while clean (2 % per answer
        when fast); once above every other limit it is gone."""
        rate = ostate.overload_rate
        assert rate is not None
        rate += max(0.02 * rate, 1.0 / rate)
        top = ostate.learner.site_rate()
        if rate >= (top if top is not None else self.tuning.max_rate * len(self.exits)):
            ostate.overload_rate = None
        else:
            ostate.overload_rate = rate
        self._sync_budget(ostate)

    def proxy_fault(self, lease: Lease | None, exit_id: str, origin: str | None = None,
                    timeout: bool = False) -> list[Event]:
        """Refused connection, failed CONNECT, timeout, 407...: the exit's health.

        A timeout is ambiguous: the exit, or the origin (a stalled answer looks the
        same). When several exits time out on one origin while this one still gets
        answers from it, the origin is the slow one: the exit carries less (its
        concurrency) but is not evicted for it.
        """
        now = self.clock()
        estate = self.exits[exit_id]
        origin = lease.origin if lease is not None else origin
        events: list[Event] = []
        if estate.concurrency.fault():
            events.append(Event("concurrency_decrease", origin or "", exit_id,
                                f"limit {estate.concurrency.limit} after a fault"))
        if timeout and origin is not None and self._origin_stalls(origin, exit_id, now):
            events.append(Event("origin_timeout", origin, exit_id,
                                "the origin is slow for several exits: not the exit's fault"))
            return events
        if estate.health.fault(now):
            events.append(Event("evicted", origin or "", exit_id,
                                f"{estate.health.faults} faults: out for "
                                f"{estate.health.dead_until - now:.0f}s"))
        return events

    def _origin_stalls(self, origin: str, exit_id: str, now: float) -> bool:
        ostate = self.origin_state(origin)
        timeouts = ostate.timeouts
        timeouts[exit_id] = now
        for other in [e for e, at in timeouts.items() if now - at > TIMEOUT_WINDOW]:
            del timeouts[other]
        answered = now - self.pair_state(origin, exit_id).last_success <= TIMEOUT_WINDOW
        return answered and len(timeouts) >= 2

    def exit_ip_seen(self, exit_id: str, ip: str) -> list[Event]:
        """The provider says this exit's requests leave from ``ip``: pair state follows it.

        A new address gets pair state of its own (governed from its first
        request, as any new pair); the old address's cooldowns stay with the old
        address, and two exits on one address share one pair.
        """
        old = self.exit_ips.get(exit_id)
        if old == ip:
            return []
        self.exit_ips[exit_id] = ip
        return [Event("exit_ip_changed", "", exit_id, f"{old or 'unknown'} -> {ip}")]

    # -- learned state, for sharing between processes ------------------------
    def learning_mark(self, origin: str) -> tuple:
        """Changes whenever what the origin's pairs learned changes (not on ceiling drift)."""
        ostate = self.origin_state(origin)
        owns = tuple((eid, p.own.lo, p.own.changed_at) for eid, p in ostate.pairs.items()
                     if p.own is not None)
        return (ostate.learner.mark(), ostate.overload_at, owns)

    def export_learning(self, origin: str) -> dict[str, Any]:
        """What this origin's pairs learned, as plain data (times on this limiter's clock)."""
        ostate = self.origin_state(origin)
        owns = {}
        for exit_id, pair in ostate.pairs.items():
            if pair.own is not None and not self._pristine(origin, exit_id, pair.own):
                owns[exit_id] = estimate_data(pair.own)
        return {
            **ostate.learner.export(),
            "overload_rate": ostate.overload_rate,
            "overloaded_until": ostate.overloaded_until,
            "overload_at": ostate.overload_at,
            "own": owns,
        }

    def import_learning(self, origin: str, data: Mapping[str, Any]) -> None:
        """Adopt what another process published for this origin."""
        ostate = self.origin_state(origin)
        ostate.learner.load(data, lambda exit_id: exit_id in self.exits)
        ostate.overloaded_until = data["overloaded_until"]
        ostate.overload_at = data["overload_at"]
        ostate.overload_rate = data["overload_rate"]
        self._sync_budget(ostate)
        owns = data["own"]
        for exit_id in set(owns) | set(ostate.pairs):
            if exit_id not in self.exits and exit_id not in ostate.pairs:
                continue
            pair = ostate.pairs.get(exit_id) or self._pair(ostate, exit_id)
            if exit_id in owns:
                if pair.own is None:
                    pair.own = RateEstimate(1.0)
                load_estimate(pair.own, owns[exit_id])
            else:
                pl = self.limits.pair(origin, exit_id)
                pair.own = self._fixed_estimate(pl.rate) if pl.rate is not None else None

    def _pristine(self, origin: str, exit_id: str, own: RateEstimate) -> bool:
        """A configured pair's estimate that has learned nothing yet."""
        rate = self.limits.pair(origin, exit_id).rate
        return rate is not None and own.lo == rate and own.hi is None and own.ceiling == rate

    def forget_idle(self, now: float | None = None) -> int:
        """Drop state with nothing left to say, so long crawls over many origins stay in
        bounded memory: pairs idle for PAIR_IDLE with no lease, cooldown, ban or limit of
        their own; origins idle for ORIGIN_IDLE with no lease. Returns pairs dropped."""
        now = self.clock() if now is None else now
        busy = {lease.origin for lease in self.leases.values()}
        dropped = 0
        for key in list(self.origins):
            ostate = self.origins[key]
            if key not in busy and now - ostate.last_used > ORIGIN_IDLE:
                dropped += len(ostate.pairs)
                del self.origins[key]
                continue
            for pair_key, pair in list(ostate.pairs.items()):
                if (pair.in_flight == 0 and now - pair.last_admit > PAIR_IDLE
                        and pair.cooldown_until < now and pair.banned_until < now
                        and pair_key != ostate.scout
                        and (pair.own is None or self._pristine(key, pair_key, pair.own))):
                    del ostate.pairs[pair_key]
                    dropped += 1
        return dropped

    def stale_leases(self, older_than: float, now: float | None = None) -> list[Lease]:
        now = self.clock() if now is None else now
        return [lease for lease in self.leases.values() if now - lease.admitted_at > older_than]

    def __repr__(self) -> str:
        busy = sum(e.in_flight for e in self.exits.values())
        return f"<Limiter exits={len(self.exits)} origins={len(self.origins)} in_flight={busy}>"
