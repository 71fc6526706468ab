"""Sticky sessions and exit-IP resolution: in the pure core, and in real crawls."""

from __future__ import annotations

import pytest_twisted
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_exitlimit.core import Lease, Limiter, Limits, make_exit
from scrapy_exitlimit.lab import IPRule, Lab, OriginConfig
from scrapy_exitlimit.middleware import exit_ip

from .conftest import FakeClock
from .crawling import QUIET, crawl_lab

ORIGIN = "http://o"


def limiter(n=2, rate=10.0, clock=None):
    exits = [make_exit(f"http://127.0.0.{10 + i}:3128") for i in range(n)]
    return Limiter(exits, Limits(rate=rate, burst=1), clock=clock or FakeClock()), exits


# -- pure core ---------------------------------------------------------------------
def test_only_admits_on_the_named_exit_or_answers_when():
    clock = FakeClock()
    lim, exits = limiter(clock=clock)
    a = exits[0].id
    first = lim.try_admit(ORIGIN, only=a)
    assert isinstance(first, Lease) and first.exit_id == a
    lim.release(first.id)  # answered: a's next token is one interval on
    # a's token is spent; b is free, but a pinned request waits for a
    assert lim.try_admit(ORIGIN, only=a) == clock.now + 0.1 + lim.tuning.margin
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
    events = lim.exit_ip_seen(a, "10.0.0.2")  # the provider swapped the IP behind it
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
    assert lab.origin.total(429) == 0


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
    assert mw.limiter.exit_ips[exit_id] == "127.0.0.50"
    assert set(mw.limiter.origin_state(origin).pairs) >= {"127.0.0.10", "127.0.0.50"}
    assert crawler.stats.get_value("exitlimit/exit_ip_changed") == 2  # unknown->old, old->new
    assert set(lab.origin.ips()) == {"127.0.0.10", "127.0.0.50"}
    assert lab.origin.total(429) == 0
