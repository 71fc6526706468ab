"""Sticky sessions and exit-IP resolution: in the pure core, and in real crawls."""

from __future__ import annotations

import asyncio

import pytest
import pytest_twisted
import scrapy
from scrapy.utils.test import get_crawler
from twisted.internet.defer import Deferred, ensureDeferred

from scrapy_exitlimit.admission import ExitsUnavailable, HandedBack, Repin
from scrapy_exitlimit.core import Lease, Limiter, Limits, make_exit
from scrapy_exitlimit.lab import IPRule, Lab, OriginConfig
from scrapy_exitlimit.middleware import exit_ip
from scrapy_exitlimit.sessions import StickySessions

from .conftest import FakeClock
from .crawling import CALLBACK_DELAY, QUIET, crawl_lab

ORIGIN = "http://o"


def limiter(n=2, rate=10.0, clock=None):
    exits = [make_exit(f"http://127.0.0.{10 + i}:3128") for i in range(n)]
    return Limiter(exits, Limits(rate=rate, burst=1), clock=clock or FakeClock()), exits


# -- pure core ---------------------------------------------------------------------
def test_only_admits_on_the_named_exit_or_answers_when():
    clock = FakeClock()
    lim, exits = limiter(clock=clock)
    a = exits[0].id
    first = lim.try_admit(ORIGIN, pinned=a)
    assert isinstance(first, Lease) and first.exit_id == a
    lim.release(first.id)  # answered: a's next token is one interval on
    # a's token is spent; b is free, but a pinned request waits for a
    assert lim.try_admit(ORIGIN, pinned=a) == clock.now + 0.1 + lim.tuning.margin
    assert isinstance(lim.try_admit(ORIGIN), Lease)


def test_a_new_exit_ip_gets_pair_state_of_its_own():
    clock = FakeClock()
    lim, exits = limiter(n=1, clock=clock)
    a = exits[0].id
    lim.exit_ip_seen(a, "10.0.0.1")
    lease = lim.try_admit(ORIGIN)
    lim.rate_limited(ORIGIN, a, 30.0, lease)  # the old address is cooling down for 30 s
    lim.release(lease.id)
    assert not isinstance(lim.try_admit(ORIGIN), Lease)
    events = lim.exit_ip_seen(a, "10.0.0.2").events  # the provider swapped the IP behind it
    assert [e.kind for e in events] == ["exit_ip_changed"]
    assert isinstance(lim.try_admit(ORIGIN), Lease)  # not guarded by the old IP's cooldown
    # ... nor ungoverned: paced at the pair rate from its first request
    assert not isinstance(lim.try_admit(ORIGIN), Lease)
    assert lim.origin_state(ORIGIN).pairs.keys() == {"10.0.0.1", "10.0.0.2"}


def test_two_exits_on_one_ip_share_one_limit():
    clock = FakeClock()
    lim, exits = limiter(n=2, clock=clock)
    for ex in exits:
        lim.exit_ip_seen(ex.id, "10.0.0.9")
    assert isinstance(lim.try_admit(ORIGIN), Lease)
    assert not isinstance(lim.try_admit(ORIGIN), Lease)  # the other exit: same IP, same bucket


def test_a_lease_is_released_from_the_pair_that_counted_it():
    lim, exits = limiter(n=1)
    a = exits[0].id
    lease = lim.try_admit(ORIGIN)
    lim.exit_ip_seen(a, "10.0.0.3")
    lim.release(lease.id)
    assert lim.origin_state(ORIGIN).pairs[a].in_flight == 0


def test_exit_ip_header_values():
    assert exit_ip(b" 203.0.113.7 ") == "203.0.113.7"
    assert exit_ip(b"2001:db8::1") == "2001:db8::1"
    for bad in (None, b"", b"not-an-ip", b"1.2.3.4, 5.6.7.8", b"\xff", b"9" * 100):
        assert exit_ip(bad) is None


