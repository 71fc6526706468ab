"""Property tests of the pure core: the bounds hold for any inputs, not just the examples.

Every test runs on injected time (plain floats or :class:`FakeClock`): no sleeps, and every
loop is bounded by the length of a generated list.
"""

from __future__ import annotations

import copy
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import scrapy_exitlimit.core.limiter as limiter_module
from scrapy_exitlimit.core import Lease, Limiter, Limits, RateEstimate, TokenBucket, Tuning
from scrapy_exitlimit.core import make_exit as _make_exit

from .conftest import FakeClock

# no example database: nothing is written into the work tree
SETTINGS = settings(max_examples=200, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def max_in_window_excess(times: Sequence[float], rate: float, burst: int) -> float:
    """How far the busiest window exceeds ``rate * w + burst`` (<= 0: within the bound).

    The busiest window of any length starts and ends on an admission, so checking
    every pair of admissions checks every window ``[t, t + w]``.
    """
    times = sorted(times)
    worst = -math.inf
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            allowed = rate * (times[j] - start) + burst
            worst = max(worst, (j - i + 1) - allowed)
    return worst


def at_least(value: float, bound: float) -> bool:
    """``value >= bound`` up to the rounding of a sum and a difference of timestamps."""
    return value >= bound - 1e-12 * max(1.0, abs(bound))


def within_bound(times: Sequence[float], rate: float, burst: int) -> bool:
    # a relative epsilon for the float sums that build the schedule
    slack = 1e-6 + rate * 1e-9 * (max(times, default=0.0) - min(times, default=0.0))
    return max_in_window_excess(times, rate, burst) <= slack


# -- TokenBucket ---------------------------------------------------------------------------

rates = st.floats(min_value=0.01, max_value=1000.0, allow_nan=False, allow_infinity=False)
bursts = st.integers(min_value=1, max_value=8)
margins = st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=0.05))
#: a time step, in emission intervals: often none, sometimes a little, now and then a lot
steps = st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=1.5),
                  st.floats(min_value=0.0, max_value=20.0))

bucket_ops = st.lists(
    st.tuples(steps,
              st.sampled_from(["admit", "admit", "admit", "hold", "arrived"]),
              st.floats(min_value=-5.0, max_value=5.0)),
    max_size=120,
)


def drive_bucket(bucket: TokenBucket, ops, rate_changes=None) -> list[float]:
    """Admit whenever a token is ready; hold and report late arrivals in between."""
    now = 100.0
    admitted: list[float] = []
    for i, (step, op, arg) in enumerate(ops):
        now += step * bucket.interval
        if rate_changes is not None:
            bucket.set_rate(rate_changes[i % len(rate_changes)])
        ready = bucket.ready_at(now)
        assert ready >= now
        assert bucket.ready_at(ready) == ready  # ready_at is where a token really is
        if op == "admit":
            if ready <= now:
                bucket.consume(now)
                admitted.append(now)
        elif op == "hold":
            before = bucket.ready_at(now)
            when = now + abs(arg) * bucket.interval
            bucket.hold_until(when)
            assert at_least(bucket.ready_at(now), max(before, when))  # only delays
        else:  # arrived: a request reached the server late (or, harmlessly, early)
            before = bucket.ready_at(now)
            bucket.arrived(now + arg * bucket.interval)
            assert bucket.ready_at(now) >= before  # only delays
    return admitted


@SETTINGS
@given(rates, bursts, margins, st.lists(steps, max_size=150))
def test_bucket_admissions_in_any_window_stay_under_rate_times_window_plus_burst(
        rate, burst, margin, step_list):
    bucket = TokenBucket(rate, burst, margin)
    admitted = drive_bucket(bucket, [(s, "admit", 0.0) for s in step_list])
    assert within_bound(admitted, rate, burst)


