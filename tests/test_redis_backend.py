"""The Redis backend in real crawls: one Redis, several crawls sharing their exits."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import pytest_twisted
import redis
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_exitlimit.backends.redis import RedisBackend, RedisUnavailable, redis_settings
from scrapy_exitlimit.config import ExitLimitConfig
from scrapy_exitlimit.core.bucket import FIRST_ANSWER_WAIT
from scrapy_exitlimit.lab import Lab, OriginConfig
from scrapy_exitlimit.lab.process import start_lab_process
from scrapy_exitlimit.lab.spider import PagesSpider
from scrapy_exitlimit.middleware import ExitLimitMiddleware

from .crawling import QUIET, crawl_lab, crawl_twice_at_once
from .redis_server import free_port

EXITS = ["http://127.0.0.10:3128", "http://127.0.0.11:3128"]


def redis_crawl_settings(url: str, **extra):
    return {"EXITLIMIT_BACKEND": "redis", "EXITLIMIT_REDIS_URL": url, **extra}


# -- settings and start-up ---------------------------------------------------------
def test_connection_settings_come_from_scrapy_redis_and_can_be_overridden():
    s = Settings({"REDIS_HOST": "10.0.0.5", "REDIS_PORT": 6380,
                  "REDIS_PARAMS": {"password": "pw", "socket_timeout": 30}})
    url, params, source = redis_settings(s)
    assert url is None and source == "REDIS_HOST/REDIS_PORT"
    assert params["host"] == "10.0.0.5" and params["port"] == 6380 and params["password"] == "pw"
    assert params["socket_timeout"] == 1.0  # a dead Redis must not stall admissions for 30 s
    s = Settings({"REDIS_URL": "redis://a:1", "EXITLIMIT_REDIS_URL": "redis://b:2"})
    assert redis_settings(s)[0] == "redis://b:2"
    assert redis_settings(Settings({"REDIS_URL": "redis://a:1"}))[2] == "REDIS_URL"


def test_unreachable_redis_at_start_is_a_clear_error_naming_the_setting():
    url = f"redis://:secretpw@127.0.0.1:{free_port()}/0"
    crawler = get_crawler(PagesSpider, {**QUIET, "EXITLIMIT_EXITS": EXITS,
                                        **redis_crawl_settings(url)})
    with pytest.raises(RedisUnavailable, match="EXITLIMIT_REDIS_URL") as info:
        ExitLimitMiddleware.from_crawler(crawler)
    assert "secretpw" not in str(info.value)


@pytest.mark.parametrize(("name", "value"), [("EXITLIMIT_REDIS_ON_ERROR", "crash"),
                                             ("EXITLIMIT_REDIS_PREFIX", "a{b}"),
                                             ("EXITLIMIT_REDIS_TIMEOUT", "-1")])
def test_bad_redis_settings_name_themselves(name, value):
    settings = Settings({"EXITLIMIT_EXITS": EXITS, "EXITLIMIT_BACKEND": "redis", name: value})
    with pytest.raises(ValueError, match=name):
        RedisBackend(ExitLimitConfig.from_settings(settings), settings)


def test_unknown_backend_names_the_setting():
    crawler = get_crawler(PagesSpider, {**QUIET, "EXITLIMIT_EXITS": EXITS,
                                        "EXITLIMIT_BACKEND": "no.such.Backend"})
    with pytest.raises(ValueError, match="EXITLIMIT_BACKEND"):
        ExitLimitMiddleware.from_crawler(crawler)


# -- crawls --------------------------------------------------------------------------
@pytest_twisted.ensureDeferred
async def test_crawl_on_shared_state_loses_nothing_and_keeps_the_limit(redis_url):
    lab = Lab(exits=3, origin=OriginConfig(rate=10, burst=1))
    # paced at 8 of the origin's 10 r/s: each admission's answer comes back from
    # redis-server before the request goes out, so on a loaded machine a late reply can
    # put a request close behind the one before it (seen in CI at 9 r/s: one 429)
    crawler = await crawl_lab(lab, redis_crawl_settings(redis_url, EXITLIMIT_RATE=8), 45)
    spider, stats = crawler.spider, crawler.stats.get_stats()
    assert len(spider.ok) == 45 and not spider.failed
    assert lab.origin.total(429) == 0
    for ip in lab.origin.ips():
        assert lab.origin.max_in_window(ip, 1.0) <= 10
    # about one call per admission: releases ride along, a caller finding no token gets
    # the next one reserved; the heartbeat
    assert 0 < stats["exitlimit/redis_round_trips"] <= 2 * 45
    with redis.Redis.from_url(redis_url) as client:
        keys = client.keys("{exitlimit}:*")
        assert any(k.startswith(b"{exitlimit}:pair:") for k in keys)
        # the crawl gave its leases back when it closed
        assert all(client.zcard(k) == 0 for k in keys if k.startswith(b"{exitlimit}:lease:"))


@pytest_twisted.ensureDeferred
async def test_two_crawls_at_once_share_each_pairs_rate(redis_url):
    """Two crawlers (one process, one Redis) on the same exits: together within the limit."""
    lab = Lab(exits=2, origin=OriginConfig(rate=10, burst=1))
    await lab.start()
    try:
        a, b, wall = await crawl_twice_at_once(
            lab, redis_crawl_settings(redis_url, EXITLIMIT_RATE=9), 50)
    finally:
        await lab.stop()
    assert len(a.spider.ok) == 25 and len(b.spider.ok) == 25
    # paced at 9 of the origin's 10 r/s: on a loaded machine a send the event loop delays
    # can land one request close behind another now and then (seen in CI: 2)
    assert lab.origin.total(429) <= 2
    for ip in lab.origin.ips():
        assert lab.origin.max_in_window(ip, 1.0) <= 10
    # 50 pages at 2 x 9 r/s shared: about 2.8 s; unshared it would be half that
    assert wall >= 50 / 18 * 0.8


@pytest_twisted.ensureDeferred
async def test_a_429_seen_by_one_crawl_cools_the_pair_for_the_other(redis_url):
    backend_settings = Settings({"EXITLIMIT_EXITS": EXITS[:1], "EXITLIMIT_RATE": 100,
                                 **redis_crawl_settings(redis_url)})
    config = ExitLimitConfig.from_settings(backend_settings)
    one, two = RedisBackend(config, backend_settings), RedisBackend(config, backend_settings)
    one.open()
    two.open()
    try:
        got = await admit(one, "http://o")
        lease = got.leases[0]
        one.rate_limited(lease, 30.0)
        await _drain(one)
        got = await admit(two, "http://o")
        assert got.leases == []
        assert got.ready_at - two.clock() == pytest.approx(30.0, abs=4.0)  # jitter is up to 10 %
    finally:
        await one.close()
        await two.close()


@pytest_twisted.ensureDeferred
async def test_learning_is_shared_and_one_congestion_event_lowers_the_rate_once(redis_url):
    import asyncio

    from twisted.internet import reactor
    from twisted.internet.defer import Deferred
    from twisted.internet.task import deferLater

    # one exit: a 429 on two exits' scouts would first be the exit's own (until a second
    # exit agrees); here the pool learns at once
    settings = Settings({"EXITLIMIT_EXITS": EXITS[:1], "EXITLIMIT_START_RATE": 8,
                         **redis_crawl_settings(redis_url)})
    one, two = _two_processes(settings)
    origin = "http://o"
    try:
        first = await _answered_clean(one, origin)  # the scout's first request
        await deferLater(reactor, 0.2, lambda: None)
        b = (await admit(two, origin)).leases[0]  # in flight in the other process
        await _drain(two)
        a = None
        for _ in range(5):  # the scout's second request, once the pacing allows
            await deferLater(reactor, 0.2, lambda: None)
            for lease in (await admit(one, origin, want=2)).leases:
                if lease.exit_id == first.exit_id and a is None:
                    a = lease
                else:
                    one.release(lease.id, answered=False)
            await _drain(one)
            if a is not None:
                break
        assert a is not None and a.rate == 8  # the start rate, tried first
        # both 429s belong to one congestion event: only the first teaches anything
        one.rate_limited(a, 0.01)
        await _drain(one)
        two.rate_limited(b, 0.01)
        await _drain(two)
        await _drain(one)
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        version, blob = client.hmget(one._key("learn", origin), "v", "blob")
        shared = json.loads(blob)["estimate"]
        assert (shared["lo"], shared["hi"]) == (4, 8)  # once, not twice
        # the other process adopts it from Redis (its next look at what was learned)
        await Deferred.fromFuture(asyncio.ensure_future(two._pull_learning(origin, version)))
        est_one = one.limiter.origin_state(origin).estimate
        est_two = two.limiter.origin_state(origin).estimate
        # the start rate drew a 429: half of it is tried next, in both processes
        assert (est_one.lo, est_one.hi) == (est_two.lo, est_two.hi) == (4, 8)
    finally:
        await one.close()
        await two.close()


@pytest_twisted.ensureDeferred
async def test_a_learned_site_rate_is_shared_and_paces_the_origin_in_the_script(redis_url):
    settings = Settings({"EXITLIMIT_EXITS": EXITS, **redis_crawl_settings(redis_url)})
    one, two = _two_processes(settings)
    origin = "http://o"
    try:
        # a first request on each exit, both refused: no pair's pace explains that
        leases = (await admit(one, origin, want=2)).leases
        assert len({lease.exit_id for lease in leases}) == 2
        for lease in leases:
            one.rate_limited(lease, 0.01)
        await _drain(one)
        site = one.limiter.origin_state(origin).learner.site
        assert site is not None
        await admit(two, origin)  # syncs what the pool learned
        await _drain(two)
        shared = two.limiter.origin_state(origin)
        assert shared.learner.site is not None and shared.learner.site.lo == site.lo
        # the budget that goes to the script paces the origin at the site's rate
        two.limiter.plan(origin)
        assert shared.budget.bucket is not None
        assert shared.budget.bucket.rate == pytest.approx(site.target())
    finally:
        await one.close()
        await two.close()


@pytest_twisted.ensureDeferred
async def test_the_site_gap_and_the_pair_gap_count_the_other_processes_admissions(redis_url):
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    # each process sees a share of the origin's traffic: its own gaps would read the
    # site's pace as that share, and a learned site rate, confirmed only at the pace
    # that went through, would never rise
    settings = Settings({"EXITLIMIT_EXITS": EXITS[:1], "EXITLIMIT_RATE": 1000,
                         **redis_crawl_settings(redis_url)})
    one, two = _two_processes(settings)
    origin = "http://o"
    try:
        first = await _answered_clean(one, origin)
        assert first.site_gap == first.gap == math.inf  # the origin's first admission
        leases = []
        for _ in range(5):  # two has admitted nothing yet: once its pacing allows
            leases = (await admit(two, origin)).leases
            if leases:
                break
            await deferLater(reactor, 0.2, lambda: None)
        second = leases[0]
        assert 0 < second.site_gap < 5.0 and 0 < second.gap < 5.0
        assert second.foreign_before == pytest.approx(second.admitted_at - second.gap)
    finally:
        await one.close()
        await two.close()


async def _answered_clean(backend: RedisBackend, origin: str):
    """One request admitted, answered clean and released, its shared updates done."""
    lease = (await admit(backend, origin)).leases[0]
    backend.success(lease, 0.001)
    backend.release(lease.id)
    await _drain(backend)
    return lease


def _two_processes(settings: Settings) -> tuple[RedisBackend, RedisBackend]:
    """Two crawl processes' backends on one Redis, opened."""
    config = ExitLimitConfig.from_settings(settings)
    one, two = RedisBackend(config, settings), RedisBackend(config, settings)
    one.open()
    two.open()
    return one, two