# -- StickySessions, with a queue the test drives ----------------------------------
class FakeStats:
    def __init__(self):
        self.values: dict[str, int] = {}

    def inc_value(self, key, count=1):
        self.values[key] = self.values.get(key, 0) + count


class Queue:
    """``acquire`` parks every request; the test admits or fails them, oldest first."""

    def __init__(self, kind):
        self.kind = kind
        self.parked: list[tuple[str | None, object]] = []
        self.bad: set[str] = set()

    def waitable(self):
        return asyncio.get_running_loop().create_future() if self.kind == "future" \
            else Deferred()

    async def acquire(self, origin, pinned, scopes=()):
        result = self.waitable()
        self.parked.append((pinned, result))
        return await result

    def admit(self, exit_id, pinned=None):
        """The oldest request parked for ``pinned`` gets a lease on ``exit_id``."""
        i = next(i for i, (o, _) in enumerate(self.parked) if o == pinned)
        _, result = self.parked.pop(i)
        lease = Lease(id=i, origin=ORIGIN, exit_id=exit_id, admitted_at=0.0, rate=1.0,
                      gap=0.0, was_full=False)
        if self.kind == "future":
            result.set_result(lease)
        else:
            result.callback(lease)

    def fail(self, exc, pinned=None):
        for o, result in [p for p in self.parked if p[0] == pinned]:
            self.parked.remove((o, result))
            if self.kind == "future":
                result.set_exception(exc)
            else:
                result.errback(exc)


def sessions_over(queue):
    stats = FakeStats()
    return StickySessions(usable=lambda origin, exit_id: exit_id not in queue.bad,
                          acquire=queue.acquire, waitable=queue.waitable, stats=stats), stats


async def turn():
    """Let the callbacks of whatever just fired run (the test runs as a Deferred)."""
    await Deferred.fromFuture(asyncio.ensure_future(asyncio.sleep(0.005)))


async def outcome(request):
    return await Deferred.fromFuture(request)


def start(sessions, session, kind="future"):
    """Run one request's admission as Scrapy does: a task on asyncio, else a Deferred."""
    coro = sessions.admit(ORIGIN, session)
    if kind == "future":
        return asyncio.ensure_future(coro)
    return ensureDeferred(coro).asFuture(asyncio.get_running_loop())


@pytest.mark.parametrize("kind", ["future", "deferred"])
@pytest_twisted.ensureDeferred
async def test_one_request_chooses_a_sessions_exit_and_the_others_follow(kind):
    queue = Queue(kind)
    sessions, stats = sessions_over(queue)
    requests = [start(sessions, "s", kind) for _ in range(4)]
    await turn()
    assert [only for only, _ in queue.parked] == [None]  # one chooser; three follow it
    assert sessions.following == 3
    queue.admit("x")
    await turn()
    assert sessions.pinned("s") == "x" and sessions.following == 0
    assert [only for only, _ in queue.parked] == ["x"] * 3  # all on the chosen exit
    for _ in range(3):
        queue.admit("x", pinned="x")
    await turn()
    assert {(await outcome(r)).exit_id for r in requests} == {"x"}
    assert stats.values == {}


@pytest.mark.parametrize("kind", ["future", "deferred"])
@pytest_twisted.ensureDeferred
async def test_followers_fail_as_their_chooser_did(kind):
    queue = Queue(kind)
    sessions, _ = sessions_over(queue)
    requests = [start(sessions, "s", kind) for _ in range(3)]
    await turn()
    queue.fail(HandedBack())
    await turn()
    for request in requests:
        with pytest.raises(HandedBack):
            await outcome(request)
    assert sessions.pinned("s") is None and not queue.parked