@SETTINGS
@given(rates, bursts, margins, bucket_ops)
def test_bucket_bound_survives_holds_and_late_arrivals(rate, burst, margin, ops):
    bucket = TokenBucket(rate, burst, margin)
    admitted = drive_bucket(bucket, ops)
    assert within_bound(admitted, rate, burst)


@SETTINGS
@given(rates, bursts, st.lists(steps, min_size=1, max_size=40), st.floats(1.0, 1e4))
def test_bucket_hold_until_means_no_token_before_then_and_then_one(rate, burst, step_list,
                                                                  hold_for):
    bucket = TokenBucket(rate, burst)
    drive_bucket(bucket, [(s, "admit", 0.0) for s in step_list])
    now = 1e6
    bucket.hold_until(now + hold_for)
    assert at_least(bucket.ready_at(now), now + hold_for)
    at = bucket.ready_at(now)
    bucket.consume(at)
    # one, not a burst: the next comes one interval on, the interval computed here
    assert bucket.ready_at(at) == pytest.approx(at + 1.0 / rate, rel=1e-12)


@SETTINGS
@given(rates, bursts, margins, st.integers(min_value=1, max_value=40))
def test_bucket_admits_as_fast_as_its_rate_allows_and_no_faster(rate, burst, margin, n):
    """``n`` tokens, each taken as soon as it is ready: the first ``burst`` at once, then
    one every ``1/rate + margin`` seconds, computed here, not read from the bucket (a
    bucket slower than its rate would pass every upper bound above)."""
    bucket = TokenBucket(rate, burst, margin)
    start = now = 100.0
    for _ in range(n):
        now = bucket.ready_at(now)
        bucket.consume(now)
    expected = max(0, n - burst) * (1.0 / rate + margin)
    assert now - start == pytest.approx(expected, rel=1e-9, abs=1e-9)


@SETTINGS
@given(rates, bursts, margins, bucket_ops,
       st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=1, max_size=8))
@example(rate=10.0, burst=5, margin=0.0, ops=[(0.0, "admit", 0.0)] * 8,
         fractions=[1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5])
def test_bucket_bound_holds_at_the_highest_rate_when_the_rate_changes(
        rate, burst, margin, ops, fractions):
    """The limiter re-paces a pair between its known-clean rate and a probe: whatever the
    sequence of rates (all at most ``rate``), the burst must not grow beyond ``burst``."""
    bucket = TokenBucket(rate, burst, margin)
    admitted = drive_bucket(bucket, ops, [rate * f for f in fractions])
    assert within_bound(admitted, rate, burst)


# -- RateEstimate --------------------------------------------------------------------------

positive = st.floats(min_value=1e-3, max_value=1e4)
estimate_ops = st.lists(
    st.tuples(st.sampled_from(["confirmed", "rejected", "drift"]),
              positive, st.integers(min_value=0, max_value=6),
              st.floats(min_value=0.0, max_value=100.0)),
    max_size=60,
)


@st.composite
def estimates(draw):
    floor = draw(st.floats(min_value=1e-3, max_value=10.0))
    ceiling = draw(st.one_of(st.just(math.inf), st.floats(min_value=floor, max_value=1e4)))
    lo = draw(positive)
    return RateEstimate(lo, floor=floor, ceiling=ceiling)


def check_estimate(est: RateEstimate) -> None:
    assert est.floor <= est.lo <= est.ceiling
    assert est.hi is None or est.lo <= est.hi
    target = est.target()
    assert math.isfinite(target)
    assert target >= est.lo
    assert target <= est.ceiling


@SETTINGS
@given(estimates(), estimate_ops)
def test_rate_estimate_stays_in_its_bounds(est, ops):
    check_estimate(est)
    now = 0.0
    for op, rate, streak, dt in ops:
        now += dt
        if op == "confirmed":
            est.confirmed(rate, now)
        elif op == "rejected":
            est.rejected(rate, now, streak)
            assert est.lo < rate or est.lo == est.floor
        else:
            est.drift(dt)
        check_estimate(est)


# -- Limiter -------------------------------------------------------------------------------

