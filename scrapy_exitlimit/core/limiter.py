"""The admission decision: one origin token, one pair token and one exit lease, together.

``Limiter`` coordinates; each law lives in its own module:

- ``pair.py``: a pair's pacing, arrivals, cooldown, breaker and ban;
- ``learner.py``: the rate each pair paces at, learned per origin;
- ``budget.py``: the origin budget (site rate, 503s);
- ``scopes.py``: named scopes' budgets (an account, an API key), shared by every exit;
- ``stated.py``: what the server's RateLimit headers state;
- ``health.py``: an exit's concurrency cap and evictions; ``blame.py``: whose
  fault a timeout is;
- ``eligibility.py`` and ``selector.py``: which exit takes the next request;
- ``feedback.py``: each answer to the laws of the keys it concerns;
- ``state.py``, ``pool.py``, ``leases.py``, ``aliases.py``: origin and pair
  state, the exits, the requests in flight, exit IPs;
- ``views.py``, ``sharing.py``, ``forgetting.py``: what the operator sees, what
  a shared backend publishes, and what is dropped when idle.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from . import forgetting, selector, sharing, views
from .aliases import ExitAliases
from .bucket import ArrivalFloor, TokenBucket
from .changes import Feedback
from .exits import Exit
from .feedback import FeedbackLaws
from .health import EVICT_AFTER, REANIMATE_AFTER
from .leases import Lease, LeaseTable
from .limits import Limits
from .origin import OriginState
from .pair import SETTLED_MARGIN, SPREAD_MARGIN, WARM_ANSWERS, PairState
from .pool import ExitPool, ExitState
from .scopes import Scope, ScopeTable
from .selector import UNTIL_RELEASE, Candidate, HeapSelector
from .state import StateTable
from .views import ExitLoad

__all__ = ["INDEX_ABOVE", "SPREAD_MARGIN", "UNTIL_RELEASE", "WARM_ANSWERS", "Candidate",
           "Clock", "Lease", "Limiter", "OriginState", "PairState", "Tuning", "take_together"]

Clock = Callable[[], float]
#: pools larger than this are searched through a per-origin heap, not a scan
INDEX_ABOVE = 64
#: releases remembered for narrowed rescans (``Limiter._scan``): a failed scan older than
#: what is kept is done again in full
FREED_KEPT = 1024


@dataclass
class Tuning:
    """Knobs of the control laws (settings map onto these). No margin and no jitter by
    default: exact arithmetic; a crawl's are ``limits.CRAWL_TUNING``."""

    margin: float = 0.0
    jitter: float = 0.0
    start_rate: float = 2.0
    #: while the scout proves the start rate, another exit tries it times this at once
    #: (1 or less: no such leap, the scout alone)
    start_leap: float = 2.0
    max_rate: float = 1000.0
    min_rate: float = 0.05
    breaker_after: int = 5
    breaker_cooldown: float = 30.0
    ban_cooldown: float = 300.0
    evict_after: int = EVICT_AFTER
    reanimate_after: float = REANIMATE_AFTER
    overload_backoff: float = 0.5


def take_together(buckets: Sequence[TokenBucket], now: float) -> float | None:
    """One token from every bucket, or from none: None when taken, else the earliest
    time all of them could give one."""
    ready = max((bucket.ready_at(now) for bucket in buckets), default=now)
    if ready > now:
        return ready
    for bucket in buckets:
        bucket.consume(now)
    return None


def _gate(floors: Sequence[tuple[ArrivalFloor, TokenBucket]], now: float) -> float | None:
    """Until when a shared budget waits for its first request's answer (None: none does)."""
    gates = [g for arrivals, _ in floors if (g := arrivals.gate(now)) is not None]
    return max(gates) if gates else None