@pytest_twisted.ensureDeferred
async def test_a_chooser_failing_for_its_origin_leaves_other_origins_to_choose():
    queue = Queue("future")
    sessions, _ = sessions_over(queue)
    chooser = start(sessions, "s")
    other = asyncio.ensure_future(sessions.admit("http://other", "s"))
    await turn()
    queue.fail(ExitsUnavailable("every exit banned for http://o"))
    await turn()
    with pytest.raises(ExitsUnavailable):
        await outcome(chooser)
    assert [only for only, _ in queue.parked] == [None]  # the other origin's request chooses
    queue.admit("y")
    assert (await outcome(other)).exit_id == "y"


@pytest_twisted.ensureDeferred
async def test_a_cancelled_chooser_hands_the_choice_on():
    queue = Queue("future")
    sessions, _ = sessions_over(queue)
    chooser, follower = start(sessions, "s"), start(sessions, "s")
    await turn()
    chooser.cancel()
    await turn()
    assert [only for only, _ in queue.parked[-1:]] == [None]  # the follower chooses now
    queue.parked = [p for p in queue.parked if not p[1].done()]
    queue.admit("y")
    await turn()
    assert (await outcome(follower)).exit_id == "y" and sessions.pinned("s") == "y"


@pytest_twisted.ensureDeferred
async def test_a_session_leaves_a_bad_exit_once_and_its_parked_requests_follow():
    queue = Queue("future")
    sessions, stats = sessions_over(queue)
    first = start(sessions, "s")
    await turn()
    queue.admit("x")
    await outcome(first)
    parked = [start(sessions, "s") for _ in range(3)]
    await turn()
    assert [only for only, _ in queue.parked] == ["x"] * 3
    queue.bad.add("x")  # banned while they wait: the middleware fails them with Repin
    queue.fail(Repin(), pinned="x")
    await turn()
    assert [only for only, _ in queue.parked] == [None]  # one chooses again
    queue.admit("y")
    await turn()
    for _ in range(2):
        queue.admit("y", pinned="y")
    await turn()
    assert {(await outcome(r)).exit_id for r in parked} == {"y"}
    assert stats.values == {"exitlimit/session_repinned": 1}  # once per session


# -- crawls ---------------------------------------------------------------------------
class SessionSpider(scrapy.Spider):
    """Pages for two sticky sessions, alternating; records which exit served each."""

    name = "sessions"

    def __init__(self, base, pages, **kw):
        super().__init__(**kw)
        self.base, self.pages = base, int(pages)
        self.served: dict[str, list[str]] = {"a": [], "b": []}
        self.failed: list[str] = []

    async def start(self):
        for i in range(self.pages):
            session = "ab"[i % 2]
            yield scrapy.Request(f"{self.base}/page/{i}", meta={"exitlimit_session": session},
                                 callback=self.parse, errback=self.error, dont_filter=True)

    def parse(self, response):
        self.served[response.meta["exitlimit_session"]].append(response.meta["exitlimit_exit"])

    def error(self, failure):
        self.failed.append(repr(failure.value))


@pytest_twisted.ensureDeferred
async def test_sticky_sessions_stay_on_their_exit():
    lab = Lab(exits=4, origin=OriginConfig(rate=20))
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 18}, 24, SessionSpider)
    spider = crawler.spider
    assert not spider.failed
    assert len(spider.served["a"]) == len(spider.served["b"]) == 12
    assert len(set(spider.served["a"])) == 1 and len(set(spider.served["b"])) == 1
    # 18 r/s under 20: none, but the rare 429 CALLBACK_DELAY describes (CI on 2.13: 2)
    assert lab.origin.total(429) <= (2 if CALLBACK_DELAY else 0)


@pytest_twisted.ensureDeferred
async def test_a_banned_session_is_repinned_and_loses_nothing():
    lab = Lab(exits=2, origin=OriginConfig(rate=20, per_ip={"127.0.0.10": IPRule(ban=True)}))
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 18}, 12, SessionSpider)
    spider, stats = crawler.spider, crawler.stats.get_stats()
    assert not spider.failed
    served = spider.served["a"] + spider.served["b"]
    assert len(served) == 12
    assert len(set(served)) == 1  # every page ended on the healthy exit
    assert stats["exitlimit/ban"] >= 1
    assert stats["exitlimit/session_repinned"] >= 1