ORIGINS = ("http://a.test", "http://b.test")
EXIT_URLS = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(3))
EXIT_IDS = tuple(_make_exit(u).id for u in EXIT_URLS)

limiter_ops = st.lists(
    st.tuples(
        # time step in seconds: the steps matter relative to rates of 0.2..50 r/s
        st.one_of(st.just(0.0), st.just(0.0), st.floats(min_value=0.0, max_value=0.3),
                  st.floats(min_value=0.0, max_value=5.0)),
        st.sampled_from(["admit", "admit", "admit", "admit", "answer", "answer", "answer",
                         "release", "fault_no_lease"]),
        st.sampled_from(["success", "success", "rate_limited", "banned", "overloaded",
                         "proxy_fault", "other", "announced"]),
        st.integers(min_value=0, max_value=2 ** 16),  # picks an origin / a lease
        # Retry-After / announced numbers, 0 (no wait at all) included
        st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=5.0)),
    ),
    min_size=40,
    max_size=200,
)

tunings = st.builds(
    Tuning,
    margin=st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=0.01)),
    jitter=st.floats(min_value=0.0, max_value=0.5),
    start_rate=st.floats(min_value=0.1, max_value=50.0),
    max_rate=st.floats(min_value=50.0, max_value=200.0),
    min_rate=st.floats(min_value=0.01, max_value=0.1),
    breaker_after=st.integers(min_value=1, max_value=6),
    breaker_cooldown=st.floats(min_value=0.0, max_value=10.0),
    ban_cooldown=st.floats(min_value=0.0, max_value=20.0),
    evict_after=st.integers(min_value=1, max_value=4),
    reanimate_after=st.floats(min_value=0.0, max_value=10.0),
)

exit_overrides = st.dictionaries(
    st.sampled_from(EXIT_IDS),
    st.fixed_dictionaries({}, optional={
        "rate": st.floats(min_value=0.2, max_value=50.0),
        "burst": st.integers(min_value=1, max_value=4),
        "concurrency": st.integers(min_value=1, max_value=4),
    }),
    max_size=3,
)
origin_overrides = st.dictionaries(
    st.sampled_from(ORIGINS),
    st.fixed_dictionaries({}, optional={
        "rate": st.floats(min_value=0.2, max_value=50.0),
        "burst": st.integers(min_value=1, max_value=4),
        "origin_rate": st.floats(min_value=0.5, max_value=100.0),
        "origin_burst": st.integers(min_value=1, max_value=4),
    }),
    max_size=2,
)


@st.composite
def configured_limits(draw):
    return Limits(
        rate=draw(st.floats(min_value=0.2, max_value=50.0)),
        burst=draw(st.integers(min_value=1, max_value=4)),
        concurrency=draw(st.integers(min_value=1, max_value=4)),
        origin_rate=draw(st.one_of(st.none(), st.floats(min_value=0.5, max_value=100.0))),
        origin_burst=draw(st.integers(min_value=1, max_value=4)),
        origins=draw(origin_overrides),
        exits=draw(exit_overrides),
    )


@st.composite
def learned_limits(draw):
    return Limits(
        rate=None,
        concurrency=draw(st.integers(min_value=1, max_value=4)),
        origin_rate=draw(st.one_of(st.none(), st.floats(min_value=0.5, max_value=100.0))),
        exits=draw(st.dictionaries(st.sampled_from(EXIT_IDS),
                                   st.fixed_dictionaries({"concurrency": st.integers(1, 4)}),
                                   max_size=3)),
    )


