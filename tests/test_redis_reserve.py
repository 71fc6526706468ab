"""At the limit, a call finding no token gets the ones due soon reserved, each request
going at its token's time: processes woken together do not all call again for one token."""

from __future__ import annotations

import pytest
import pytest_twisted
from scrapy.settings import Settings

from scrapy_exitlimit.backends.base import MemoryBackend
from scrapy_exitlimit.backends.redis import HELD_LATE, RESERVE_AHEAD, RedisBackend
from scrapy_exitlimit.config import ExitLimitConfig
from scrapy_exitlimit.core.pair import SETTLED_ANSWERS

from .test_partition import _sleep
from .test_redis_backend import admit, redis_crawl_settings


def warm_backend(redis_url: str) -> RedisBackend:
    settings = Settings({"EXITLIMIT_EXITS": ["http://127.0.0.10:3128", "http://127.0.0.11:3128"],
                         "EXITLIMIT_RATE": 5, **redis_crawl_settings(redis_url)})
    backend = RedisBackend(ExitLimitConfig.from_settings(settings), settings)
    # as after a few answers on each pair: their paths are known (reservations need that)
    backend.limiter.arrival_slack = lambda pair: 0.001
    backend.open()
    return backend


@pytest_twisted.ensureDeferred
async def test_reserved_leases_are_handed_out_at_their_time_without_another_call(redis_url):
    backend = warm_backend(redis_url)
    try:
        first = await admit(backend, "http://o", want=2)
        assert len(first.leases) == 2
        for lease in first.leases:  # answered: the pairs are proven
            backend.release(lease.id)
        await _sleep(0.12)  # the next tokens are 80 ms away: within half an interval
        calls = backend.calls["admit"]
        got = await admit(backend, "http://o", want=2)
        assert got.leases == [] and not got.release_helps
        due = got.ready_at
        assert due - backend.clock() == pytest.approx(0.08, abs=0.03)
        assert backend.calls["admit"] == calls + 1
        early = await admit(backend, "http://o", want=2)
        assert early.leases == [] and early.ready_at == due  # not yet: no call either
        await _sleep(due - backend.clock())
        ready = await admit(backend, "http://o", want=2)
        assert len(ready.leases) == 2
        assert {lease.exit_id for lease in ready.leases} == {lease.exit_id
                                                             for lease in first.leases}
        # each at its own token's time (the two pairs' tokens are a moment apart)
        assert all(due - 1e-5 <= lease.admitted_at <= backend.clock() + 1e-5
                   for lease in ready.leases)
        assert backend.calls["admit"] == calls + 1  # handed out from what was reserved
    finally:
        await backend.close()


@pytest_twisted.ensureDeferred
async def test_a_pair_the_reservation_passed_over_goes_at_its_own_time(redis_url):
    """A call that reserves a warm pair's token does not reserve a cold pair's (its path is
    not known yet); when the cold pair is due first it is asked for then, not once the
    reserved lease has gone: a warm start through Redis lost a whole interval on three of
    ten exits in its first second that way."""
    backend = warm_backend(redis_url)
    try:
        cold_lease = (await admit(backend, "http://o")).leases[0]
        backend.release(cold_lease.id)  # answered at once (a cold pair's next token is an
        await _sleep(0.05)  # interval after its answer, a warm one's after its request)
        warm_lease = (await admit(backend, "http://o")).leases[0]  # the other exit
        warm_pair = backend.limiter.pair_state("http://o", warm_lease.exit_id)
        backend.limiter.arrival_slack = lambda pair: 0.001 if pair is warm_pair else 0.0
        backend.release(warm_lease.id)
        cold_due = cold_lease.admitted_at + 0.2
        await _sleep(cold_due - 0.04 - backend.clock())  # the warm pair's token 90 ms away
        got = await admit(backend, "http://o", want=2)
        assert got.leases == [] and len(backend._held["http://o"]) == 1  # the warm one
        assert got.ready_at == pytest.approx(cold_due, abs=0.015)  # not the warm one's time
        await _sleep(got.ready_at - backend.clock())
        calls = backend.calls["admit"]
        cold = await admit(backend, "http://o", want=2)
        assert [lease.exit_id for lease in cold.leases] == [cold_lease.exit_id]
        assert cold.leases[0].admitted_at == pytest.approx(cold_due, abs=0.015)
        assert backend.calls["admit"] == calls + 1
        await _sleep(backend._held["http://o"][0][0] - backend.clock())
        warm = await admit(backend, "http://o", want=2)
        assert [lease.exit_id for lease in warm.leases] == [warm_lease.exit_id]
        assert backend.calls["admit"] == calls + 1  # handed out from what was reserved
    finally:
        await backend.close()