async def admit(backend: RedisBackend, origin: str, want: int = 1):
    """One admission call (an asyncio future), awaited from a Twisted coroutine."""
    from twisted.internet.defer import Deferred

    return await Deferred.fromFuture(backend.admit(origin, want, backend.clock()))


async def _drain(backend: RedisBackend) -> None:
    """Wait for the backend's fire-and-forget updates of shared state."""
    import asyncio

    from twisted.internet.defer import Deferred

    while backend._tasks:
        await Deferred.fromFuture(asyncio.gather(*list(backend._tasks),
                                                 return_exceptions=True))


@pytest_twisted.ensureDeferred
async def test_a_site_rate_through_redis_spreads_over_every_exit(redis_url):
    """Under a budget every exit shares (a configured site rate) the shared token goes to
    the pair that waited longest, warm or cold: a process whose first pairs warmed up
    first must not keep the token for them (seen: 3 of 10 exits carried a 600-page crawl,
    at 0.73 of the site's rate). Paced under the site's limit, as the other lab tests."""
    lab = Lab(exits=4, origin=OriginConfig(rate=5, burst=1, origin_rate=12))
    settings = redis_crawl_settings(redis_url, EXITLIMIT_RATE=5, EXITLIMIT_ORIGIN_RATE=10)
    crawler = await crawl_lab(lab, settings, 80)
    spider = crawler.spider
    assert len(spider.ok) == 80 and not spider.failed
    assert lab.origin.total(429) == 0
    shares = sorted(len(lab.origin.arrival_times(ip)) for ip in lab.origin.ips())
    assert len(shares) == 4 and shares[0] >= 12, shares  # an even share is 20