class Run:
    """Drives a Limiter the way the middleware does and checks every step."""

    def __init__(self, limits: Limits, tuning: Tuning, n_exits: int, seed: int,
                 with_announced: bool) -> None:
        self.clock = FakeClock(1000.0)
        self.limits = limits
        self.lim = Limiter([_make_exit(u) for u in EXIT_URLS[:n_exits]], limits,
                           clock=self.clock, tuning=tuning, rng=random.Random(seed))
        self.with_announced = with_announced
        self.outstanding: list[Lease] = []
        self.admissions: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.cooldowns: dict[tuple[str, str], tuple[float, float]] = {}

    def run(self, ops) -> None:
        for step, action, feedback, pick, number in ops:
            self.clock.advance(step)
            if action == "admit":
                self.admit(ORIGINS[pick % len(ORIGINS)])
            elif action == "fault_no_lease":  # a failed CONNECT before any lease mattered
                self.lim.proxy_fault(None, list(self.lim.exits)[pick % len(self.lim.exits)])
            elif self.outstanding:
                lease = self.outstanding[pick % len(self.outstanding)]
                answered = True
                if action == "answer":
                    answered = self.feedback(lease, feedback, number)
                else:
                    answered = pick % 2 == 0
                self.release(lease, answered)
            self.check_state()

    def admit(self, origin: str) -> None:
        now = self.clock()
        ostate = self.lim.origin_state(origin)
        held = {exit_id: max(p.cooldown_until, p.banned_until)
                for exit_id, p in ostate.pairs.items()}
        result = self.lim.try_admit(origin)
        if not isinstance(result, Lease):
            assert result > now  # a wait is in the future (or UNTIL_RELEASE)
            return
        lease = result
        assert lease.admitted_at == now
        assert held.get(lease.exit_id, -math.inf) <= now, "admitted during a cooldown or ban"
        estate = self.lim.exits[lease.exit_id]
        assert estate.in_flight <= estate.limit, "admitted past the exit's in-flight limit"
        self.outstanding.append(lease)
        self.admissions[origin, lease.exit_id].append(now)

    def feedback(self, lease: Lease, kind: str, number: float) -> bool:
        lim = self.lim
        if kind == "success":
            lim.success(lease, self.clock() - lease.admitted_at)
        elif kind == "rate_limited":
            pair = lim.pair_state(lease.origin, lease.exit_id)
            before = pair.cooldown_until
            lim.rate_limited(lease.origin, lease.exit_id, number, lease)
            assert pair.cooldown_until >= before
            assert at_least(pair.cooldown_until, self.clock() + number)
        elif kind == "banned":
            lim.banned(lease)
        elif kind == "overloaded":
            lim.overloaded(lease, number)
        elif kind == "proxy_fault":
            lim.proxy_fault(lease, lease.exit_id)
            return False
        elif kind == "announced" and self.with_announced:
            lim.success(lease, self.clock() - lease.admitted_at)
            remaining = 0.0 if number < 1 else None
            lim.announced(lease, number or None, remaining, number)
        return True

    def release(self, lease: Lease, answered: bool) -> None:
        estate = self.lim.exits[lease.exit_id]
        pair = self.lim.pair_state(lease.origin, lease.exit_id)
        exit_before, pair_before = estate.in_flight, pair.in_flight
        assert self.lim.release(lease.id, answered) is lease
        assert (estate.in_flight, pair.in_flight) == (exit_before - 1, pair_before - 1)
        assert self.lim.release(lease.id, answered) is None  # twice: no-op
        assert (estate.in_flight, pair.in_flight) == (exit_before - 1, pair_before - 1)
        self.outstanding.remove(lease)

    def check_state(self) -> None:
        for exit_id, estate in self.lim.exits.items():
            mine = sum(1 for lease in self.outstanding if lease.exit_id == exit_id)
            assert estate.in_flight == mine
            assert 0 <= estate.in_flight <= self.limits.exit_concurrency(exit_id)
            assert 1 <= estate.concurrency.limit <= self.limits.exit_concurrency(exit_id)
        for origin, ostate in self.lim.origins.items():
            for exit_id, pair in ostate.pairs.items():
                mine = sum(1 for lease in self.outstanding
                           if (lease.origin, lease.exit_id) == (origin, exit_id))
                assert pair.in_flight == mine
                # cooldowns and bans only ever move later
                before = self.cooldowns.get((origin, exit_id), (-math.inf, -math.inf))
                assert pair.cooldown_until >= before[0]
                assert pair.banned_until >= before[1]
                self.cooldowns[origin, exit_id] = (pair.cooldown_until, pair.banned_until)