async def _reserve_two(backend: RedisBackend):
    """Both pairs answered once, then asked again 120 ms on: their next tokens (80 ms
    away, within half an interval) reserved, none handed out yet."""
    for lease in (await admit(backend, "http://o", want=2)).leases:
        backend.release(lease.id)
    await _sleep(0.12)
    got = await admit(backend, "http://o", want=2)
    assert got.leases == [] and backend._held
    return got


@pytest_twisted.ensureDeferred
async def test_reserved_leases_nobody_asks_for_go_back(redis_url):
    backend = warm_backend(redis_url)
    try:
        got = await _reserve_two(backend)
        held = [lease.id for _, _, lease in backend._held["http://o"]]
        # (a lone process waits RESERVE_AHEAD for a pause of its own, several HELD_LATE)
        await _sleep(got.ready_at - backend.clock() + RESERVE_AHEAD + 0.05)
        backend._drop_late_held()  # the heartbeat does this
        assert not backend._held
        assert not any(lease_id in backend.limiter.leases for lease_id in held)
    finally:
        await backend.close()


async def _reserved_then_late(backend: RedisBackend, late: float):
    """Two pairs' tokens reserved, then asked for ``late`` after their time."""
    got = await _reserve_two(backend)
    await _sleep(got.ready_at - backend.clock() + late)
    return await admit(backend, "http://o", want=2)


@pytest_twisted.ensureDeferred
async def test_a_lone_process_late_for_its_reserved_tokens_still_sends_them(redis_url):
    """A pause of the process's own (a garbage collection: 50-70 ms every few seconds on
    nginx) made every reserved token due in it go back unused: each of those exits lost a
    whole interval. Alone, no other process can hold the pairs' next tokens: the requests
    go, and each pair's next token is an interval after its request went."""
    import redis

    backend = warm_backend(redis_url)
    try:
        got = await _reserved_then_late(backend, HELD_LATE + 0.04)
        went = backend.clock()
        assert len(got.leases) == 2 and backend.held_late == 0
        await _sleep(0.3)  # the anchors ride with the next call, or go alone
        with redis.Redis.from_url(redis_url) as client:
            for lease in got.leases:
                key = backend._key("pair", "http://o", backend.limiter.pair_key(lease.exit_id))
                interval = backend.limiter.pair_state("http://o", lease.exit_id).bucket.interval
                assert float(client.hget(key, "tat")) >= went + interval - 0.002
    finally:
        await backend.close()


@pytest_twisted.ensureDeferred
async def test_a_process_among_others_late_for_its_reserved_tokens_gives_them_back(redis_url):
    other = warm_backend(redis_url)  # another process: it may hold the pairs' next tokens
    await _sleep(0.1)
    backend = warm_backend(redis_url)
    try:
        await _sleep(0.1)
        assert backend.processes == 2  # its presence seen
        await _reserved_then_late(backend, HELD_LATE + 0.04)
        assert backend.held_late == 2  # (what it gets instead is asked of Redis anew)
    finally:
        await backend.close()
        await other.close()