class RebindSpider(scrapy.Spider):
    name = "rebind"

    def __init__(self, base, pages, lab, **kw):
        super().__init__(**kw)
        self.base, self.pages, self.lab = base, int(pages), lab
        self.ok = 0

    async def start(self):
        for i in range(self.pages):
            yield scrapy.Request(f"{self.base}/page/{i}", callback=self.parse)

    def parse(self, response):
        self.ok += 1
        if self.ok == self.pages // 2:  # the provider swaps the IP behind the exit
            self.lab.proxies[0].rebind("127.0.0.50")


@pytest_twisted.ensureDeferred
async def test_pair_state_follows_the_exit_ip_the_provider_reports():
    lab = Lab(exits=1, origin=OriginConfig(rate=20),
              proxy_kwargs={0: {"exit_ip_header": "X-Exit-IP"}})
    await lab.start()
    origin = lab.origin_url
    try:
        crawler = get_crawler(RebindSpider, {**QUIET, "EXITLIMIT_EXITS": lab.exit_urls,
                                             "EXITLIMIT_RATE": 18,
                                             "EXITLIMIT_EXIT_IP_HEADER": "X-Exit-IP"})
        await crawler.crawl(base=lab.origin_url, pages=20, lab=lab)
    finally:
        await lab.stop()
    assert crawler.spider.ok == 20
    mw = crawler.exitlimit
    (exit_id,) = mw.exits
    assert mw.backend.limiter.exit_ips[exit_id] == "127.0.0.50"
    assert set(mw.backend.limiter.origin_state(origin).pairs) >= {"127.0.0.10", "127.0.0.50"}
    assert crawler.stats.get_value("exitlimit/exit_ip_changed") == 2  # unknown->old, old->new
    assert set(lab.origin.ips()) == {"127.0.0.10", "127.0.0.50"}
    assert lab.origin.total(429) == 0


class ManySessionsSpider(scrapy.Spider):
    """``sessions`` sticky sessions of ``per_session`` requests each, all yielded at once,
    interleaved (so most of them park before their session is pinned anywhere)."""

    name = "many_sessions"

    def __init__(self, base, pages, sessions=8, **kw):
        super().__init__(**kw)
        self.base, self.pages, self.sessions = base, int(pages), int(sessions)
        self.served: dict[str, list[str]] = {}
        self.failed: list[str] = []

    async def start(self):
        for i in range(self.pages):
            session = f"s{i % self.sessions}"
            yield scrapy.Request(f"{self.base}/page/{i}", meta={"exitlimit_session": session},
                                 callback=self.parse, errback=self.error, dont_filter=True)

    def parse(self, response):
        self.served.setdefault(response.meta["exitlimit_session"], []).append(
            response.meta["exitlimit_exit"])

    def error(self, failure):
        self.failed.append(repr(failure.value))


@pytest_twisted.ensureDeferred
async def test_sessions_parked_before_their_pin_follow_it():
    # 8 sessions x 10 requests at once over 4 exits: half the sessions' first requests
    # park, and every later request of theirs parks before the session is pinned
    lab = Lab(exits=4, origin=OriginConfig(rate=40))
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 30}, 80, ManySessionsSpider)
    spider, stats = crawler.spider, crawler.stats.get_stats()
    assert not spider.failed
    assert sorted(len(v) for v in spider.served.values()) == [10] * 8
    exits_per_session = {s: len(set(v)) for s, v in spider.served.items()}
    assert exits_per_session == dict.fromkeys(spider.served, 1), spider.served
    assert stats.get("exitlimit/session_repinned", 0) == 0
    # paced at 30 of the origin's 40 r/s: on a loaded machine a delayed connection can
    # still land two requests close together now and then (re-issued on the same pin)
    assert lab.origin.total(429) <= 2
