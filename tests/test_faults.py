"""Faults on the wire, through real crawls: every page is downloaded or fails visibly, and
nothing hangs.

The guarantee checked by every crawl here (``assert_accounted``): ``ok + failed == pages``,
each failure has a reason in ``spider.failed`` and a stat and a warning saying why, and the
crawl ends with ``finish_reason == "finished"`` well before its ``CLOSESPIDER_TIMEOUT``
safety net.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import threads

from scrapy_exitlimit.lab import ForwardProxy, Lab, OriginConfig
from scrapy_exitlimit.lab.__main__ import build_lab, lab_faults, parse_args

from .crawling import crawl_lab

#: a crawl that runs into this closes with "closespider_timeout": the test fails, never hangs
SAFETY_NET = 12.0
FAST = {
    "EXITLIMIT_RATE": 100,
    "DOWNLOAD_TIMEOUT": 1,
    "CLOSESPIDER_TIMEOUT": SAFETY_NET,
    "EXITLIMIT_REANIMATE_AFTER": 60,  # an evicted exit stays out for the whole test
}


async def crawl_faulty(lab: Lab, pages: int, **settings: Any):
    started = time.monotonic()
    crawler = await crawl_lab(lab, {**FAST, **settings}, pages)
    crawler.took = time.monotonic() - started
    return crawler


def assert_accounted(crawler, pages: int, caplog, bound: float = 5.0,
                     reason: str = "finished") -> dict[str, Any]:
    """Every page downloaded or failed with a visible reason; finished in time."""
    spider, stats = crawler.spider, crawler.stats.get_stats()
    assert stats["finish_reason"] == reason, stats
    assert crawler.took < bound, crawler.took
    assert len(spider.ok) + len(spider.failed) == pages, (len(spider.ok), spider.failed)
    assert not set(spider.ok) & set(spider.failed)
    assert all(spider.failed.values())
    gave_up = stats.get("exitlimit/gave_up", 0)
    # a failure the limiter passed on is counted and logged as such; anything else it did
    # not handle is Scrapy's (download errors, RetryMiddleware) and counted there
    other = stats.get("retry/max_reached", 0) + stats.get("exitlimit/stalled", 0)
    assert len(spider.failed) <= gave_up + other, (spider.failed, stats)
    warned = [r for r in caplog.records if "gave up on" in r.getMessage()]
    assert len(warned) == gave_up
    return stats


# -- the lab's faults, one at a time (no crawler) -------------------------------------


def _get(proxy_port: int, url: str, timeout: float = 2.0) -> bytes:
    """Blocking GET through a proxy on a fresh connection; everything read until EOF."""
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=timeout) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % url.encode())
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            data += b"<RST>"
        except TimeoutError:
            data += b"<TIMEOUT>"
        return data


@pytest_twisted.ensureDeferred
async def test_lab_proxy_faults_reset_fail_and_blackhole():
    lab = Lab(exits=4, origin=OriginConfig(rate=None), proxy_kwargs={
        0: {"reset_every": 2}, 1: {"fail_status": 407}, 2: {"fail_status": 502},
        3: {"blackhole": True}})
    await lab.start()
    try:
        ports = [p.port for p in lab.proxies]
        url = lab.page_url(1)
        first, second = [await threads.deferToThread(_get, ports[0], url) for _ in range(2)]
        denied = await threads.deferToThread(_get, ports[1], url)
        bad = await threads.deferToThread(_get, ports[2], url)
        silent = await threads.deferToThread(_get, ports[3], url, 0.5)
    finally:
        await lab.stop()
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"</html>\n")
    # the 2nd response: the head announcing the whole body, half of it, then a reset
    head, _, part = second.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: 231" in head
    assert part == first.partition(b"\r\n\r\n")[2][:115] + b"<RST>"
    assert lab.proxies[0].resets == 1
    assert denied.startswith(b"HTTP/1.1 407") and b'Proxy-Authenticate: Basic' in denied
    assert bad.startswith(b"HTTP/1.1 502")
    assert silent == b"<TIMEOUT>" and lab.proxies[3].blackholed == 1
    # only the resetting exit reached the origin
    assert lab.origin.ips() == ["127.0.0.10"]


def test_lab_reset_probability_is_reproducible_from_its_seed():
    def draws(seed: int) -> list[bool]:
        proxy = ForwardProxy(reset_probability=0.3, seed=seed)
        return [proxy._should_reset() for _ in range(200)]

    assert draws(7) == draws(7) != draws(8)
    assert 30 <= sum(draws(7)) <= 90
    with pytest.raises(ValueError):
        ForwardProxy(reset_probability=1.5)
    with pytest.raises(ValueError):
        ForwardProxy(reset_every=0)


@pytest_twisted.ensureDeferred
async def test_lab_origin_stalls_chosen_pages_then_serves_them():
    lab = Lab(exits=1, origin=OriginConfig(rate=None, stall_paths=["/page/3"], stall_times=1))
    await lab.start()
    try:
        port = lab.proxies[0].port
        stalled = await threads.deferToThread(_get, port, lab.page_url(3), 0.5)
        served = await threads.deferToThread(_get, port, lab.page_url(3))
        other = await threads.deferToThread(_get, port, lab.page_url(4))
    finally:
        await lab.stop()
    assert stalled == b"<TIMEOUT>"
    assert served.startswith(b"HTTP/1.1 200") and other.startswith(b"HTTP/1.1 200")
    assert [(ip, path) for _, ip, path in lab.origin.stalled()] == [("127.0.0.10", "/page/3")]
    # a stall is no arrival: it consumed no token and is not in the per-IP counts
    assert lab.origin.total() == 2 and lab.origin.stats()["stalled"] == 1
    with pytest.raises(ValueError):
        OriginConfig(stall_fraction=2)


def test_lab_cli_builds_the_faults():
    args = parse_args(["--exits", "4", "--fail", "127.0.0.10=407", "127.0.0.11=502",
                       "--reset", "127.0.0.12=3", "--reset-probability", "127.0.0.12=0.5",
                       "--blackhole", "127.0.0.13", "--stall", "/page/1", "/page/2",
                       "--stall-fraction", "0.1", "--seed", "4"])
    lab = build_lab(args)
    assert lab_faults(lab) == {
        0: {"fail_status": 407}, 1: {"fail_status": 502},
        2: {"reset_every": 3, "reset_probability": 0.5}, 3: {"blackhole": True}}
    cfg = lab.origin.config
    assert cfg.stall_paths == {"/page/1", "/page/2"} and cfg.stall_fraction == 0.1
    assert cfg.stall_seed == 4
    with pytest.raises(ValueError, match="not the address of a live exit"):
        build_lab(parse_args(["--exits", "2", "--blackhole", "127.0.0.12"]))
    with pytest.raises(SystemExit):
        parse_args(["--fail", "127.0.0.10=99"])


# -- crawls through faulty exits ----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_resets_mid_response_on_one_of_three_exits_cost_no_page(caplog):
    lab = Lab(exits=3, origin=OriginConfig(rate=None), proxy_kwargs={1: {"reset_every": 2}})
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 30)
    stats = assert_accounted(crawler, 30, caplog)
    resets = lab.proxies[1].resets
    assert resets >= 1
    assert len(crawler.spider.ok) == 30
    # every cut-off answer was a proxy fault of that exit, and its page went out again
    assert stats["exitlimit/proxy_fault"] == resets
    assert stats["exitlimit/reissued/proxy_fault"] == resets
    assert "exitlimit/gave_up" not in stats


@pytest_twisted.ensureDeferred
async def test_random_resets_everywhere_with_a_small_budget_fail_visibly(caplog):
    kw = {"reset_probability": 0.4}
    lab = Lab(exits=3, origin=OriginConfig(rate=None),
              proxy_kwargs={i: {**kw, "seed": i} for i in range(3)})
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 30, EXITLIMIT_MAX_RETRIES=1,
                                     EXITLIMIT_EVICT_AFTER=1000)
    stats = assert_accounted(crawler, 30, caplog)
    failed = crawler.spider.failed
    resets = sum(p.resets for p in lab.proxies)
    assert stats["exitlimit/proxy_fault"] == resets
    # seeded: some pages lost both attempts; each is in the errback, counted and logged
    assert failed and len(failed) == stats["exitlimit/gave_up/proxy_fault"]
    assert stats["exitlimit/reissued"] + stats["exitlimit/gave_up"] == resets
    assert "retry/count" not in stats  # RetryMiddleware did not start them over


@pytest_twisted.ensureDeferred
async def test_a_407_exit_and_a_502_exit_are_evicted_and_the_healthy_ones_carry_the_crawl(
    caplog,
):
    lab = Lab(exits=4, origin=OriginConfig(rate=None),
              proxy_kwargs={0: {"fail_status": 407}, 1: {"fail_status": 502}})
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 40)
    stats = assert_accounted(crawler, 40, caplog)
    assert len(crawler.spider.ok) == 40
    faulty = lab.proxies[0].requests + lab.proxies[1].requests
    # evicted after 3 faults in a row; one more may have been in flight by then
    assert 1 <= lab.proxies[0].requests <= 4 and 1 <= lab.proxies[1].requests <= 4
    assert stats["exitlimit/proxy_fault"] == faulty == stats["exitlimit/reissued/proxy_fault"]
    assert stats["exitlimit/evicted"] >= 2
    # the origin only ever saw the healthy exits, and each page once
    assert lab.origin.ips() == ["127.0.0.12", "127.0.0.13"]
    assert lab.origin.total() == 40


@pytest_twisted.ensureDeferred
async def test_a_blackhole_exit_costs_timeouts_then_is_evicted(caplog):
    # 60 pages at 2 x 20 r/s: 1.5 s, long enough for three timeouts of 0.5 s in a row
    lab = Lab(exits=3, origin=OriginConfig(rate=None), proxy_kwargs={2: {"blackhole": True}})
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 60, EXITLIMIT_RATE=20, DOWNLOAD_TIMEOUT=0.5)
    stats = assert_accounted(crawler, 60, caplog)
    assert len(crawler.spider.ok) == 60
    swallowed = lab.proxies[2].blackholed
    assert stats["exitlimit/proxy_fault"] == swallowed == stats["exitlimit/reissued"]
    assert stats["exitlimit/evicted"] == 1 and 3 <= swallowed <= 4
    assert lab.origin.total() == 60 and "127.0.0.12" not in lab.origin.ips()


@pytest_twisted.ensureDeferred
async def test_pages_the_origin_stalls_once_are_reissued_and_downloaded(caplog):
    stall = {"/page/3", "/page/7"}
    lab = Lab(exits=3, origin=OriginConfig(rate=None, stall_paths=stall, stall_times=1))
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 12)
    stats = assert_accounted(crawler, 12, caplog)
    assert len(crawler.spider.ok) == 12
    assert sorted(path for _, _, path in lab.origin.stalled()) == sorted(stall)
    assert stats["exitlimit/reissued"] == 2


@pytest_twisted.ensureDeferred
async def test_pages_the_origin_always_stalls_fail_visibly_after_their_budget(caplog):
    stall = {"/page/3", "/page/7"}
    lab = Lab(exits=3, origin=OriginConfig(rate=None, stall_paths=stall))
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 12, EXITLIMIT_MAX_RETRIES=1)
    stats = assert_accounted(crawler, 12, caplog)
    spider = crawler.spider
    assert len(spider.ok) == 10
    assert sorted(u.rsplit("/page", 1)[1] for u in spider.failed) == ["/3", "/7"]
    assert all("Timeout" in reason for reason in spider.failed.values()), spider.failed
    assert stats["exitlimit/gave_up"] == 2 and len(lab.origin.stalled()) == 4


@pytest_twisted.ensureDeferred
async def test_an_origin_stalling_a_fraction_of_requests_loses_no_page(caplog):
    # a stall looks like a dead exit from here (a timeout): the pages go out again and
    # get through; several exits timing out on one origin while they get answers from it
    # blame the origin, so a healthy exit is not evicted for it
    lab = Lab(exits=3, origin=OriginConfig(rate=None, stall_fraction=0.25, stall_seed=1))
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 20, DOWNLOAD_TIMEOUT=0.5, EXITLIMIT_REANIMATE_AFTER=1)
    stats = assert_accounted(crawler, 20, caplog)
    stalled = len(lab.origin.stalled())
    assert stalled >= 1
    assert len(crawler.spider.ok) + stats.get("exitlimit/gave_up", 0) == 20
    assert stats["exitlimit/proxy_fault"] == stalled
    assert lab.origin.total(200) == len(crawler.spider.ok)
    assert stats["exitlimit/origin_timeout"] >= 1
    # only an exit with no answer yet can be taken for dead (its timeouts look like one)
    assert stats.get("exitlimit/evicted", 0) <= 1


@pytest_twisted.ensureDeferred
async def test_when_every_exit_fails_every_page_fails_visibly_and_the_spider_closes(caplog):
    lab = Lab(exits=3, origin=OriginConfig(rate=None), proxy_kwargs={
        0: {"fail_status": 407}, 1: {"fail_status": 502}, 2: {"blackhole": True}})
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 20, EXITLIMIT_STALL_TIMEOUT=1,
                                     DOWNLOAD_TIMEOUT=0.5)
    stats = assert_accounted(crawler, 20, caplog, reason="exitlimit_no_exits")
    failed = crawler.spider.failed
    assert not crawler.spider.ok and len(failed) == 20
    assert all(reason.startswith("ExitsUnavailable") for reason in failed.values()), failed
    assert stats["exitlimit/stalled"] == 20 and stats["exitlimit/evicted"] == 3
    assert any("no usable exit" in r.getMessage() for r in caplog.records)
    assert lab.origin.total() == 0


@pytest_twisted.ensureDeferred
async def test_a_truncated_answer_kept_by_fail_on_dataloss_false_is_a_proxy_fault(caplog):
    lab = Lab(exits=3, origin=OriginConfig(rate=None), proxy_kwargs={1: {"reset_every": 2}})
    with caplog.at_level(logging.WARNING):
        crawler = await crawl_faulty(lab, 30, DOWNLOAD_FAIL_ON_DATALOSS=False)
    stats = assert_accounted(crawler, 30, caplog)
    assert lab.proxies[1].resets >= 1
    assert stats.get("exitlimit/proxy_fault", 0) == lab.proxies[1].resets


def test_the_lab_spider_counts_a_cut_off_response_that_arrives_unwrapped():
    """Before Scrapy 2.15 a Twisted ResponseFailed reaches the errback as it is, with
    Twisted's own response (``code``, no ``status``): still a failure with a reason."""
    import scrapy
    from twisted.internet.error import ConnectionLost
    from twisted.python.failure import Failure
    from twisted.web.client import ResponseFailed

    from scrapy_exitlimit.lab.spider import PagesSpider

    class TwistedResponse:
        code = 200

    spider = PagesSpider(base="http://127.0.0.1:1", pages=2)
    for url, exc in [("http://127.0.0.1:1/page/0",
                      ResponseFailed([Failure(ConnectionLost())], TwistedResponse())),
                     ("http://127.0.0.1:1/page/1", ConnectionLost())]:
        failure = Failure(exc)
        failure.request = scrapy.Request(url)
        spider.error(failure)
    assert set(spider.failed) == {"http://127.0.0.1:1/page/0", "http://127.0.0.1:1/page/1"}
    assert "ResponseFailed" in spider.failed["http://127.0.0.1:1/page/0"]
