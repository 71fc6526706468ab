"""While Redis is lost: the processes split the exits (rendezvous hashing), each its own."""

from __future__ import annotations

import json
import random

import pytest
import pytest_twisted

from scrapy_exitlimit.core import Lease, Limiter, Limits, make_exit
from scrapy_exitlimit.core import limiter as limiter_module
from scrapy_exitlimit.core.partition import owner, share

from .conftest import FakeClock

SITE = "http://site.test"
EXIT_IDS = [f"10.0.0.{i}:3128" for i in range(40)]


def test_every_exit_belongs_to_exactly_one_member_whoever_computes_it():
    members = ["a:1", "b:2", "c:3"]
    shares = [share(EXIT_IDS, members, me) for me in members]
    assert set().union(*shares) == set(EXIT_IDS)
    assert sum(len(s) for s in shares) == len(EXIT_IDS)  # disjoint
    assert all(shares)  # 40 exits over 3: nobody is left without (not guaranteed for few)
    assert share(EXIT_IDS, list(reversed(members)), "b:2") == shares[1]  # order is no matter


def test_a_member_leaving_moves_only_the_exits_it_held():
    members = ["a:1", "b:2", "c:3"]
    before = {e: owner(e, members) for e in EXIT_IDS}
    after = {e: owner(e, ["a:1", "c:3"]) for e in EXIT_IDS}
    assert {e for e in EXIT_IDS if before[e] != after[e]} == {
        e for e in EXIT_IDS if before[e] == "b:2"}


def test_alone_a_process_keeps_every_exit():
    assert share(EXIT_IDS, [], "me") == share(EXIT_IDS, ["me"], "me") == set(EXIT_IDS)


@pytest.mark.parametrize("n", [4, limiter_module.INDEX_ABOVE + 6])  # scanned and indexed
def test_a_restricted_limiter_admits_only_on_its_exits_until_the_restriction_is_lifted(n):
    clock = FakeClock(0.0)
    lim = Limiter([make_exit(f"http://127.0.0.1:{9000 + i}") for i in range(n)],
                  Limits(rate=5.0, burst=1, concurrency=1), clock=clock, rng=random.Random(1))
    first = lim.try_admit(SITE)  # the index exists before the restriction
    assert isinstance(first, Lease)
    mine = set(list(lim.exits)[1::2])
    lim.restrict(mine)
    got = []
    while isinstance(lease := lim.try_admit(SITE), Lease):
        got.append(lease.exit_id)
    assert set(got) == mine and len(got) == len(mine)
    lim.release(first.id)  # a release on an exit not ours does not bring it back
    assert not isinstance(lim.try_admit(SITE), Lease)
    candidates, _ = lim.plan(SITE, limit=100)
    assert not candidates  # every exit of ours is paced out (or busy): none planned
    other = next(e for e in lim.exits if e not in mine)
    assert not isinstance(lim.try_admit(SITE, pinned=other), Lease)  # pinned elsewhere: waits
    lim.restrict(None)
    rest = []
    while isinstance(lease := lim.try_admit(SITE), Lease):
        rest.append(lease.exit_id)
    assert set(rest) == set(lim.exits) - mine - {first.exit_id}


# -- the Redis backend: Redis lost, the pool split, Redis back empty -------------------
def _backends(redis_url, **extra):
    from scrapy.settings import Settings

    from scrapy_exitlimit.backends.redis import RedisBackend
    from scrapy_exitlimit.config import ExitLimitConfig

    settings = Settings({"EXITLIMIT_EXITS": [f"http://127.0.0.{10 + i}:3128" for i in range(8)],
                         "EXITLIMIT_BACKEND": "redis", "EXITLIMIT_REDIS_URL": redis_url,
                         "EXITLIMIT_START_RATE": 50, **extra})
    config = ExitLimitConfig.from_settings(settings)
    one, two = RedisBackend(config, settings), RedisBackend(config, settings)
    # fixed names: a random pair splits 8 exits 8/0 about once in 128 runs
    one.process_id, two.process_id = "test-one", "test-two"
    return one, two


async def _sleep(seconds: float) -> None:
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    await deferLater(reactor, seconds, lambda: None)


