import math
import random

import pytest

from scrapy_exitlimit.core import UNTIL_RELEASE, Lease, Limiter, Limits, Tuning, make_exit
from scrapy_exitlimit.core.bucket import FIRST_ANSWER_WAIT
from scrapy_exitlimit.core.limiter import WARM_ANSWERS

from .conftest import FakeClock

SITE = "http://site.test"
OTHER = "http://other.test"


def exits(n):
    return [make_exit(f"http://127.0.0.1:{9000 + i}") for i in range(n)]


def limiter(n=2, clock=None, **kw):
    limits = Limits(**{"rate": 5.0, "burst": 1, "concurrency": 2, **kw})
    return Limiter(exits(n), limits, clock=clock or FakeClock(), rng=random.Random(1))


def test_spreads_over_exits_then_waits_for_the_first_token():
    clock = FakeClock(0.0)
    lim = limiter(2, clock)
    a, b = lim.try_admit(SITE), lim.try_admit(SITE)
    assert isinstance(a, Lease) and isinstance(b, Lease)
    assert {a.exit_id, b.exit_id} == {"127.0.0.1:9000", "127.0.0.1:9001"}
    lim.release(a.id), lim.release(b.id)
    assert lim.try_admit(SITE) == pytest.approx(0.2)
    clock.advance(0.2)
    assert isinstance(lim.try_admit(SITE), Lease)


def test_pairs_are_per_origin():
    lim = limiter(1, FakeClock(0.0), concurrency=3)
    first = lim.try_admit(SITE)
    assert isinstance(lim.try_admit(OTHER), Lease)  # same exit, other origin: its own bucket
    lim.release(first.id)
    assert lim.try_admit(SITE) == pytest.approx(0.2)


def test_a_new_pair_sends_one_request_until_it_hears_back():
    """The first request may ride a cold connection and arrive late: the second waits."""
    clock = FakeClock(0.0)
    lim = limiter(1, clock, rate=100.0, concurrency=4)
    first = lim.try_admit(SITE)
    clock.advance(1.0)
    assert lim.try_admit(SITE) == UNTIL_RELEASE
    lim.release(first.id, answered=False)  # failed without an answer: still unproven
    second = lim.try_admit(SITE)
    clock.advance(1.0)
    assert lim.try_admit(SITE) == UNTIL_RELEASE
    lim.release(second.id, answered=True)
    # the probe may have reached the server as late as its answer: one interval from there
    assert lim.try_admit(SITE) == pytest.approx(2.01)
    clock.advance(0.01)
    assert isinstance(lim.try_admit(SITE), Lease)
    clock.advance(0.01)
    assert isinstance(lim.try_admit(SITE), Lease)  # proven: several in flight now


def test_exit_lease_cap_holds_across_origins_and_release_frees_it():
    clock = FakeClock(0.0)
    lim = limiter(1, clock, rate=1000.0, concurrency=2)
    first = lim.try_admit(SITE)
    assert isinstance(lim.try_admit(OTHER), Lease)
    clock.advance(1.0)
    assert lim.try_admit(SITE) == UNTIL_RELEASE
    assert lim.release(first.id) is first
    assert lim.release(first.id) is None  # twice is a no-op
    clock.advance(0.001)
    assert isinstance(lim.try_admit(SITE), Lease)
    assert lim.exits["127.0.0.1:9000"].in_flight == 2


def test_least_loaded_exit_wins():
    clock = FakeClock(0.0)
    lim = limiter(2, clock, rate=1000.0, concurrency=4)
    a = lim.try_admit(SITE)
    clock.advance(1)
    b = lim.try_admit(SITE)
    assert a.exit_id != b.exit_id
    lim.release(a.id)
    clock.advance(1)
    assert lim.try_admit(SITE).exit_id == a.exit_id