@pytest_twisted.ensureDeferred
async def test_leases_of_a_killed_process_expire(redis_url, monkeypatch):
    import scrapy_exitlimit.backends.redis as backend_module

    settings = Settings({"EXITLIMIT_EXITS": EXITS[:1], "EXITLIMIT_RATE": 1000,
                         "EXITLIMIT_CONCURRENCY": 1, "EXITLIMIT_BURST": 5,
                         **redis_crawl_settings(redis_url)})
    config = ExitLimitConfig.from_settings(settings)
    monkeypatch.setattr(backend_module, "LEASE_TTL", -1.0)  # the "dead" one's leases lapse
    dead = RedisBackend(config, settings)
    dead.open()
    assert (await admit(dead, "http://o")).leases
    dead._closed = True  # killed: no heartbeat, no release
    monkeypatch.setattr(backend_module, "LEASE_TTL", 15.0)
    alive = RedisBackend(config, settings)
    alive.open()
    try:
        assert (await admit(alive, "http://o")).leases
    finally:
        await alive.close()


# -- Redis trouble -------------------------------------------------------------------------
@pytest_twisted.ensureDeferred
async def test_redis_restarted_mid_crawl_loses_nothing(redis_server, redis_url, caplog):
    """Redis dies mid-crawl: the crawl carries on on local state, then resumes shared."""
    from twisted.internet import reactor
    from twisted.internet.defer import ensureDeferred
    from twisted.internet.task import deferLater

    lab = Lab(exits=3, origin=OriginConfig(rate=20, burst=1))
    settings = redis_crawl_settings(redis_url, EXITLIMIT_RATE=18, LOG_LEVEL="INFO")

    async def outage():
        await deferLater(reactor, 0.5, lambda: None)
        redis_server.stop()
        await deferLater(reactor, 1.0, lambda: None)
        redis_server.start()

    outage_done = ensureDeferred(outage())
    crawler = await crawl_lab(lab, settings, 180)
    await outage_done
    spider, stats = crawler.spider, crawler.stats.get_stats()
    assert len(spider.ok) == 180 and not spider.failed
    assert stats["finish_reason"] == "finished"
    assert stats["exitlimit/redis_errors"] >= 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("Redis lost" in m for m in messages)
    assert any("Redis is back" in m for m in messages)


