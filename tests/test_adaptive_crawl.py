"""Adaptive control in real crawls through the lab: learned limits, bans, dead proxies, 503s."""

from __future__ import annotations

import pytest_twisted

from scrapy_exitlimit.lab import IPRule, Lab, OriginConfig
from scrapy_exitlimit.middleware import CLOSE_REASON_NO_EXITS, ExitLimitMiddleware
from scrapy_exitlimit.policy import ResponsePolicy

from .crawling import CALLBACK_DELAY, crawl_lab


def middleware(crawler) -> ExitLimitMiddleware:
    return next(m for m in crawler.engine.downloader.middleware.middlewares
                if isinstance(m, ExitLimitMiddleware))


@pytest_twisted.ensureDeferred
async def test_learns_an_unknown_limit_without_losing_pages():
    lab = Lab(exits=3, origin=OriginConfig(rate=10, burst=1))
    crawler = await crawl_lab(lab, {"EXITLIMIT_START_RATE": 4}, 90)
    stats = crawler.stats.get_stats()
    assert len(crawler.spider.ok) == 90 and not crawler.spider.failed
    assert stats.get("exitlimit/reissued", 0) == lab.origin.total(429)
    # the pool paid for the discovery a few times (2-3), not on every exit all along. On a
    # starved CPU one clean answer can confirm a rate just over the limit (that request
    # left later after its admission than the one before it), and every exit then draws
    # a 429 at each cooldown's end until the pool halves: 7-9 in 7 of ~95 runs beside two
    # busy loops (Scrapy 2.13), once in CI. Learning nothing draws dozens.
    assert lab.origin.total(429) <= 9
    assert stats["exitlimit/rate_up"] >= 1
    learned = middleware(crawler).backend.limiter.origin_state(crawler.origin).estimate
    # what reaches the server: 1/lo apart plus the safety margin (EXITLIMIT_SAFETY_MARGIN)
    assert 7.0 <= 1 / (1 / learned.lo + 0.005) <= 10.5


@pytest_twisted.ensureDeferred
async def test_a_banned_exit_and_a_dead_proxy_cost_no_page():
    lab = Lab(exits=3, dead_exits=1, origin=OriginConfig(
        rate=None, per_ip={"127.0.0.12": IPRule(ban=True)}))
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 30, "EXITLIMIT_EVICT_AFTER": 2}, 40)
    stats = crawler.stats.get_stats()
    assert len(crawler.spider.ok) == 40 and not crawler.spider.failed
    # banned for this origin after one 403: the exit is not asked again
    assert lab.origin.stats()["ips"]["127.0.0.12"]["status"]["403"] == 1
    assert stats["exitlimit/ban"] == stats["exitlimit/pair_banned"] == 1
    assert stats["exitlimit/proxy_fault"] >= 2 and stats["exitlimit/evicted"] >= 1
    assert stats["exitlimit/reissued/banned"] == 1
    assert stats["exitlimit/reissued/proxy_fault"] == stats["exitlimit/proxy_fault"]


@pytest_twisted.ensureDeferred
async def test_an_overloaded_origin_is_slowed_as_a_whole():
    # each IP may go fast, but the origin as a whole takes only 15 r/s and answers 503
    lab = Lab(exits=3, origin=OriginConfig(rate=None, origin_rate=15, origin_status=503,
                                           retry_after=1))
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 20}, 30)
    stats = crawler.stats.get_stats()
    assert len(crawler.spider.ok) == 30 and not crawler.spider.failed
    assert stats["exitlimit/overload"] == lab.origin.total(503) >= 1
    assert stats["exitlimit/origin_slowed"] >= 1
    budget = middleware(crawler).backend.limiter.origin_state(crawler.origin).budget.bucket
    assert budget is not None and budget.rate < 60
    assert lab.origin.total(503) <= 10


@pytest_twisted.ensureDeferred
async def test_ratelimit_headers_pace_the_pool_before_any_429():
    lab = Lab(exits=2, origin=OriginConfig(rate=10, burst=1, ratelimit_headers=True))
    crawler = await crawl_lab(lab, {}, 50)
    assert len(crawler.spider.ok) == 50
    # seen on 2.13.4: 2 to 5; on 2.18+ none, but once 1 in CI: the lab shares our event
    # loop, and a stall of over the 5 ms margin lands two requests too close. Learning
    # without the headers draws at least 2 here (slow start past 10 r/s, then the check)
    assert lab.origin.total(429) <= (5 if CALLBACK_DELAY else 1)
    assert crawler.stats.get_value("exitlimit/rate_announced") >= 1


@pytest_twisted.ensureDeferred
async def test_a_slow_exit_carries_less():
    lab = Lab(exits=3, origin=OriginConfig(rate=None, per_ip={"127.0.0.10": IPRule(latency=0.3)}))
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 200}, 90)
    ips = lab.origin.stats()["ips"]
    assert len(crawler.spider.ok) == 90
    assert ips["127.0.0.10"]["accepted"] < ips["127.0.0.11"]["accepted"] / 2


@pytest_twisted.ensureDeferred
async def test_when_every_exit_is_banned_requests_fail_visibly_after_the_stall_timeout():
    lab = Lab(exits=2, origin=OriginConfig(rate=None, per_ip={
        "127.0.0.10": IPRule(ban=True), "127.0.0.11": IPRule(ban=True)}))
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 50, "EXITLIMIT_STALL_TIMEOUT": 0.5}, 5)
    spider, stats = crawler.spider, crawler.stats.get_stats()
    assert not spider.ok and len(spider.failed) == 5
    assert all("ExitsUnavailable" in reason for reason in spider.failed.values())
    assert stats["exitlimit/stalled"] + stats.get("exitlimit/gave_up", 0) >= 5 - 2


@pytest_twisted.ensureDeferred
async def test_a_dead_pool_closes_the_spider_with_a_documented_reason():
    lab = Lab(exits=0, dead_exits=2)
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 50, "EXITLIMIT_STALL_TIMEOUT": 0.5,
                              "EXITLIMIT_EVICT_AFTER": 1, "EXITLIMIT_REANIMATE_AFTER": 60}, 5)
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == CLOSE_REASON_NO_EXITS
    assert stats["exitlimit/evicted"] == 2
    # every page accounted for: failed visibly or handed back to the scheduler
    handed = stats.get("exitlimit/requeued_on_close", 0)
    assert len(crawler.spider.failed) + handed == 5


class NoFirstExitPolicy(ResponsePolicy):
    """A user's block-page hook: pages served to 127.0.0.10 count as blocked."""

    def is_block_page(self, request, response):
        return b"127.0.0.10" in response.body or super().is_block_page(request, response)


@pytest_twisted.ensureDeferred
async def test_a_custom_policy_hooks_in_its_own_block_page_detector():
    lab = Lab(exits=3, origin=OriginConfig(rate=None))
    crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 50,
                                    "EXITLIMIT_POLICY": NoFirstExitPolicy}, 20)
    stats = crawler.stats.get_stats()
    assert len(crawler.spider.ok) == 20 and not crawler.spider.failed
    assert stats["exitlimit/ban"] == stats["exitlimit/pair_banned"] == 1
    assert lab.origin.stats()["ips"]["127.0.0.10"]["accepted"] == 1  # asked once, then banned