def test_the_scan_does_not_judge_an_exit_more_loaded_than_a_ready_one(monkeypatch):
    """Judging an exit paces its pair: the cost of every admission on a small pool.
    An exit more loaded than a ready one already found cannot be chosen: not judged."""
    from scrapy_exitlimit.core import selector

    clock = FakeClock(0.0)
    lim = limiter(3, clock, rate=1000.0, concurrency=4)
    for lease in [lim.try_admit(SITE) for _ in range(3)]:  # each pair proven
        lim.release(lease.id, answered=True)
    clock.advance(1)
    first = [lim.try_admit(SITE) for _ in range(3)]  # one lease on each exit
    clock.advance(1)
    lim.release(first[1].id, answered=True)  # the middle exit idle again
    clock.advance(0.01)  # (its answer re-anchored its pacing: one interval from there)
    judged = []
    real_judge = selector.judge_pair  # (after the exit's own checks: DEAD, FULL)
    monkeypatch.setattr(selector, "judge_pair",
                        lambda exit_id, *a, **kw: judged.append(exit_id) or
                        real_judge(exit_id, *a, **kw))
    chosen = lim.try_admit(SITE)
    assert chosen.exit_id == first[1].exit_id
    # the first (loaded, but nothing ready was found yet), the idle one; not the third
    assert judged == [first[0].exit_id, first[1].exit_id]


def test_the_scan_ranks_a_pair_by_its_token_as_paced_at_its_new_rate():
    """The pair that waited longest goes first, judged by its token at the rate it has
    now: a pair told to slow down since its last admission does not go first on the
    token its old rate gave it (the Redis script, told the new rate, ranks alike)."""
    clock = FakeClock(0.0)
    lim = limiter(2, clock, rate=4.0, concurrency=1)
    a = lim.try_admit(SITE)
    clock.advance(0.0625)
    b = lim.try_admit(SITE)
    assert isinstance(a, Lease) and isinstance(b, Lease) and a.exit_id != b.exit_id
    lim.release(a.id, answered=True), lim.release(b.id, answered=True)
    pair_a, pair_b = lim.pair_state(SITE, a.exit_id), lim.pair_state(SITE, b.exit_id)
    assert pair_a.bucket.tat == pair_b.bucket.tat == 0.3125  # a tie: a first in pool order
    lim.announced(a, 2.0, None, None)  # a's server states 2 r/s: paced, its token moves
    clock.advance(0.75 - clock())  # to 0.5625, later than b's; both ready
    chosen = lim.try_admit(SITE)
    assert isinstance(chosen, Lease) and chosen.exit_id == b.exit_id
    assert pair_a.bucket.tat == 0.5625  # (the pace the scan made)
    then = lim.try_admit(SITE)
    assert isinstance(then, Lease) and then.exit_id == a.exit_id


def test_origin_budget_caps_all_exits_together():
    clock = FakeClock(0.0)
    lim = limiter(10, clock, rate=100.0, origin_rate=2.0)
    first = lim.try_admit(SITE)
    assert isinstance(first, Lease)
    lim.release(first.id)  # answered at once (its first answer: see the next test)
    assert lim.try_admit(SITE) == pytest.approx(0.5)
    clock.advance(0.5)
    assert isinstance(lim.try_admit(SITE), Lease)
    assert lim.try_admit(SITE) == pytest.approx(1.0)


def test_an_origin_budgets_second_request_waits_for_the_first_ones_answer():
    """The first request rides a cold connection, slower than the next by more than an
    interval at a high rate: the next goes an interval after its answer, or after
    FIRST_ANSWER_WAIT when none comes; once only (a burst takes both anyway)."""
    clock = FakeClock(0.0)
    lim = limiter(10, clock, rate=100.0, origin_rate=20.0)
    first = lim.try_admit(SITE)
    assert isinstance(first, Lease)
    clock.advance(0.05)  # its token is due, but not its answer
    assert lim.try_admit(SITE) == pytest.approx(FIRST_ANSWER_WAIT)
    clock.advance(0.1)
    lim.release(first.id)  # answered at 0.15: the next one interval (0.05) later
    assert lim.try_admit(SITE) == pytest.approx(0.2)
    clock.advance(0.05)
    second = lim.try_admit(SITE)
    assert isinstance(second, Lease)
    clock.advance(0.05)
    assert isinstance(lim.try_admit(SITE), Lease)  # paced, no longer gated
    # a first request that never hears back holds the next FIRST_ANSWER_WAIT at most
    lost = limiter(10, clock, rate=100.0, origin_rate=20.0)
    gone = lost.try_admit(SITE)
    assert isinstance(gone, Lease)
    assert lost.try_admit(SITE) == pytest.approx(clock() + FIRST_ANSWER_WAIT)
    lost.release(gone.id, answered=False)
    clock.advance(FIRST_ANSWER_WAIT)
    assert isinstance(lost.try_admit(SITE), Lease)
    # with a burst, two requests arriving together pass: no gate
    bursty = limiter(10, clock, rate=100.0, origin_rate=20.0, origin_burst=2)
    assert all(isinstance(bursty.try_admit(SITE), Lease) for _ in range(2))