def search(kind: str):
    """``scan``: the small-pool search; ``index``: the large-pool one, forced on."""
    return mock.patch.object(limiter_module, "INDEX_ABOVE",
                             limiter_module.INDEX_ABOVE if kind == "scan" else 0)


@SETTINGS
@given(configured_limits(), tunings, st.integers(1, 3), st.integers(0, 2 ** 32), limiter_ops)
def test_limiter_with_a_configured_rate_never_exceeds_it(limits, tuning, n_exits, seed, ops):
    check_configured_rate("scan", limits, tuning, n_exits, seed, ops)


@SETTINGS
@given(configured_limits(), tunings, st.integers(1, 3), st.integers(0, 2 ** 32), limiter_ops)
def test_large_pool_search_never_exceeds_a_configured_rate(limits, tuning, n_exits, seed, ops):
    check_configured_rate("index", limits, tuning, n_exits, seed, ops)


def check_configured_rate(kind, limits, tuning, n_exits, seed, ops) -> None:
    run = Run(limits, tuning, n_exits, seed, with_announced=False)
    with search(kind):
        run.run(ops)
    for (origin, exit_id), times in run.admissions.items():
        pl = limits.pair(origin, exit_id)
        assert within_bound(times, pl.rate, pl.burst), (origin, exit_id, pl, times)
    for origin in ORIGINS:
        ol = limits.origin(origin)
        times = [t for (o, _), ts in run.admissions.items() if o == origin for t in ts]
        if ol.rate is not None:
            # the budget is slowed by 503s and grows back, but never above the configured rate
            assert within_bound(times, ol.rate, ol.burst)


@SETTINGS
@given(learned_limits(), tunings, st.integers(1, 3), st.integers(0, 2 ** 32), limiter_ops)
def test_limiter_learned_rates_stay_within_min_and_max_rate(limits, tuning, n_exits, seed, ops):
    run = Run(limits, tuning, n_exits, seed, with_announced=True)
    t = tuning
    eps = 1e-9

    def check() -> None:
        for ostate in run.lim.origins.values():
            est = ostate.estimate
            assert t.min_rate * (1 - eps) <= est.lo <= t.max_rate * (1 + eps)
            assert est.hi is None or est.lo <= est.hi
            for pair in ostate.pairs.values():
                assert t.min_rate * (1 - eps) <= pair.bucket.rate <= t.max_rate * (1 + eps)
                if pair.own_limit is not None:
                    own = pair.own_limit
                    assert t.min_rate * (1 - eps) <= own.lo <= t.max_rate * (1 + eps)
                    assert own.hi is None or own.lo <= own.hi

    # check after every step, not only at the end
    for op in ops:
        run.run([op])
        check()


def test_an_announced_rate_does_not_raise_a_pair_above_its_configured_rate():
    clock = FakeClock(0.0)
    lim = Limiter([_make_exit(EXIT_URLS[0])], Limits(rate=1.0, concurrency=4), clock=clock,
                  rng=random.Random(0))
    lease = lim.try_admit(ORIGINS[0])
    assert isinstance(lease, Lease)
    clock.advance(0.1)
    lim.success(lease, 0.1)
    lim.announced(lease, 100.0, None, None)  # "RateLimit-Policy: 100;w=1"
    lim.release(lease.id)
    admitted = []
    for _ in range(50):  # bounded: 5 s of fake time in 0.1 s steps
        result = lim.try_admit(ORIGINS[0])
        if isinstance(result, Lease):
            admitted.append(clock())
            lim.success(result, 0.0)
            lim.release(result.id)
        clock.advance(0.1)
    assert within_bound(admitted, 1.0, 1)