async def _until(condition, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        await _sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.mark.timeout(60)
@pytest_twisted.ensureDeferred
async def test_redis_lost_the_processes_split_the_pool_then_seed_a_restarted_redis(
        redis_server, redis_url, monkeypatch, caplog):
    import redis

    import scrapy_exitlimit.backends.redis as backend_module

    from .test_redis_backend import _drain, admit

    monkeypatch.setattr(backend_module, "HEARTBEAT", 0.1)
    # a process with nothing new waits for one with news: longer than reconnects differ
    monkeypatch.setattr(backend_module, "SEED_DELAY", 5.0)
    caplog.set_level("INFO", logger="scrapy_exitlimit")
    one, two = _backends(redis_url)
    one.open()
    two.open()
    origin = "http://o"
    try:
        await _until(lambda: len(one.members) == len(two.members) == 2)
        before = (await admit(one, origin)).leases[0]  # shared, in flight through the outage
        await _drain(one)
        redis_server.stop()
        await _until(lambda: not one.shared and not two.shared)  # their heartbeats notice
        mine, theirs = one.limiter.allowed, two.limiter.allowed
        assert mine and theirs and not mine & theirs
        assert mine | theirs == set(one.limiter.exits)
        assert one.limiter.share == two.limiter.share == 1.0  # their exits at the full rate
        await _sleep(0.3)  # each exit held a while: another process may just have used it
        got = (await admit(one, origin, want=8)).leases
        assert got and {lease.exit_id for lease in got} <= mine
        one.release(before.id)  # released while Redis is away: taken out when it is back
        one.rate_limited(got[0], 30.0)  # learned and held meanwhile: seeds the new Redis
        learned = json.loads(json.dumps(one.limiter.export_learning(origin)))
        assert learned != two.limiter.export_learning(origin)
        redis_server.start()  # empty
        await _until(lambda: one.shared and two.shared)
        await _until(lambda: one._partition is None and two._partition is None)
        assert one.limiter.allowed is None and two.limiter.allowed is None
        with redis.Redis.from_url(redis_url, decode_responses=True) as client:
            # the leases still in flight are registered again
            for lease in got:
                assert client.zscore(one._key("lease", lease.exit_id),
                                     one._token(lease.id)) is not None
            # the 429's hold went in: the pair is held for the other process too
            pair = client.hgetall(one._key("pair", origin, got[0].exit_id))
            assert float(pair["cool"]) > one.clock() + 20
            # what one learned while Redis was away went in (two had learned nothing)
            version, blob = client.hmget(one._key("learn", origin), "v", "blob")
            seeded = json.loads(blob)
            # the rates learned (who scouts next may have moved on since: not a rate)
            rates = ("lo", "hi", "proven", "seen")
            assert [seeded["estimate"][k] for k in rates] == \
                [learned["estimate"][k] for k in rates]
            for part in ("site", "own", "overload_rate"):
                assert seeded[part] == learned[part], part
        await admit(two, origin)  # and two adopts it
        assert two._learn_seen[origin] == version
    finally:
        await one.close()
        await two.close()
        if redis_server.proc is None:
            redis_server.start()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("partition taken: this process uses" in m for m in messages) == 2
    assert sum("partition given back (all 2 processes rejoined)" in m for m in messages) == 2


@pytest.mark.timeout(30)
@pytest_twisted.ensureDeferred
async def test_processes_know_each_other_within_a_heartbeat_of_starting(redis_url):
    """So a Redis lost in a crawl's first seconds still splits the pool the right way."""
    from scrapy_exitlimit.backends.redis import HEARTBEAT

    one, two = _backends(redis_url)
    one.open()  # its first heartbeat goes at once: it sees only itself
    await _until(lambda: one.members == (one.process_id,))
    two.open()
    try:
        await _until(lambda: len(one.members) == len(two.members) == 2, HEARTBEAT * 1.5)
        assert one.processes == two.processes == 2
    finally:
        await one.close()
        await two.close()


@pytest.mark.timeout(30)
@pytest_twisted.ensureDeferred
async def test_lost_before_the_member_list_was_seen_each_pair_goes_at_one_nth(
        redis_server, redis_url, caplog):
    one, _ = _backends(redis_url)
    one.processes = 3  # say the count came from an earlier life; no member list here
    redis_server.stop()
    one.open()
    try:
        await _until(lambda: not one.shared)
        assert one.limiter.share == pytest.approx(1 / 3) and one.limiter.allowed is None
    finally:
        await one.close()
        redis_server.start()
    assert any("before the member list was seen" in r.getMessage() for r in caplog.records)