def test_origin_rates_are_the_origins_paced_as_a_whole():
    clock = FakeClock(0.0)
    lim = limiter(2, clock, rate=100.0, origin_rate=2.0)
    assert isinstance(lim.try_admit(SITE), Lease)
    assert lim.origin_rates() == {SITE: 2.0}
    free = limiter(2, clock)
    lease = free.try_admit(SITE)
    assert isinstance(lease, Lease) and free.origin_rates() == {}  # per pair only
    free.overloaded(lease, None)  # a 503: the origin's budget paces it as a whole
    assert set(free.origin_rates()) == {SITE}


def test_origin_budget_re_anchors_on_when_requests_arrived():
    """The origin's requests take many paths: one that reached the server late must not
    bring the next (on another exit) too close. Until a few answers show what fast is, a
    request arrived as late as its answer; then as late as its answer less the fastest."""
    clock = FakeClock(0.0)
    lim = limiter(10, clock, rate=100.0, origin_rate=2.0)
    first = lim.try_admit(SITE)
    assert isinstance(first, Lease)
    clock.advance(0.2)  # a cold first request, answered late
    lim.release(first.id)
    assert lim.try_admit(SITE) == pytest.approx(0.7)  # not 0.5: an interval after 0.2
    for _ in range(4):  # warm: answers 10 ms after admission
        clock.advance(0.6)
        lease = lim.try_admit(SITE)
        assert isinstance(lease, Lease)
        clock.advance(0.01)
        lim.release(lease.id)
    clock.advance(0.6)
    late = lim.try_admit(SITE)
    assert isinstance(late, Lease)
    clock.advance(0.3)
    lim.release(late.id)  # it arrived by now - 0.01 at the latest
    assert lim.try_admit(SITE) == pytest.approx(clock.now - 0.01 + 0.5)


def test_origin_override_and_exit_override_take_the_lower_rate():
    e = exits(2)
    limits = Limits(rate=5.0, origins={SITE: {"rate": 2.0}}, exits={e[1].id: {"rate": 1.0}})
    assert limits.pair(SITE, e[0].id).rate == 2.0
    assert limits.pair(SITE, e[1].id).rate == 1.0
    assert limits.pair(OTHER, e[0].id).rate == 5.0
    assert limits.pair(OTHER, e[1].id).rate == 1.0


def test_429_cools_the_pair_and_not_the_others():
    clock = FakeClock(0.0)
    lim = limiter(2, clock, rate=100.0)
    a = lim.try_admit(SITE)
    lim.rate_limited(SITE, a.exit_id, 3.0)
    assert lim.pair_state(SITE, a.exit_id).cooldown_until == 3.0  # no jitter configured
    lim.release(a.id)
    clock.advance(0.1)
    got = [lim.try_admit(SITE)]
    lim.release(got[0].id)
    got.append(lim.try_admit(SITE))
    assert got[0].exit_id != a.exit_id
    # the other exit's next token is 10 ms away, sooner than the cooldown
    assert got[1] == pytest.approx(0.11)
    pair = lim.pair_state(SITE, a.exit_id)
    assert pair.ready_at(2.9) == 3.0
    # the cooldown ends with one request, not a burst
    pair.bucket.consume(3.0)
    assert pair.ready_at(3.0) == pytest.approx(3.01)