# --- the scan, passing over exits that cannot win, picks what judging every exit picks ---

def _scan_by_judge(members, rules, now):
    """``selector.scan`` without passing over any exit: ``eligibility.judge`` for each."""
    from scrapy_exitlimit.core.eligibility import Verdict, judge

    best, best_key, earliest = None, (0.0, 0.0), math.inf
    for exit_id, exit_state in members:
        verdict, until, pair = judge(exit_id, exit_state, rules, now)
        if verdict is Verdict.READY:
            key = (exit_state.in_flight / exit_state.limit, pair.bucket.tat)
            if best is None or key < best_key:
                best, best_key = (exit_state, pair), key
        elif verdict in (Verdict.DEAD, Verdict.LATER):
            earliest = min(earliest, until)
    return earliest if best is None else best


scan_ops = st.lists(st.tuples(st.floats(0.0, 0.6), st.sampled_from(
    ["admit", "admit", "admit", "ok", "ok", "slower", "faster", "429", "fault", "ban"])),
    max_size=120)


@SETTINGS
@given(st.sampled_from([None, 4.0]), st.integers(1, 3), scan_ops)
# a faster rate stated on one pair: its token, paced anew, is earlier than the others'
@example(None, 1, [(0.0, "admit")] * 4 + [(0.0, "ok"), (0.25, "faster"), (0.5, "admit")])
def test_the_scan_picks_what_judging_every_exit_picks(rate, concurrency, ops):
    """The scan does not judge an exit more loaded than a ready one it has found (judging
    paces the pair, the hot path's cost): on any history of admissions, answers, stated
    rates, 429s, faults and bans it returns what judging each exit returns, the same
    exit and pair or the same time."""
    real_scan = limiter_module.selector.scan
    compared = []

    def checked(members, rules, now):
        members = list(members)
        # judging paces pairs: the reference judges a copy of the state, so the scan meets
        # the tokens as last paced (a scan that ranked by them unpaced would differ)
        copied_members, copied_rules = copy.deepcopy((members, rules))
        expected = _scan_by_judge(copied_members, copied_rules, now)
        got = real_scan(members, rules, now)
        assert type(got) is type(expected)
        if isinstance(got, tuple):
            position = {id(state): i for i, (_, state) in enumerate(members)}
            copied = {id(state): i for i, (_, state) in enumerate(copied_members)}
            assert position[id(got[0])] == copied[id(expected[0])]
            buckets = [(b.rate, b.burst, b.margin, b.interval, b.tat)
                       for b in (got[1].bucket, expected[1].bucket)]
            assert buckets[0] == buckets[1]
        else:
            assert got == expected
        compared.append(got)
        return got

    clock = FakeClock()
    exits = [_make_exit(f"http://127.0.0.{i}:8000") for i in range(10, 14)]
    lim = Limiter(exits, Limits(rate=rate, concurrency=concurrency), clock=clock,
                  tuning=Tuning(margin=0.005, evict_after=1, reanimate_after=1.0),
                  rng=random.Random(7))
    held: list[Lease] = []
    with mock.patch.object(limiter_module.selector, "scan", checked):
        for dt, op in ops:
            clock.advance(dt)
            if op == "admit":
                got = lim.try_admit("http://o", clock())
                if isinstance(got, Lease):
                    held.append(got)
                continue
            if not held:
                continue
            lease = held.pop(0)
            if op == "ok":
                lim.success(lease, 0.01)
            elif op in ("slower", "faster"):  # the server states a rate: paced anew
                lim.success(lease, 0.01)
                lim.announced(lease, 2.0 if op == "slower" else 8.0, None, None)
            elif op == "429":
                lim.rate_limited(lease.origin, lease.exit_id, 1.0, lease)
            elif op == "fault":
                lim.proxy_fault(lease, lease.exit_id)
            else:
                lim.banned(lease)
            lim.release(lease.id, op != "fault")
    assert len(compared) == sum(op == "admit" for _, op in ops)