class Limiter:
    """Pure, in-memory admission control. The caller supplies time and waits.

    ``try_admit(origin)`` either returns a :class:`Lease` on the best exit that
    is ready now (not cooling down, banned or dead, pair token available, lease
    free, least loaded) having taken the origin token, the pair token and a
    lease all at once, or the earliest time anything could be admitted for that
    origin (``UNTIL_RELEASE`` when only a lease release can help). Feedback
    methods return a :class:`~.changes.Feedback`: events for the caller to log
    and count, and the typed state changes a shared backend copies.

    Every admission goes through ``_take``: the buckets every exit shares for
    the request (the origin budget, and each named scope's: ``scopes.py``) are
    taken together (``take_together``) with the pair's token the search judged and
    the lease; a learned scope's learner gets the feedback beside the pair's and the
    origin's.
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
        #: the safety margin a pair keeps once its path is settled (``pair.py``, rule 2);
        #: a backend whose pairs are paced by several processes keeps the whole margin
        #: (none sees when the others' requests go)
        self.settled_margin = t.margin * SETTLED_MARGIN
        self.pool = ExitPool(exits, limits, evict_after=t.evict_after,
                             reanimate_after=t.reanimate_after)
        self.state = StateTable(limits, self.tuning, clock)
        self.leases = LeaseTable()
        self.scopes = ScopeTable(start_rate=t.start_rate, min_rate=t.min_rate,
                                 max_rate=t.max_rate, margin=t.margin, clock=clock)
        self.feedback = FeedbackLaws(self.state, self.pool, self.tuning, clock, self.rng,
                                     self.scopes)
        self._heap = HeapSelector()
        #: admission times over every origin, the last second's
        self._admitted: deque[float] = deque()
        #: this process's share of every pair's rate: below 1 when processes that
        #: normally share state through a backend must each pace on their own
        self.share = 1.0
        #: a failed scan of an origin's exits stands until the earliest time it gave:
        #: till then only an exit released since can make a new scan succeed, so the
        #: next one judges only those (a broad crawl: 30 origins' queues tried after every
        #: answer, each a scan of every exit, was a tenth of the crawl's CPU). A backend
        #: that edits pair state from elsewhere (a shared one) turns it off
        self.narrow_rescans = True
        #: exits released, in order; ``_freed_base`` is the first one's sequence number
        self._freed: list[str] = []
        self._freed_base = 0
        #: per origin, per pinned exit (None: any): (until, release sequence number) of
        #: its last failed scan
        self._failed_scans: dict[str, dict[str | None, tuple[float, int]]] = {}
        self._order = {exit_id: i for i, exit_id in enumerate(self.pool.order)}

    @property
    def exits(self) -> dict[str, ExitState]:
        return self.pool.states

    @property
    def allowed(self) -> frozenset[str] | None:
        """The exits this process may admit on (None: all); see ``restrict``."""
        return self.pool.allowed

    @property
    def origins(self) -> dict[str, OriginState]:
        return self.state.origins

    @property
    def aliases(self) -> ExitAliases:
        return self.state.aliases

    @property
    def exit_ips(self) -> dict[str, str]:
        return self.state.aliases.ips

    # -- state ---------------------------------------------------------------
    def origin_state(self, origin: str) -> OriginState:
        return self.state.origin(origin)

    def pair_key(self, exit_id: str) -> str:
        """Where an exit's pair state lives: its exit IP when known, else its id."""
        return self.state.aliases.pair_key(exit_id)

    def pair_state(self, origin: str, exit_id: str) -> PairState:
        return self.state.pair(self.state.origin(origin), exit_id)

    def pair_rate(self, origin_state: OriginState, exit_id: str, pair: PairState) -> float:
        """The rate this pair should pace at now."""
        return origin_state.learner.pair_rate(exit_id, pair.learning)

    def _pace(self, origin_state: OriginState, exit_id: str, pair: PairState) -> float:
        return _OriginRules(self, origin_state).pace(exit_id, pair)

    def _sync_budget(self, origin_state: OriginState) -> TokenBucket | None:
        return origin_state.budget.sync(origin_state.learner.site_rate(),
                                        origin_state.last_admit)

    def _tick(self, origin_state: OriginState, now: float) -> None:
        learner = origin_state.learner
        if now - learner.last_tick >= 1.0:  # (the tick's own test: most tries stop here)
            # a generator: the pairs are walked only on the ticks that drift their ceilings
            learner.tick(now, (p.learning for p in origin_state.pairs.values()),
                         self._admitted_lately)
        scout = learner.scout
        if scout is not None and (scout not in self.pool.states or not self.pool.allows(scout)
                                  or not views.usable(self.state, self.pool,
                                                      origin_state.key, scout, now)):
            # a scout that cannot send (evicted, its pair banned or broken) hands its probe
            # on: in discovery every other exit waits for it
            learner.scout = None

    def _admitted_lately(self, now: float) -> int:
        """Admissions over every origin in the last second up to ``now``."""
        admitted = self._admitted
        while admitted and now - admitted[0] > 1.0:
            admitted.popleft()
        return len(admitted)

    # -- admission ---------------------------------------------------------
    def restrict(self, exit_ids: Iterable[str] | None) -> None:
        """Admit only on these exits from now on (None: on every exit again).

        For processes that normally share state through a backend and must
        for a while split the pool between them instead (each its own exits,
        at their full rate). A sticky request pinned elsewhere waits.
        """
        self.pool.restrict(exit_ids)
        self._changed()
        for origin_state in self.origins.values():  # large pools: the heap starts over
            HeapSelector.reset(origin_state.search, self.pool)

    def try_admit(self, origin: str, now: float | None = None,
                  pinned: str | None = None, scopes: Sequence[Scope] = ()) -> Lease | float:
        """A lease now, or when to ask again. ``pinned``: on this exit or not at all
        (a sticky session's); ``scopes``: named budgets the request also needs."""
        now = self.clock() if now is None else now
        origin_state = self.origin_state(origin)
        origin_state.last_used = now
        learner = origin_state.learner
        ticked, scout = learner.last_tick, learner.scout
        self._tick(origin_state, now)
        if learner.last_tick != ticked or learner.scout != scout:
            self._failed_scans.pop(origin, None)
        rules = _OriginRules(self, origin_state)
        if pinned is None and len(self.pool) > INDEX_ABOVE:
            found = self._heap.select(origin_state.search, origin, self.pool, rules, now)
            if not isinstance(found, tuple):
                return found
            exit_id, exit_state, pair = found
            lease_or_time = self._take(origin_state, exit_state, pair, now, scopes)
            # taken: back when its next token is; held up by the origin: still ready
            again = pair.ready_at(now) if isinstance(lease_or_time, Lease) else now
            self._heap.queue(origin_state.search, exit_id, again, now)
            return lease_or_time
        chosen = self._scan(origin, pinned, rules, now)
        if not isinstance(chosen, tuple):
            return chosen
        self._failed_scans.pop(origin, None)  # a grant changes what the next scan reads
        return self._take(origin_state, *chosen, now, scopes)

    def _scan(self, origin: str, pinned: str | None, rules: _OriginRules, now: float
              ) -> tuple[ExitState, PairState] | float:
        """``selector.scan`` over the pool, or over the exits released since the origin's
        last failed scan while that stands (``narrow_rescans``). Whatever else could make
        an exit ready sooner forgets it: the origin's own feedback, answers and grants,
        its learner's tick, and anything that changes the pool."""
        freed, base = self._freed, self._freed_base
        scans = self._failed_scans.get(origin) if self.narrow_rescans else None
        last = scans.get(pinned) if scans else None
        if last is not None and now < last[0] and last[1] >= base:
            states, order = self.pool.states, self._order
            released = sorted({e for e in freed[last[1] - base:]
                               if (pinned is None or e == pinned) and self.pool.allows(e)},
                              key=order.__getitem__)
            chosen = selector.scan([(e, states[e]) for e in released], rules, now)
            if not isinstance(chosen, tuple):  # the rest: not before the last scan said
                chosen = min(chosen, last[0])
        else:
            chosen = selector.scan(self.pool.members(pinned), rules, now)
        if not isinstance(chosen, tuple) and self.narrow_rescans:
            self._failed_scans.setdefault(origin, {})[pinned] = (chosen, base + len(freed))
        return chosen

    def _freed_up(self, exit_id: str) -> None:
        """``exit_id`` may take more now: the next narrowed rescans judge it."""
        self._freed.append(exit_id)
        if len(self._freed) > FREED_KEPT:  # a failed scan older than what is dropped: full
            del self._freed[:FREED_KEPT // 2]
            self._freed_base += FREED_KEPT // 2

    def _changed(self, origin: str | None = None) -> None:
        """What an exit search reads changed: for ``origin``, or (None) for every origin."""
        if origin is None:
            self._failed_scans.clear()
        else:
            self._failed_scans.pop(origin, None)

    def _take(self, origin_state: OriginState, exit_state: ExitState, pair: PairState,
              now: float, scopes: Sequence[Scope] = ()) -> Lease | float:
        """The budgets every exit shares (the origin's, each named scope's), the pair
        token and a lease, together; or when the shared budgets allow the next request.
        The pair's token is the search's to judge (``eligibility.py``): it is taken as
        judged."""
        shared = [b for b in (self._sync_budget(origin_state),) if b is not None]
        if scopes:
            shared += self.scopes.budgets(scopes, now)
        gate = _gate(self._shared_floors(origin_state, scopes), now) if shared else None
        if gate is not None:
            return gate
        wait = take_together(shared, now)
        if wait is not None:
            return wait
        gap = now - pair.last_admit
        pair.bucket.consume(now)
        return self._grant(origin_state, exit_state, pair, now, gap, scopes=scopes)

    def _shared_floors(self, origin_state: OriginState, scopes: Sequence[Scope]
                       ) -> list[tuple[ArrivalFloor, TokenBucket]]:
        """The budgets every exit shares for such a request that pace now, with their
        arrival floors."""
        budget = origin_state.budget
        out = [(budget.arrivals, budget.bucket)] if budget.bucket is not None else []
        for scope in scopes:
            state = self.scopes.states.get(scope.id)
            if state is not None and state.bucket is not None:
                out.append((state.arrivals, state.bucket))
        return out

    def first_answer_gate(self, origin: str, scopes: Sequence[Scope] = (),
                          now: float | None = None) -> tuple[float | None, bool]:
        """For a shared backend: (until when a shared budget of the request waits for its
        first request's answer, or None; whether the next request is a budget's first,
        to be asked for alone). See ``bucket.ArrivalFloor.gate``."""
        now = self.clock() if now is None else now
        origin_state = self.origin_state(origin)
        self._sync_budget(origin_state)
        if scopes:
            self.scopes.budgets(scopes, now)
        floors = self._shared_floors(origin_state, scopes)
        return _gate(floors, now), any(arrivals.pending(bucket) for arrivals, bucket in floors)

    def scope_budgets(self, scopes: Sequence[Scope], now: float | None = None
                      ) -> list[tuple[str, TokenBucket]]:
        """For a shared backend: the buckets these scopes take from now, by scope id
        (learned rates synced; a learned scope not yet limited has none)."""
        now = self.clock() if now is None else now
        out = []
        for scope in scopes:
            state = self.scopes.state(scope)
            state.last_used = now
            bucket = state.budget(now, self.tuning.margin)
            if bucket is not None:
                out.append((scope.id, bucket))
        return out

    def plan(self, origin: str, now: float | None = None, limit: int | None = None,
             pinned: str | None = None) -> tuple[list[Candidate], float]:
        """For a shared backend: the exits this process would try, best first, and the
        earliest time an exit left out could come back (``UNTIL_RELEASE``: an answer).

        Leaves out what local knowledge rules out (dead exits, exits this
        process alone fills, pairs cooling down, banned or single-file); whether
        a token and a lease are free is for the shared state to say. Pacing
        rates are synced first. Large pools are looked at round robin (see
        ``selector``): the cost follows ``limit``, not the pool's size.
        """
        now = self.clock() if now is None else now
        origin_state = self.origin_state(origin)
        origin_state.last_used = now
        self._tick(origin_state, now)
        self._sync_budget(origin_state)  # the learned site rate reaches the shared script
        members: Iterable[tuple[str, ExitState]] = self.pool.members(pinned)
        enough = math.inf
        if pinned is None and limit is not None and len(self.pool) > INDEX_ABOVE:
            members, enough = selector.round_robin(self.pool, origin_state.search), limit
        return selector.plan(members, _OriginRules(self, origin_state), now, limit, enough)

    def reserve_lease_ids(self, count: int) -> int:
        """Set aside ``count`` lease ids (for a shared backend naming leases up front)."""
        return self.leases.reserve_ids(count)

    def grant(self, origin: str, exit_id: str, now: float, gap: float,
              lease_id: int | None = None, scopes: Sequence[Scope] = (),
              site_gap: float | None = None) -> Lease:
        """Record an admission the shared state made (``gap``: since the pair's previous one;
        ``site_gap``: since the origin's, on any exit, by any process; None: this
        process's own)."""
        origin_state = self.origin_state(origin)
        self._changed(origin)
        pair = self.pair_state(origin, exit_id)
        pair.bucket.consume(now)  # keeps the local schedule close, for a fallback
        for bucket in self.scopes.budgets(scopes, now):
            bucket.consume(now)
        previous = now - gap
        if previous > pair.last_admit + 1e-6:  # another process's admission, not ours
            pair.learning.last_foreign = max(pair.learning.last_foreign, previous)
        return self._grant(origin_state, self.exits[exit_id], pair, now, gap, lease_id,
                           scopes=scopes, site_gap=site_gap)

    def _grant(self, origin_state: OriginState, exit_state: ExitState, pair: PairState, now: float,
               gap: float, lease_id: int | None = None, *, scopes: Sequence[Scope] = (),
               site_gap: float | None = None) -> Lease:
        exit_id = exit_state.exit.id
        rate = pair.bucket.rate
        if origin_state.learner.granted(exit_id, pair.learning, now):  # the new scout
            self._pace(origin_state, exit_id, pair)
        pair.admitted(now)
        # (a shared backend's origin gap counts every process's admissions: the site's
        # pace, which this process's share of it would understate, and its site rate,
        # confirmed only at its own pace, never rise)
        if site_gap is None:
            site_gap = now - origin_state.last_admit
        origin_state.last_admit = max(origin_state.last_admit, now)
        self._admitted.append(now)
        self._admitted_lately(now)  # (kept to the last second)
        for arrivals, bucket in self._shared_floors(origin_state, scopes):
            arrivals.taken(now, bucket)
        exit_state.in_flight += 1
        if lease_id is None:
            lease_id = self.leases.reserve_ids(1)
        scope_gaps = self.scopes.admitted(scopes, exit_id, now) if scopes else ()
        lease = Lease(lease_id, origin_state.key, exit_id, now, rate, gap,
                      exit_state.in_flight >= exit_state.limit, self.pair_key(exit_id), site_gap,
                      tuple(scopes), scope_gaps, pair.learning.last_foreign)
        self.leases.add(lease)
        return lease

    # -- release and feedback ------------------------------------------------
    def release(self, lease_id: int, answered: bool = True) -> Lease | None:
        """Return a lease's place to its exit; releasing twice is a no-op.

        ``answered``: the server answered (any status), so the pair's path is warm
        and its pacing is re-anchored on when the request arrived (``pair.py``).
        """
        lease = self.leases.pop(lease_id)
        if lease is None:
            return None
        exit_state = self.exits[lease.exit_id]
        exit_state.in_flight -= 1
        self._freed_up(lease.exit_id)
        self._changed(lease.origin)  # its pair's gates and the origin's budget move
        if exit_state.waiting:  # origins whose heap set this exit aside: look again
            for origin in exit_state.waiting:
                if origin in self.origins:
                    self._heap.queue(self.origins[origin].search, lease.exit_id, -math.inf,
                                     math.inf)
            exit_state.waiting.clear()
        origin_state = self.origin_state(lease.origin)
        counted = origin_state.pairs.get(lease.pair)
        if counted is not None:
            counted.in_flight -= 1
        pair = self.pair_state(lease.origin, lease.exit_id)
        if answered:
            now = self.clock()
            latency = now - lease.admitted_at
            pair.answered(now, latency)
            origin_state.budget.answered(now, latency)
            for scope in lease.scopes:
                self.scopes.state(scope).answered(now, latency)
        return lease

    # -- feedback: each answer to the laws of the keys it concerns (``feedback.py``) --
    def cpu_bound(self, busy: bool) -> None:
        """The process is CPU-bound (``busy``): exits' in-flight limits shrink back to one
        request each instead of growing, as more in flight would only wait in its event
        loop."""
        self.pool.busy = busy

    def success(self, lease: Lease, latency: float | None = None) -> Feedback:
        """A clean answer (2xx/3xx, or an ordinary 4xx such as 404)."""
        self._changed(lease.origin)
        self._freed_up(lease.exit_id)  # its in-flight limit may grow
        return self.feedback.success(lease, latency)

    def rate_limited(self, origin: str, exit_id: str, retry_after: float,
                     lease: Lease | None = None, now: float | None = None) -> Feedback:
        """A 429 on the pair: cool down (plus jitter), and learn from it once per
        congestion event (a 429 for a request admitted before the estimate last
        changed is part of the event already accounted for: it teaches nothing)."""
        self._changed(origin)
        return self.feedback.rate_limited(origin, exit_id, retry_after, lease, now)

    def announced(self, lease: Lease, rate: float | None, remaining: float | None,
                  reset: float | None) -> Feedback:
        """The server stated its quota (RateLimit / X-RateLimit-* headers): pace by it,
        or hold until an exhausted quota resets (``stated.py``)."""
        self._changed(lease.origin)
        return self.feedback.announced(lease, rate, remaining, reset)

    def banned(self, lease: Lease) -> Feedback:
        """A 403/block page: this exit is banned by this origin (not everywhere)."""
        self._changed(lease.origin)
        return self.feedback.banned(lease)

    def overloaded(self, lease: Lease, retry_after: float | None) -> Feedback:
        """A 503: the origin as a whole is overloaded; slow its budget (``budget.py``)."""
        self._changed(lease.origin)
        return self.feedback.overloaded(lease, retry_after)

    def proxy_fault(self, lease: Lease | None, exit_id: str, origin: str | None = None,
                    timeout: bool = False) -> Feedback:
        """Refused connection, failed CONNECT, timeout, 407...: the exit's health (a
        timeout the origin is to blame for does not evict it: ``blame.py``)."""
        self._changed()
        return self.feedback.proxy_fault(lease, exit_id, origin, timeout)

    def exit_ip_seen(self, exit_id: str, ip: str) -> Feedback:
        """The provider says this exit's requests leave from ``ip`` (``aliases.py``)."""
        self._changed()
        return self.feedback.exit_ip_seen(exit_id, ip)

    # -- views -----------------------------------------------------------------
    def usable(self, origin: str, exit_id: str, now: float | None = None) -> bool:
        """Whether this exit could serve this origin now: not dead, pair not banned/broken."""
        return views.usable(self.state, self.pool, origin, exit_id,
                            self.clock() if now is None else now)

    def any_usable(self, origin: str, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        return any(self.usable(origin, exit_id, now) for exit_id in self.exits)

    def exit_states(self, now: float, origins: Iterable[str] = ()) -> dict[str, int]:
        """How many exits are ready, cooling down, banned or dead, for these origins
        (all known origins when none are given): the worst state across them counts."""
        chosen = [self.origins[o] for o in origins if o in self.origins] or list(
            self.origins.values())
        return views.exit_states(self.pool, chosen, self.pair_key, now)

    def exit_load(self, exit_id: str) -> ExitLoad:
        exit_state = self.exits[exit_id]
        return ExitLoad(exit_state.limit, exit_state.in_flight, exit_state.concurrency.ceiling)

    def paced_rate(self, origin: str, exit_id: str) -> float:
        """The rate the pair is paced at now (as last synced; a new pair's is made)."""
        return self.pair_state(origin, exit_id).bucket.rate

    def safety_margin(self, pair: PairState, given: bool) -> float:
        """The safety margin the pair's pacing adds to every interval (before any for its
        arrival spread); ``given``: it paces at a rate given (configured, or stated by the
        server). A given rate keeps the whole margin until its path is settled, then what
        its arrival spread needs, ``settled_margin`` at least; a learned one keeps the
        whole margin (it was proven clean at it, and its probes step from there: in the
        simulator a settled share let a learned per-IP crawl draw 0.50 % of 429s, against
        0.40 %)."""
        margin = self.tuning.margin
        if given and pair.settled:
            return max(self.settled_margin, min(margin, pair.spread))
        return margin

    def arrival_slack(self, pair: PairState) -> float:
        """How long before its answer a pair's request surely reached the server (0 until
        warm): what a shared backend sends with a release."""
        return pair.arrival_slack

    def scope_view(self) -> dict[str, float | None]:
        """Each scope's id and the rate it is paced at now (None: learned, not limited)."""
        return {key: state.rate for key, state in self.scopes.states.items()}

    def origin_rates(self) -> dict[str, float]:
        """The rate each origin paced as a whole is paced at now (its site rate, configured
        or learned, or its 503 budget: ``budget.py``), as last synced; origins without an
        origin-wide budget are left out."""
        return {key: state.budget.bucket.rate for key, state in self.origins.items()
                if state.budget.bucket is not None}

    def pool_alive(self, now: float | None = None) -> bool:
        return self.pool.alive(self.clock() if now is None else now)

    def stale_leases(self, older_than: float, now: float | None = None) -> list[Lease]:
        return self.leases.older_than(older_than, self.clock() if now is None else now)

    # -- learned state, for sharing between processes; forgetting -------------
    def learning_mark(self, origin: str) -> tuple:
        """Changes whenever what the origin's pairs learned changes (not on ceiling drift)."""
        return sharing.learning_mark(self.origin_state(origin))

    def export_learning(self, origin: str) -> dict[str, Any]:
        """What this origin's pairs learned, as plain data (times on this limiter's clock)."""
        return sharing.export_learning(self.origin_state(origin),
                                       partial(self.state.configured_rate, origin))

    def import_learning(self, origin: str, data: Mapping[str, Any]) -> None:
        """Adopt what another process published for this origin."""
        origin_state = self.origin_state(origin)
        self._changed(origin)
        sharing.import_learning(origin_state, data, known_exit=self.exits.__contains__,
                                pair_of=partial(self.state.pair, origin_state),
                                configured=partial(self.state.configured_limit, origin))

    def forget_idle(self, now: float | None = None) -> int:
        """Drop state with nothing left to say (``forgetting.py``); returns pairs dropped."""
        now = self.clock() if now is None else now
        self._changed()
        self.scopes.forget_idle(self.leases.scopes(), now)
        return forgetting.forget_idle(self.origins, self.leases.origins(), now,
                                      self.state.configured_rate)

    def __repr__(self) -> str:
        busy = sum(e.in_flight for e in self.exits.values())
        return f"<Limiter exits={len(self.exits)} origins={len(self.origins)} in_flight={busy}>"


class _OriginRules:
    """One origin's pairs and laws, as the exit searches see them (``selector.py``)."""

    __slots__ = ("_ips", "_learner", "_limiter", "_origin", "_pacing", "_pairs", "_share")

    def __init__(self, limiter: Limiter, origin: OriginState) -> None:
        self._limiter = limiter
        self._origin = origin
        self._pairs = origin.pairs
        self._learner = origin.learner
        self._ips = limiter.aliases.ips
        self._share = limiter.share
        self._pacing = origin.learner.pool_pacing()  # (the learner does not change during a search)

    def pair(self, exit_id: str) -> PairState:
        pair = self._pairs.get(self._ips.get(exit_id, exit_id))
        return pair if pair is not None else self._limiter.state.pair(self._origin, exit_id)

    def awaits_answer(self, exit_id: str, pair: PairState, now: float) -> bool:
        if pair.in_flight > 0 and (pair.single_file or self._learner.wary(pair.learning, now)):
            return True
        return self._pacing.holding and self._learner.holds(exit_id, pair.learning,
                                                            pair.last_admit > -math.inf)

    def pace(self, exit_id: str, pair: PairState) -> float:
        """Pace the pair at the learner's rate, times this process's share; near a
        known limit, widen the margin by the arrival spread."""
        learner = self._learner
        pl = pair.learning
        pacing = self._pacing
        if pl.own is None and exit_id not in pacing.special:
            rate, near, given = pacing.rate, pacing.near, pacing.given
        else:
            rate, near = learner.pair_rate(exit_id, pl), learner.near_limit(pl)
            given = learner.given_limit(pl)
        rate *= self._share
        # near a known limit, requests are spaced by what the network does to them too:
        # paced 1/rate apart, they may reach the server ``spread`` closer than that. An
        # answer re-anchors pacing on when its request arrived (``pair.py``), so the
        # next request waits for the previous answer (up to ``spread`` past its interval,
        # at most 1.5 intervals); a share of the spread stays as margin, for what the
        # fastest answer seen so far overstates the path's floor
        margin = self._limiter.safety_margin(pair, given)
        if pair.spread and near:
            margin += min(pair.spread * SPREAD_MARGIN, 1.5 / rate)
            pair.answer_wait = min(pair.spread, 1.5 / rate)
        else:
            pair.answer_wait = 0.0
        pair.pace(rate, margin)
        return rate

    def pair_key(self, exit_id: str) -> str:
        return self._ips.get(exit_id, exit_id)