def test_cooldown_jitter_stays_within_its_fraction_and_never_shortens():
    clock = FakeClock(0.0)
    e = exits(1)
    lim = Limiter(e, Limits(rate=1.0), clock=clock, tuning=Tuning(jitter=0.5, breaker_after=99),
                  rng=random.Random(7))
    pair = lim.pair_state(SITE, e[0].id)
    ends = []
    for _ in range(20):
        lim.rate_limited(SITE, e[0].id, 10.0)
        ends.append(pair.cooldown_until)
    assert all(10.0 <= t <= 15.0 for t in ends)
    assert ends == sorted(ends)  # max(): a later, shorter deadline never wins
    before = lim.pair_state(SITE, e[0].id).cooldown_until
    lim.rate_limited(SITE, e[0].id, 1.0)
    assert lim.pair_state(SITE, e[0].id).cooldown_until == before
    assert lim.pair_state(SITE, e[0].id).streak_429 == 21


def test_earliest_wait_is_infinite_only_when_every_lease_is_taken():
    clock = FakeClock(0.0)
    lim = limiter(1, clock, rate=1.0, concurrency=1)
    lease = lim.try_admit(SITE)
    assert lim.try_admit(SITE) == math.inf
    lim.release(lease.id)
    assert lim.try_admit(SITE) == pytest.approx(1.0)


def test_admissions_never_exceed_rate_times_window_plus_burst():
    clock = FakeClock(0.0)
    lim = limiter(3, clock, rate=5.0, burst=2, concurrency=100)
    admitted = []
    while clock.now < 10.0:
        got = lim.try_admit(SITE)
        if isinstance(got, Lease):
            admitted.append(got)
            lim.release(got.id)
        else:
            clock.now = got
    per_exit = {}
    for lease in admitted:
        per_exit.setdefault(lease.exit_id, []).append(lease.admitted_at)
    for times in per_exit.values():
        assert len(times) <= 5.0 * 10.0 + 2
        assert len(times) >= 5.0 * 10.0 - 1  # and the pool is not left idle
        for i in range(2, len(times)):
            assert times[i] - times[i - 2] >= 0.2 - 1e-9  # burst 2: any 3 span >= 1 interval


def test_stale_leases_are_reported():
    clock = FakeClock(0.0)
    lim = limiter(1, clock)
    lease = lim.try_admit(SITE)
    clock.advance(5)
    assert list(lim.stale_leases(10)) == []
    clock.advance(6)
    assert list(lim.stale_leases(10)) == [lease]


def test_needs_an_exit():
    with pytest.raises(ValueError):
        Limiter([], Limits(rate=1.0), clock=FakeClock())


def test_a_late_answer_pushes_the_next_request_back_by_the_extra_latency():
    """Admitted on time but answered 30 ms slower than usual: it may have arrived 30 ms late."""
    clock = FakeClock(0.0)
    lim = limiter(1, clock, rate=5.0, concurrency=4)
    for _ in range(WARM_ANSWERS):
        lease = lim.try_admit(SITE)
        clock.advance(0.010)
        lim.release(lease.id)  # cold: the next is paced from the answer itself
        assert lim.try_admit(SITE) == pytest.approx(clock.now + 0.2)
        clock.now = lim.try_admit(SITE)
    usual = lim.try_admit(SITE)
    clock.advance(0.010)
    lim.release(usual.id)  # warm, and as fast as the best: nothing to correct
    assert lim.try_admit(SITE) == pytest.approx(usual.admitted_at + 0.2)
    clock.now = lim.try_admit(SITE)
    slow = lim.try_admit(SITE)
    clock.advance(0.040)  # 30 ms slower than the fastest
    lim.release(slow.id)
    pair = lim.pair_state(SITE, slow.exit_id)
    assert pair.ready_at(clock.now) == pytest.approx(slow.admitted_at + 0.030 + 0.2, abs=1e-3)
    assert pair.min_latency == pytest.approx(0.010 + 0.02 * 0.030)  # drifts up slowly