@pytest_twisted.ensureDeferred
async def test_a_reserved_request_handed_out_late_moves_the_origin_budget_on(redis_url,
                                                                            monkeypatch):
    """A strict site counts the origin budget's gaps from arrival to arrival: a reserved
    token's request handed out late (its timer fired late) puts the budget's next token an
    interval after it went, not after the token's time (the memory backend stamps a
    request when it goes). Also: no call before the next token may be reserved."""
    import redis

    import scrapy_exitlimit.backends.redis as redis_backend

    monkeypatch.setattr(redis_backend, "HELD_LATE", 5.0)  # however late the machine is
    settings = Settings({"EXITLIMIT_EXITS": ["http://127.0.0.10:3128"],  # a pair known warm
                         "EXITLIMIT_RATE": 100, "EXITLIMIT_ORIGIN_RATE": 10,
                         **redis_crawl_settings(redis_url)})
    backend = RedisBackend(ExitLimitConfig.from_settings(settings), settings)
    backend.limiter.arrival_slack = lambda pair: 0.001  # the pairs' paths are known
    backend.open()
    try:
        first = await admit(backend, "http://o")
        backend.release(first.leases[0].id)  # its answer: the next need not wait for it
        calls = backend.calls["admit"]
        early = await admit(backend, "http://o")
        assert early.leases == [] and backend.calls["admit"] == calls  # nothing to ask yet
        await _sleep(early.ready_at - backend.clock())
        got = await admit(backend, "http://o")
        assert got.leases == [] and backend._held  # reserved at the token's time
        await _sleep(got.ready_at - backend.clock() + 0.03)
        late = await admit(backend, "http://o")
        went = backend.clock()
        assert len(late.leases) == 1 and went - late.leases[0].admitted_at >= 0.03
        await admit(backend, "http://o")
        await _sleep(0.3)  # the anchor rides with the next call, or goes alone
        with redis.Redis.from_url(redis_url) as client:
            tat = float(client.hget(backend._key("origin", "http://o"), "tat"))
        assert tat >= went + 0.1 - 0.002
    finally:
        await backend.close()


def test_a_configured_site_rate_gets_the_safety_margin_once_processes_share_it():
    """One process stamps each request of the origin budget when it goes (exact); several
    cannot see each other's sends, so a configured site rate is paced with the margin a
    learned one has."""
    from scrapy_exitlimit.core.bucket import TokenBucket

    settings = Settings({"EXITLIMIT_EXITS": ["http://127.0.0.10:3128"],
                         "EXITLIMIT_ORIGIN_RATE": 20, "EXITLIMIT_SAFETY_MARGIN": 0.005,
                         **redis_crawl_settings("redis://127.0.0.1:1/0")})
    backend = RedisBackend(ExitLimitConfig.from_settings(settings), settings)
    configured = backend.limiter.origin_state("http://o").budget.bucket
    learned = TokenBucket(20, 1, 0.005)
    assert backend._origin_interval(configured) == pytest.approx(0.05)
    assert backend._origin_interval(learned) == pytest.approx(0.055)
    backend.processes = 3
    assert backend._origin_interval(configured) == pytest.approx(0.055)
    assert backend._origin_interval(learned) == pytest.approx(0.055)  # no second margin


def test_pairs_paced_through_redis_keep_the_whole_safety_margin_once_settled(redis_url):
    """Another process may take a pair's next token, seeing neither this one's late timers
    nor its answers (and a reserved lease may go HELD_LATE late): the margin stays whole
    where the memory backend lets a settled pair at a given rate keep 2 ms of its 5."""
    settings = Settings({"EXITLIMIT_EXITS": ["http://127.0.0.10:3128"], "EXITLIMIT_RATE": 5,
                         **redis_crawl_settings(redis_url)})
    config = ExitLimitConfig.from_settings(settings)
    shared, local = RedisBackend(config, settings), MemoryBackend(config)
    for backend, settled in ((shared, 0.005), (local, 0.002)):
        pair = backend.limiter.pair_state("http://o", "http://127.0.0.10:3128")
        pair.answers = SETTLED_ANSWERS
        assert backend.limiter.safety_margin(pair, given=False) == pytest.approx(0.005)
        assert backend.limiter.safety_margin(pair, given=True) == pytest.approx(settled)