def test_three_processes_share_their_exits_within_the_limit(redis_url):
    """Separate crawl processes, one Redis: the origin sees each exit within its per-IP
    limit. Paced 10 % under it, as the other lab tests: exact-limit runs are in bench/."""
    lab, info = start_lab_process("--exits", "4", "--rate", "10")
    try:
        crawls = [subprocess.Popen(
            [sys.executable, "-m", "scrapy_exitlimit.lab.crawl", "--origin", info["origin_url"],
             "--exits", ",".join(info["exit_urls"]), "--pages", "40", "--first", str(40 * i),
             "--set", "EXITLIMIT_BACKEND=redis", "--set", f"EXITLIMIT_REDIS_URL={redis_url}",
             "--set", "EXITLIMIT_RATE=9", "--set", "LOG_LEVEL=INFO",
             # a lost answer costs a re-issue, not Scrapy's 3-minute default
             "--set", "DOWNLOAD_TIMEOUT=10", "--set", "CLOSESPIDER_TIMEOUT=60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(3)]
        results, logs = [], []
        for proc in crawls:
            try:
                out, err = proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                pytest.fail(f"a crawl process did not finish; its log ends:\n{err[-3000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
            logs.append(err)
        from urllib.request import urlopen

        with urlopen(info["origin_url"] + "/_lab/stats", timeout=10) as resp:
            origin = json.loads(resp.read())
    finally:
        lab.terminate()
        lab.wait(10)
    assert [r["ok"] for r in results] == [40, 40, 40], [
        (r["finish_reason"], dict(list(r["failed"].items())[:3]), r["exitlimit"], log[-2000:])
        for r, log in zip(results, logs, strict=True)]
    # unshared, three processes would each send the full rate: 3x the limit, answered by
    # dozens of 429s. Shared and paced at 9 of 10 r/s, a send a loaded machine delays can
    # land one request close behind another now and then (seen: 1, on 4 of ~10 full runs
    # with other suites running beside it), as in test_two_crawls_at_once_share_each_pairs_rate
    assert origin["totals"]["status"].get("429", 0) <= 2, origin["totals"]
    assert all(r["exitlimit"]["exitlimit/redis_round_trips"] > 0 for r in results)


@pytest_twisted.ensureDeferred
async def test_quiet_answers_look_at_what_was_learned_at_most_every_learn_check(redis_url):
    """The look is a walk over the origin's pairs: not once per answer on a large pool;
    feedback with events (a 429) is looked at, and published, at once."""
    import scrapy_exitlimit.backends.redis as backend_module

    settings = Settings({"EXITLIMIT_EXITS": EXITS, "EXITLIMIT_RATE": 1000,
                         **redis_crawl_settings(redis_url)})
    backend = RedisBackend(ExitLimitConfig.from_settings(settings), settings)
    backend.open()
    looks = []
    mark = backend.limiter.learning_mark
    backend.limiter.learning_mark = lambda origin: looks.append(origin) or mark(origin)
    try:
        lease = (await admit(backend, "http://o")).leases[0]
        await _drain(backend)
        clock = [backend.clock() + backend_module.LEARN_CHECK]
        backend.clock = lambda: clock[0]
        looks.clear()
        for _ in range(50):  # 50 quiet answers within one LEARN_CHECK
            backend.success(lease, 0.01)
        assert len(looks) == 1
        await _drain(backend)  # a publish, if that look found news
        clock[0] += 2 * backend_module.LEARN_CHECK
        looks.clear()
        backend.success(lease, 0.01)
        backend.success(lease, 0.01)
        assert len(looks) == 1
        await _drain(backend)
        looks.clear()
        backend.rate_limited(lease, 1.0)  # events: at once
        assert len(looks) == 1
        await _drain(backend)
    finally:
        await backend.close()


@pytest_twisted.ensureDeferred
async def test_a_learned_scope_rate_is_shared_between_processes(redis_url, monkeypatch):
    """What one process learned of an account's rate paces the account in another: read
    before the other's first request of the scope, and read back while it is in use."""
    from twisted.internet.defer import Deferred

    from scrapy_exitlimit.backends import redis as redis_backend

    monkeypatch.setattr(redis_backend, "LEARN_CHECK", 0.0)  # every change published at once
    settings = Settings({"EXITLIMIT_EXITS": EXITS, **redis_crawl_settings(redis_url)})
    one, two = _two_processes(settings)
    scope = one.config.scopes.scope("acct-SECRET")  # no rule: learned
    origin = "http://o"

    async def admit_scoped(backend: RedisBackend):
        got = await Deferred.fromFuture(backend.admit(origin, 1, backend.clock(),
                                                      scopes=(scope,)))
        for lease in got.leases:
            backend.release(lease.id, answered=False)
        await _drain(backend)
        return got

    def learned(backend: RedisBackend):
        return backend.limiter.scopes.learned(scope.id).site

    try:
        await admit_scoped(one)
        learned(one).rejected(1.6, one.clock(), 1)  # as the account's 429s would
        await admit_scoped(one)  # publishes what changed
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        keys = [k for k in client.keys("{exitlimit}:learn-scope:*")]
        assert keys == [one._scope_key(scope.id)] and "SECRET" not in keys[0]
        await admit_scoped(two)  # its first request of the scope: read first
        assert (learned(two).lo, learned(two).hi) == (learned(one).lo, learned(one).hi)
        assert learned(two).hi == 1.6
        assert two.limiter.scopes.states[scope.id].rate == pytest.approx(learned(one).target())
        # later changes reach it while the scope is in use (at most SCOPE_PULL later)
        monkeypatch.setattr(redis_backend, "SCOPE_PULL", 0.0)
        learned(one).rejected(1.0, one.clock() + 1, 1)
        await admit_scoped(one)
        await admit_scoped(two)  # the read back starts here ...
        await admit_scoped(two)  # ... and what it read paces this one
        assert learned(two).hi == learned(one).hi == 1.0
        # forgotten when idle (the limiter's rule), it leaves the backend's books too
        two.limiter.forget_idle(two.clock() + 2 * 3600)
        two._forget_scopes()
        assert scope.id not in two._scope_seen and scope.id not in two._scope_used
        assert scope.id in one._scope_seen  # the other process still uses it
    finally:
        await one.close()
        await two.close()


@pytest_twisted.ensureDeferred
async def test_a_processes_first_request_under_the_origin_budget_goes_alone(redis_url):
    """Each process's first request rides its own cold connection: it is asked for alone,
    and the next waits for its answer (``ArrivalFloor.gate``) without asking Redis."""
    from twisted.internet import reactor
    from twisted.internet.defer import Deferred
    from twisted.internet.task import deferLater

    exits = [f"http://127.0.0.{10 + i}:3128" for i in range(4)]
    settings = Settings({"EXITLIMIT_EXITS": exits, "EXITLIMIT_RATE": 100,
                         "EXITLIMIT_ORIGIN_RATE": 20, **redis_crawl_settings(redis_url)})
    one, two = _two_processes(settings)
    try:
        got = await Deferred.fromFuture(one.admit("http://o", 3, one.clock()))
        assert len(got.leases) == 1  # three asked, the first alone
        before = one.calls["admit"]
        held = await Deferred.fromFuture(one.admit("http://o", 3, one.clock()))
        assert held.leases == [] and held.ready_at == pytest.approx(
            got.leases[0].admitted_at + FIRST_ANSWER_WAIT)
        assert one.calls["admit"] == before  # local knowledge: no call
        one.release(got.leases[0].id, answered=True)
        answered_at = one.clock()
        after = await Deferred.fromFuture(one.admit("http://o", 1, one.clock()))
        # the gate is open, and the next token is an interval (1/20 s) after the first
        # went: no call before it may be had (local knowledge), and then Redis is asked
        sent = got.leases[0].admitted_at
        assert after.leases == [] and sent < after.ready_at <= sent + 0.05
        assert one.calls["admit"] == before
        await deferLater(reactor, max(0.0, after.ready_at - one.clock()), lambda: None)
        then = await Deferred.fromFuture(one.admit("http://o", 1, one.clock()))
        assert one.calls["admit"] == before + 1
        # granted, or due an interval after the answer at the latest
        assert then.leases or then.ready_at <= answered_at + 0.05 + 0.01
    finally:
        await one.close()
        await two.close()


@pytest_twisted.ensureDeferred
async def test_a_scope_without_a_token_costs_one_admission_call_not_one_per_chunk(redis_url):
    """The script says when a scope's (or the origin's) token held up a ready pair: the
    other candidates would wait for the same token, so they are not tried in a second
    call (a scoped request gets no token reserved ahead: each wake is a call)."""
    from twisted.internet.defer import Deferred

    exits = [f"http://127.0.0.{10 + i}:3128" for i in range(10)]  # more than the first few
    settings = Settings({"EXITLIMIT_EXITS": exits, "EXITLIMIT_RATE": 100,
                         "EXITLIMIT_SCOPES": {"acct-*": {"rate": 0.5}},
                         **redis_crawl_settings(redis_url)})
    one, two = _two_processes(settings)
    scope = one.config.scopes.scope("acct-1")
    try:
        got = await Deferred.fromFuture(one.admit("http://o", 1, one.clock(), scopes=(scope,)))
        assert len(got.leases) == 1
        # answered: the scope's first answer, so its next request is not held for it
        # (``ArrivalFloor.gate``: no call at all meanwhile) but by its token
        one.release(got.leases[0].id, answered=True)
        before = one.calls["admit"]
        got = await Deferred.fromFuture(one.admit("http://o", 1, one.clock(), scopes=(scope,)))
        assert got.leases == [] and got.ready_at >= one.clock() + 1.0  # the scope's token
        assert one.calls["admit"] == before + 1
    finally:
        await one.close()
        await two.close()