def test_timeouts_on_several_answering_exits_blame_the_origin_not_the_exits():
    from scrapy_exitlimit.core import Limiter, Limits, make_exit

    from .conftest import FakeClock

    clock = FakeClock()
    exits = [make_exit(f"http://127.0.0.{10 + i}:3128") for i in range(3)]
    lim = Limiter(exits, Limits(rate=100.0), clock=clock)
    origin = "http://slow.example"
    for ex in exits[:2]:  # two exits that get answers from the origin
        lease = lim.try_admit(origin, pinned=ex.id)
        lim.success(lease, 0.01)
        lim.release(lease.id)
    kinds = []
    for _ in range(4):  # then time out on it, one after the other
        for ex in exits[:2]:
            clock.advance(0.1)
            kinds += [e.kind for e in lim.proxy_fault(None, ex.id, origin, timeout=True).events]
    assert "evicted" not in kinds and kinds.count("origin_timeout") >= 6
    assert all(not lim.exits[ex.id].health.dead(clock.now) for ex in exits[:2])
    # an exit that never answered and times out is a dead exit, origin or not
    kinds = [e.kind for _ in range(3)
             for e in lim.proxy_fault(None, exits[2].id, origin, timeout=True).events]
    assert "evicted" in kinds


def _admit(lim, clock):
    got = lim.try_admit(SITE)
    while not isinstance(got, Lease):
        assert math.isfinite(got), "only a release could help"
        clock.now = got
        got = lim.try_admit(SITE)
    return got


def test_429s_in_flight_together_are_one_event_and_a_retry_after_proven_short_doubles():
    clock = FakeClock(0.0)
    e = exits(1)
    lim = Limiter(e, Limits(rate=100.0, concurrency=8), clock=clock,
                  tuning=Tuning(breaker_after=4), rng=random.Random(1))
    first = _admit(lim, clock)
    lim.success(first, 0.001)
    lim.release(first.id)
    burst = [_admit(lim, clock) for _ in range(2)]  # two in flight, one 429 each
    events = []
    for lease in burst:
        events += lim.rate_limited(SITE, lease.exit_id, 1.0, lease).events
    pair = lim.pair_state(SITE, e[0].id)
    assert "breaker_open" not in [ev.kind for ev in events]  # one event, not two
    assert pair.tested_429 == 1
    assert pair.cooldown_until == pytest.approx(clock.now + 1.0)
    for lease in burst:
        lim.release(lease.id)
    waits = []
    for _ in range(2):  # sent after the cooldown, refused again: "1 s" was too short
        clock.now = pair.cooldown_until
        lease = _admit(lim, clock)
        lim.rate_limited(SITE, lease.exit_id, 1.0, lease)
        waits.append(pair.cooldown_until - clock.now)
        lim.release(lease.id)
    assert waits == [pytest.approx(2.0), pytest.approx(4.0)]
    clock.now = pair.cooldown_until
    lease = _admit(lim, clock)
    kinds = [ev.kind for ev in lim.rate_limited(SITE, lease.exit_id, 1.0, lease).events]
    assert "breaker_open" in kinds  # the fourth 429 in a row that counts


def test_a_slower_pace_counts_from_when_the_last_request_reached_the_server():
    """A first request on a cold connection reaches the server well after its admission
    (as late as its answer, for all we know): when the pair's rate then drops, the next
    request goes a new interval after that, not after the admission (nginx saw 0.978 s
    between a pair's first two requests paced 1.005 s apart at 1 r/s, and answered 429)."""
    clock = FakeClock(0.0)
    lim = limiter(1, clock, rate=2.0)
    first = lim.try_admit(SITE)
    clock.advance(0.04)
    lim.release(first.id, answered=True)  # answered 40 ms after it went
    pair = lim.pair_state(SITE, first.exit_id)
    interval = 1.0 + lim.tuning.margin
    pair.pace(1.0, lim.tuning.margin)  # the pair's rate halves (a 429 elsewhere, say)
    assert pair.bucket.ready_at(clock()) == pytest.approx(0.04 + interval)
    # a later answer bounds arrivals no sooner than it says: the bound only moves on
    pair.answered(0.03, latency=0.03)
    pair.pace(0.5, lim.tuning.margin)
    assert pair.bucket.ready_at(clock()) == pytest.approx(0.04 + 2.0 + lim.tuning.margin)
