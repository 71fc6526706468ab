"""Feedback: each answer goes to the laws of the keys it concerns.

=========================  =============================================  ===========
answer                     what changes (the law)                          key
=========================  =============================================  ===========
2xx/3xx, ordinary 4xx      breaker closed, bans forgotten (``pair.py``);   pair, exit,
                           exit healthy, its cap may grow (``health.py``);  origin
                           the rate learned (``learner.py``); the 503
                           budget grows back (``budget.py``)
429                        cooldown, breaker (``pair.py``); a statement    pair,
                           proved wrong (``stated.py``); the rate learned,  scope
                           once per congestion event (``learner.py``): the
                           pair's, the site's, or a learned named scope's
                           (``scopes.py``) when the request needed one
RateLimit headers          the pair's own limit, or a hold (``stated.py``)  pair
403 / block page           ban (``pair.py``)                                pair
503                        the origin budget (``budget.py``)                origin
proxy fault / timeout      cap, eviction (``health.py``), unless the        exit
                           origin is to blame (``blame.py``)
exit IP named              pair state follows it (``aliases.py``)          exit
=========================  =============================================  ===========

Each method returns a :class:`~.changes.Feedback`: the events to log and count,
and the typed state changes a shared backend copies.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from .changes import ExitEvicted, Feedback, Hold, LearningChanged, OriginHeld, PairHeld
from .events import Event, EventKind
from .leases import Lease
from .origin import OriginState
from .pair import PairState
from .pool import ExitPool
from .scopes import ScopeTable
from .state import StateTable
from .stated import contradicted, rate_stated, sent_at_stated_pace
from .views import usable

if TYPE_CHECKING:
    from .limiter import Tuning


class FeedbackLaws:
    """Applies answers to the state of a limiter (its state table and exit pool)."""

    def __init__(self, state: StateTable, pool: ExitPool, tuning: Tuning,
                 clock: Callable[[], float], rng: random.Random,
                 scopes: ScopeTable | None = None) -> None:
        self.state = state
        self.scopes = scopes if scopes is not None else ScopeTable(
            start_rate=tuning.start_rate, min_rate=tuning.min_rate,
            max_rate=tuning.max_rate, margin=tuning.margin, clock=clock)
        self.pool = pool
        self.tuning = tuning
        self.clock = clock
        self.rng = rng

    def _pair(self, origin: str, exit_id: str) -> tuple[OriginState, PairState]:
        origin_state = self.state.origin(origin)
        return origin_state, self.state.pair(origin_state, exit_id)

    def _held(self, origin: str, exit_id: str, pair: PairState, hold: Hold) -> PairHeld:
        until = pair.cooldown_until if hold is Hold.COOLDOWN else pair.banned_until
        return PairHeld(origin, exit_id, self.state.aliases.pair_key(exit_id), hold, until,
                        pair.bucket.tolerance)

    def success(self, lease: Lease, latency: float | None = None) -> Feedback:
        now = self.clock()
        out = Feedback()
        origin_state, pair = self._pair(lease.origin, lease.exit_id)
        exit_state = self.pool.states[lease.exit_id]
        if pair.succeeded(now):
            out.events.append(Event(EventKind.RECOVERED, lease.origin, lease.exit_id,
                                    "probe succeeded"))
        exit_state.health.success()
        if latency is not None:
            concurrency = exit_state.concurrency
            moved = concurrency.success(latency, lease.was_full, self.pool.busy)
            if moved:
                out.events.append(Event(
                    EventKind(f"concurrency_{moved}"), lease.origin, lease.exit_id,
                    f"limit {concurrency.limit} (latency {latency:.3f}s, "
                    f"baseline {concurrency.baseline:.3f}s)"))
        origin_learner = origin_state.learner
        far_leap = origin_learner.leap == lease.exit_id and origin_learner.leap_far
        learned = origin_learner.succeeded(
            lease.origin, lease.exit_id, pair.learning, rate=lease.rate, gap=lease.gap,
            margin=pair.bucket.margin, anchored=pair.anchored, spread=pair.spread,
            admitted_at=lease.admitted_at, site_gap=lease.site_gap, now=now,
            site_margin=origin_state.budget.pacing_margin,
            configured=self.state.configured_rate(lease.origin, lease.exit_id) is not None)
        self._learned(out, lease.origin, learned)
        if far_leap and origin_learner.leap is None and latency is not None:  # it ran clean
            origin_learner.jump_after_leap(latency)
        self._leap(out, lease.origin, origin_state, now, latency)
        if latency is not None and origin_learner.quicken_far_leap(latency):
            out.changes.append(LearningChanged(lease.origin))
        for scope, gap in zip(lease.scopes, lease.scope_gaps, strict=True):
            learner = self.scopes.state(scope).learner
            if learner is not None:
                self._learned(out, lease.origin, learner.scope_succeeded(
                    scope.id, gap, lease.admitted_at, now))
        if origin_state.budget.may_recover(now):
            origin_state.budget.recover(origin_state.learner.site_rate(),
                                  self.tuning.max_rate * len(self.pool))
        return out

    def rate_limited(self, origin: str, exit_id: str, retry_after: float,
                     lease: Lease | None = None, now: float | None = None) -> Feedback:
        now = self.clock() if now is None else now
        t = self.tuning
        out = Feedback()
        origin_state, pair = self._pair(origin, exit_id)
        admitted_at = lease.admitted_at if lease is not None else None
        opened = pair.rate_limited(now, retry_after, admitted_at=admitted_at,
                                   stretch=1.0 + self.rng.uniform(0.0, t.jitter),
                                   breaker_after=t.breaker_after,
                                   breaker_cooldown=t.breaker_cooldown)
        pair.learning.rate_streak += 1
        if opened is not None:
            out.events.append(Event(EventKind.BREAKER_OPEN, origin, exit_id,
                                    f"{pair.streak_429} 429s in a row: open for "
                                    f"{opened - now:.1f}s"))
        out.events.append(Event(EventKind.COOLDOWN, origin, exit_id,
                                f"{pair.cooldown_until - now:.2f}s"))
        out.changes.append(self._held(origin, exit_id, pair, Hold.COOLDOWN))
        if lease is None:
            return out
        stated = contradicted(pair, lease.rate, now)
        if stated is not None:  # learning takes over where it stood without it
            pair.own_limit = self.state.configured_limit(origin, exit_id)
            self._learned(out, origin, [Event(
                EventKind.ANNOUNCEMENT_WRONG, origin, exit_id,
                f"429 at {lease.rate:.3g} r/s, stated {stated:.3g}")])
            return out
        if sent_at_stated_pace(pair, lease.admitted_at):
            return out  # the 429 that found the statement wrong said it all
        learned_scopes = []
        for scope in lease.scopes:
            learner = self.scopes.state(scope).learner
            if learner is not None:
                learner.scope_refused(now, lease.admitted_at)
                learned_scopes.append((scope.id, learner))
        origin_learner = origin_state.learner
        far_leap = origin_learner.leap == exit_id and origin_learner.leap_far
        self._learned(out, origin, origin_learner.rate_limited(
            origin, exit_id, pair.learning, rate=lease.rate, gap=lease.gap,
            admitted_at=lease.admitted_at, now=now, slack=pair.bucket.margin + pair.spread,
            origin_slack=lambda: pair.bucket.margin + max(
                p.spread for p in origin_state.pairs.values()),
            pick_scout=partial(self._pick_scout, origin_state, now), scopes=learned_scopes,
            foreign_before=lease.foreign_before))
        if far_leap and not origin_learner.leap_far:  # its lone 429: the near leap, at once
            self._leap(out, origin, origin_state, now)
        return out

    def _leap(self, out: Feedback, origin: str, origin_state: OriginState, now: float,
              latency: float | None = None) -> None:
        """A leap beside a scout proving the start rate, when one is worth trying; the far
        one only when the answer that picks it (``latency``) came fast, and the crawl is
        mostly on this origin."""
        learner = origin_state.learner
        if learner.leap is None and learner.wants_leap():
            if learner.leap_far:
                # the cube of the leap factor where the answer's time lets a test that
                # short tell, else the square
                for power in (3, 2):
                    learner.far_factor = learner.leap_factor ** power
                    if latency is not None and \
                            learner.far_leap_tells(latency, learner.far_factor):
                        break
                else:
                    # a slow path's arrival jitter can space the far leap's test as wide
                    # as a lower limit's interval and prove it (5 r/s per IP behind 20-80
                    # ms of jitter: proven at 8, then a round of 429s)
                    learner.leap_far = False
                if not self._crawl_on(origin_state):
                    # where other origins share the crawl (a broad one), a faster start
                    # here gains it little, for one 429 more where the limit is under the
                    # start rate (30 origins at 1 r/s per IP: 4.8 -> 5.5 % of 429s)
                    learner.leap_far = False
            leap = self._pick_leap(origin_state, now)
            if leap is not None:
                learner.leap, learner.leap_sent = leap, False
                out.changes.append(LearningChanged(origin))

    @staticmethod
    def _learned(out: Feedback, origin: str, events: list[Event]) -> None:
        """Events of what the origin learned: logged, and the learning published."""
        if events:
            out.events += events
            if not out.learned():
                out.changes.append(LearningChanged(origin))

    def _may_probe(self, origin_state: OriginState, now: float, exclude: Sequence[str]
                   ) -> list[str]:
        """The exits that may probe for the pool: no limit of their own, usable."""
        pair_key = self.state.aliases.pair_key
        return [e for e in self.pool.states if e not in exclude and self.pool.allows(e)
                and usable(self.state, self.pool, origin_state.key, e, now)
                and (p := origin_state.pairs.get(pair_key(e))) is not None
                and origin_state.learner.may_scout(p.learning, now)
                and p.cooldown_until <= now]

    def _crawl_on(self, origin_state: OriginState) -> bool:
        """Whether the crawl is mostly on this origin: half or more of what is in flight."""
        mine = sum(pair.in_flight for pair in origin_state.pairs.values())
        return 2 * mine >= sum(state.in_flight for state in self.pool.states.values())

    def _pick_leap(self, origin_state: OriginState, now: float) -> str | None:
        """An exit to try the leap's rate beside the scout, at random among those
        that sent their first request (its next is the test) and, where any has, had
        the origin's answer: the exits that went or answered first are no likelier to
        be the pool's (a mixed pool that lists its slow exits first had its first two
        both slow), and one that never answers leaves the start rate to the scout."""
        pairs, pair_key = origin_state.pairs, self.state.aliases.pair_key
        choices = [e for e in self._may_probe(origin_state, now, [origin_state.learner.scout])
                   if pairs[pair_key(e)].last_admit > -math.inf]
        if not choices:
            return None
        # not one whose proxy failed since it last served (the near leap, picked on the
        # far one's 429, had fallen on a dead proxy its refusals had not yet evicted, and
        # the scout's next 429, a slow exit's, set the pool's ceiling with the far's)
        sound = [e for e in choices if not self.pool.states[e].health.faults]
        choices = sound or choices
        # ... nor one whose first request the origin has not answered yet (the lab's dead
        # proxy, its first refusal still to come, took the near leap: the slow scout's
        # 429 at the start rate then agreed with the far leap's, and the pool's ceiling
        # was 2 r/s for 9 s, 0.70 of the mixed pool's capacity)
        answered = [e for e in choices if pairs[pair_key(e)].proven]
        choices = answered or choices
        chosen = self.rng.choice(choices)
        learning = pairs[pair_key(chosen)].learning
        learning.confirmations, learning.confirmed_rate = 0, math.inf
        return chosen

    def _pick_scout(self, origin_state: OriginState, now: float, exclude: Sequence[str]
                    ) -> str | None:
        """Another exit to probe with: one of the pool's (no limit of its own), usable."""
        pair_key = self.state.aliases.pair_key
        choices = self._may_probe(origin_state, now, exclude)
        if not choices:
            return None
        # one that has had an answer from the origin: a dead proxy (no answer yet, its
        # faults not yet enough to evict it) would hold a discovery for seconds
        answered = [e for e in choices if origin_state.pairs[pair_key(e)].proven]
        candidates = answered or choices
        if not origin_state.learner.pool.proven:
            # while a start rate is unproven every other exit waits for the scout's next
            # request: the one that went longest ago, as it can send soonest (nginx,
            # broad: a scout picked among the last to go held its origin ~1 s longer)
            went = {e: origin_state.pairs[pair_key(e)].last_admit for e in candidates}
            first = min(went.values())
            candidates = [e for e in candidates if went[e] == first]
        chosen = self.rng.choice(candidates)
        pair = origin_state.pairs[pair_key(chosen)]
        pair.learning.confirmations, pair.learning.confirmed_rate = 0, math.inf
        origin_state.learner.scout_since = now
        return chosen

    def announced(self, lease: Lease, rate: float | None, remaining: float | None,
                  reset: float | None) -> Feedback:
        now = self.clock()
        out = Feedback()
        _, pair = self._pair(lease.origin, lease.exit_id)
        if rate is not None and rate > 0:
            stated = rate_stated(pair, rate, min_rate=self.tuning.min_rate,
                                 max_rate=self.tuning.max_rate,
                                 configured=self.state.configured_rate(lease.origin,
                                                                       lease.exit_id))
            if stated is not None:
                pair.own_limit = self.state.fixed_estimate(stated)
                self._learned(out, lease.origin, [Event(
                    EventKind.RATE_ANNOUNCED, lease.origin, lease.exit_id,
                    f"server states {stated:.3g} r/s")])
        elif remaining is not None and reset is not None and remaining < 1 and reset > 0:
            if pair.hold(now + reset):
                out.events.append(Event(EventKind.QUOTA_EXHAUSTED, lease.origin, lease.exit_id,
                                        f"holding {reset:.2f}s until the quota resets"))
                out.changes.append(self._held(lease.origin, lease.exit_id, pair,
                                              Hold.COOLDOWN))
        return out

    def banned(self, lease: Lease) -> Feedback:
        now = self.clock()
        _, pair = self._pair(lease.origin, lease.exit_id)
        pair.banned(now, self.tuning.ban_cooldown)
        return Feedback(
            [Event(EventKind.PAIR_BANNED, lease.origin, lease.exit_id,
                   f"banned for {pair.banned_until - now:.0f}s")],
            [self._held(lease.origin, lease.exit_id, pair, Hold.BAN)])

    def overloaded(self, lease: Lease, retry_after: float | None) -> Feedback:
        now = self.clock()
        t = self.tuning
        out = Feedback()
        origin_state = self.state.origin(lease.origin)
        if not origin_state.budget.congestion_is_new(lease.admitted_at):
            return out
        learner = origin_state.learner
        # the rate the origin saw as it refused: the second before this request went out
        # (a second before the 503 is read can be a stall of ours, and then reads as ~0)
        seen = learner.rate_before(lease.admitted_at)
        bucket, pause = origin_state.budget.overloaded(
            now, seen, learner.site_rate(), retry_after,
            backoff=t.overload_backoff, min_rate=t.min_rate)
        if retry_after:  # a pause the server stated is the origin's, for every process
            out.changes.append(OriginHeld(lease.origin, now + retry_after, bucket.tolerance))
        self._learned(out, lease.origin, [Event(
            EventKind.ORIGIN_SLOWED, lease.origin, None,
            f"origin budget {bucket.rate:.3g} r/s, paused {pause:.1f}s")])
        return out

    def proxy_fault(self, lease: Lease | None, exit_id: str, origin: str | None = None,
                    timeout: bool = False) -> Feedback:
        now = self.clock()
        exit_state = self.pool.states[exit_id]
        origin = lease.origin if lease is not None else origin
        out = Feedback()
        if exit_state.concurrency.fault():
            out.events.append(Event(EventKind.CONCURRENCY_DECREASE, origin or "", exit_id,
                                    f"limit {exit_state.concurrency.limit} after a fault"))
        if timeout and origin is not None:
            origin_state, pair = self._pair(origin, exit_id)
            if origin_state.timeouts.origin_stalls(exit_id, now, pair.last_success):
                out.events.append(Event(
                    EventKind.ORIGIN_TIMEOUT, origin, exit_id,
                    "the origin is slow for several exits: not the exit's fault"))
                return out
        if origin is not None:
            origin_state = self.state.origin(origin)
            learner = origin_state.learner
            if learner.scout == exit_id:  # a probe needs answers: another exit takes it
                learner.scout = self._pick_scout(origin_state, now, [exit_id])
                out.changes.append(LearningChanged(origin))
            if learner.leap == exit_id:
                learner.leap = None
                out.changes.append(LearningChanged(origin))
        health = exit_state.health
        if health.fault(now):
            out.events.append(Event(EventKind.EVICTED, origin or "", exit_id,
                                    f"{health.faults} faults: out for "
                                    f"{health.dead_until - now:.0f}s"))
            out.changes.append(ExitEvicted(exit_id, health.dead_until))
        return out

    def exit_ip_seen(self, exit_id: str, ip: str) -> Feedback:
        old = self.state.aliases.seen(exit_id, ip)
        if old is None:
            return Feedback()
        return Feedback([Event(EventKind.EXIT_IP_CHANGED, "", exit_id,
                               f"{old or 'unknown'} -> {ip}")])
