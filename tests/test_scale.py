"""Large pools: the indexed search, and idle state that is let go."""

from __future__ import annotations

import pytest_twisted

from scrapy_exitlimit.core import Lease, Limiter, Limits, forgetting, make_exit
from scrapy_exitlimit.core import limiter as limiter_module
from scrapy_exitlimit.lab import Lab, OriginConfig

from .conftest import FakeClock
from .crawling import crawl


def big_limiter(n: int, clock: FakeClock, **limits) -> Limiter:
    exits = [make_exit(f"http://u-{i}:p@127.0.0.1:{2000 + i}") for i in range(n)]
    return Limiter(exits, Limits(**{"rate": 2.0, "burst": 1, **limits}), clock=clock)


def test_large_pool_admits_each_exit_once_then_waits_for_the_earliest_token():
    clock = FakeClock()
    n = limiter_module.INDEX_ABOVE * 4
    lim = big_limiter(n, clock)
    leases = [lim.try_admit("http://o") for _ in range(n)]
    assert all(isinstance(x, Lease) for x in leases)
    assert len({x.exit_id for x in leases}) == n  # least recently used first: all of them
    for lease in leases:
        lim.release(lease.id)  # answered: each pair's next token is one interval on
    assert lim.try_admit("http://o") == clock.now + 0.5 + lim.tuning.margin


def test_large_pool_sets_busy_exits_aside_until_a_release():
    clock = FakeClock()
    lim = big_limiter(limiter_module.INDEX_ABOVE + 1, clock, rate=1000.0, concurrency=1)
    held = [lim.try_admit("http://o") for _ in range(len(lim.exits))]
    assert all(isinstance(x, Lease) for x in held)
    clock.advance(1.0)
    assert lim.try_admit("http://o") == limiter_module.UNTIL_RELEASE  # every exit full
    lim.release(held[3].id)
    clock.advance(0.01)  # past that pair's next token
    again = lim.try_admit("http://o")
    assert isinstance(again, Lease) and again.exit_id == held[3].exit_id


def test_planning_for_a_shared_backend_looks_at_a_few_exits_of_a_large_pool_in_turn():
    """The Redis backend plans every admission call: its cost follows the candidates
    asked for, not the pool (pair state is made only for the exits looked at)."""
    clock = FakeClock()
    n = limiter_module.INDEX_ABOVE * 8
    lim = big_limiter(n, clock)
    seen: list[str] = []
    for _ in range(n // 8):
        candidates, _ = lim.plan("http://o", clock.now, 8)
        assert len(candidates) == 8
        seen += [c.exit_id for c in candidates]
        assert len(lim.origin_state("http://o").pairs) == len(seen)  # looked at no more
    assert len(set(seen)) == n  # round robin: every exit in turn, none twice


def test_planning_leaves_out_exits_this_process_alone_fills():
    clock = FakeClock()
    for n in (3, limiter_module.INDEX_ABOVE + 3):  # scanned and round robin alike
        lim = big_limiter(n, clock, rate=1000.0, concurrency=1)
        held = lim.try_admit("http://o")
        assert isinstance(held, Lease)
        candidates, earliest = lim.plan("http://o", clock.now, n)
        assert held.exit_id not in {c.exit_id for c in candidates}
        assert len(candidates) == n - 1
        lim.release(held.id)
        assert held.exit_id in {c.exit_id for c in lim.plan("http://o", clock.now, n)[0]}


def test_idle_pairs_and_origins_are_forgotten_but_not_what_still_matters():
    clock = FakeClock()
    lim = big_limiter(3, clock)
    busy = lim.try_admit("http://busy")
    cooled = lim.try_admit("http://o")
    lim.release(cooled.id)
    lim.rate_limited("http://o", cooled.exit_id, 3600.0, cooled)  # a long cooldown
    idle = lim.try_admit("http://o")
    lim.release(idle.id)
    clock.advance(forgetting.PAIR_IDLE + 1)
    lim.try_admit("http://busy", clock.now + 0)  # keeps the origin in use
    dropped = lim.forget_idle()
    pairs = lim.origins["http://o"].pairs
    assert idle.exit_id not in pairs and cooled.exit_id in pairs  # the cooldown is kept
    assert dropped >= 1
    clock.advance(forgetting.ORIGIN_IDLE + 1)
    lim.forget_idle()
    assert "http://o" not in lim.origins
    assert "http://busy" in lim.origins  # a lease is still out on it
    assert busy.id in lim.leases


def test_a_pair_made_with_a_hold_before_its_first_admission_is_not_forgotten():
    """A warm start staggers the exits' first requests: holds on pair state made before
    any admission (``last_admit`` is -inf, idle "forever"). A forget pass in that window
    dropped the pairs and their holds, and the exits started in step after all."""
    clock = FakeClock(100.0)
    lim = big_limiter(3, clock)
    held, plain = list(lim.exits)[:2]
    lim.pair_state("http://o", held).bucket.hold_until(clock.now + 0.1)
    lim.pair_state("http://o", plain)
    lim.forget_idle()
    pairs = lim.origins["http://o"].pairs
    assert held in pairs and plain not in pairs
    clock.advance(0.2)  # the hold is over: nothing left to say
    assert lim.forget_idle() == 1 and held not in pairs


@pytest_twisted.ensureDeferred
async def test_a_crawl_through_a_large_pool_of_gateway_sessions():
    lab = Lab(exits=2, origin=OriginConfig(rate=None))
    await lab.start()
    try:
        template = f"http://user-{{session}}:pw@127.0.0.1:{lab.proxies[0].port}"
        crawler = await crawl({"EXITLIMIT_EXITS": [template], "EXITLIMIT_SESSIONS": 300,
                               "EXITLIMIT_RATE": 50}, lab.origin_url, 60)
    finally:
        await lab.stop()
    assert len(crawler.spider.ok) == 60
    limiter = crawler.exitlimit.backend.limiter
    (ostate,) = limiter.origins.values()
    assert len(limiter.exits) == 300 and ostate.search.queued  # the heap search ran
    # late binding spread the pages over the sessions (the proxy saw their credentials):
    # a ready exit is chosen each time, never one session for everything (14-17 here;
    # how many depends on how fast answers come back, so the bound is loose)
    sessions = {auth for _, auth in lab.proxies[0].seen_auth}
    assert None not in sessions and len(sessions) >= 5, len(sessions)
