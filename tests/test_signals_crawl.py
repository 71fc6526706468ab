"""Issue 16's signals in real crawls through the lab: one 503, a RateLimit-Policy that
overstates the limit or tells the truth, and a fixed window stated only in X-RateLimit-*.

Each crawl is a few seconds long; bench/run.py's overload-503 and header-* scenarios are
the full-size measurements (docs/benchmarks.md).
"""

from __future__ import annotations

import pytest
import pytest_twisted

from scrapy_exitlimit.lab import Lab, OriginConfig, ScheduledAnswer
from scrapy_exitlimit.middleware import ExitLimitMiddleware

from .crawling import CALLBACK_DELAY, crawl_lab


def middleware(crawler) -> ExitLimitMiddleware:
    return next(m for m in crawler.engine.downloader.middleware.middlewares
                if isinstance(m, ExitLimitMiddleware))


def all_events(lab: Lab) -> list[tuple[float, int]]:
    return sorted(e for ip in lab.origin.ips() for e in lab.origin.events(ip))


def share_429(lab: Lab) -> float:
    return lab.origin.total(429) / lab.origin.total()


@pytest_twisted.ensureDeferred
async def test_one_503_pauses_the_whole_origin_for_its_retry_after_and_loses_nothing():
    # 2 exits x 10 r/s, known: 20 r/s; 2 s in, one 503 with Retry-After 1. The origin
    # allows 50 % more per IP (the lab shares our event loop and its stamps jitter). On
    # Scrapy < 2.18 CI drew one 429 at exactly the limit, two at 10 % more, one at 20 %
    # and two at 50 %: not a matter of room, but the rare 429 CALLBACK_DELAY describes;
    # none on 2.18 and later, none in 25 runs here on 2.13.4 with both cores kept busy.
    # The premise is a crawl in full swing when the 503 comes: 8 or more pages in the
    # second before it. A CI run on 2.13 saw none there (the lab shares our event loop,
    # and that loop froze for over a second); a run whose premise fails is run again,
    # twice at most
    for _attempt in range(3):
        lab = Lab(exits=2, origin=OriginConfig(
            rate=15, status_at=[ScheduledAnswer(2.0, 503, retry_after=1)]))
        crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 10}, 80)
        events = all_events(lab)
        at = next(t for t, status in events if status == 503)
        second_before = [t for t, status in events if status == 200 and at - 1.0 <= t < at]
        if len(second_before) >= 8:
            break
    assert len(second_before) >= 8
    stats = crawler.stats.get_stats()
    assert len(crawler.spider.ok) == 80 and not crawler.spider.failed
    assert lab.origin.total(503) == 1
    assert lab.origin.total(429) <= (2 if CALLBACK_DELAY else 0)
    assert stats["exitlimit/overload"] == stats["exitlimit/origin_slowed"] == 1
    assert stats["exitlimit/reissued"] == 1 + lab.origin.total(429)  # each page again
    # requests already on their way when the 503 was sent may still arrive; then none
    # on any exit until the Retry-After is over
    assert not [t for t, _ in events if at + 0.1 < t < at + 0.95]
    # ... and after it, not starved: the budget restarts at half the rate admitted over
    # the last second before the 503 (20 r/s: 10; divided by the crawl's age, 2 s, it was
    # 5), holds that for a second, then grows back. Counted against what the origin saw
    # in that second, not against 20: a CI run on 2.13 whose crawl started slow saw 12
    # there, and restarted at 6
    first_second = [t for t, status in events if status == 200 and at + 1.1 <= t < at + 2.1]
    assert 0.35 * len(second_before) <= len(first_second) <= 0.6 * len(second_before) + 1


@pytest_twisted.ensureDeferred
async def test_a_policy_overstating_the_limit_gives_way_to_the_answers():
    # every answer says 20 r/s; each of 4 IPs really gets 4 (learned mode)
    lab = Lab(exits=4, origin=OriginConfig(rate=4, announce_policy="20;w=1"))
    crawler = await crawl_lab(lab, {}, 80)
    stats = crawler.stats.get_stats()
    assert len(crawler.spider.ok) == 80 and not crawler.spider.failed
    assert stats["exitlimit/announcement_wrong"] == 4  # once per pair, then ignored
    pairs = middleware(crawler).backend.limiter.origin_state(crawler.origin).pairs.values()
    assert all(p.learning.announced is None and p.learning.distrusted == 20.0 for p in pairs)
    # every pair back on the pool's rate, found by one scout for all: 8 429s of 88
    # requests here, 11 of 91 on Scrapy 2.13 (each pair bisecting down from 20 r/s alone
    # drew 16 of 96: 0.167)
    assert all(p.own_limit is None for p in pairs)
    assert share_429(lab) <= 0.14


@pytest_twisted.ensureDeferred
async def test_an_honest_policy_paces_from_the_first_answer_without_a_429():
    # it states 5 r/s per IP and allows 10 % more (the lab shares our event loop: pacing
    # at exactly its limit is measured in bench/, in separate processes)
    lab = Lab(exits=2, origin=OriginConfig(rate=5.5, announce_policy="5;w=1"))
    crawler = await crawl_lab(lab, {}, 40)
    assert len(crawler.spider.ok) == 40 and not crawler.spider.failed
    assert lab.origin.total(429) == 0
    assert crawler.stats.get_value("exitlimit/rate_announced") == 2  # once per pair


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("form", ["seconds", "epoch"])
async def test_a_fixed_window_stated_in_x_ratelimit_headers_paces_the_crawl(form):
    # no per-IP rate: 4 per 1 s per IP, a window opening with the first request after
    # the last one closed, stated as X-RateLimit-Limit/-Remaining/-Reset
    lab = Lab(exits=2, origin=OriginConfig(rate=None, window_limit=4, window=1.0,
                                           window_reset=form))
    crawler = await crawl_lab(lab, {}, 48)
    assert len(crawler.spider.ok) == 48 and not crawler.spider.failed
    # the answer to the request that opened a window states a reset one window away:
    # the pair paces at limit / window from then on (an epoch reset, a whole second,
    # reads a 1 s window as up to 2 s; the shortest reading, rounded, is the window)
    assert crawler.stats.get_value("exitlimit/rate_announced") >= 2
    pairs = middleware(crawler).backend.limiter.origin_state(crawler.origin).pairs.values()
    assert [p.learning.announced for p in pairs] == [4.0, 4.0]
    assert lab.origin.total(429) <= 4
    # 8 r/s for 48 pages; at half the limit (a 2 s reading kept) it would take 6 s more
    assert crawler.spider.crawl_seconds <= 9.0
