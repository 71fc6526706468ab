"""The downloader held to what is in flight and a little room while the CPU is full
(``room.py``): the arithmetic, and a real crawl through the lab."""

from __future__ import annotations

from types import SimpleNamespace

import pytest_twisted

from scrapy_exitlimit.addon import PARKING_ROOM
from scrapy_exitlimit.lab import Lab, OriginConfig
from scrapy_exitlimit.lab.spider import PagesSpider
from scrapy_exitlimit.room import DownloaderRoom, narrowed_total

from .crawling import cpu_reads_busy, crawl_lab


def test_with_cpu_to_spare_the_downloader_holds_concurrent_requests():
    assert narrowed_total(96, busy=False, held=92, parked=86) == 96
    assert narrowed_total(0, busy=False, held=92, parked=86) == 0  # 0: no limit (2.18+)


def test_cpu_bound_it_holds_what_is_in_flight_and_the_room():
    # 92 held, 86 of them parked here: 6 past this middleware, and the room
    assert narrowed_total(96, busy=True, held=92, parked=86) == 6 + PARKING_ROOM
    assert narrowed_total(96, busy=True, held=92, parked=86, room=4) == 10
    assert narrowed_total(96, busy=True, held=92, parked=86, room=4, queues=3) == 18  # each
    assert narrowed_total(0, busy=True, held=30, parked=0, room=4) == 34  # no limit: one now


def test_it_never_holds_more_than_concurrent_requests_nor_leaves_no_room():
    assert narrowed_total(20, busy=True, held=19, parked=0) == 20  # 19 + 16 > 20
    # sticky followers are parked but not in the downloader: never below the room
    assert narrowed_total(96, busy=True, held=3, parked=5, room=4) == 4
    assert narrowed_total(96, busy=True, held=0, parked=0, room=0) == 1


class _Crawler:
    """A crawler's engine and downloader, as far as DownloaderRoom reads and writes them."""

    def __init__(self, total: int) -> None:
        downloader = SimpleNamespace(active=set(), total_concurrency=total)
        self.engine = SimpleNamespace(downloader=downloader)

    @property
    def downloader(self):
        return self.engine.downloader

    def hold(self, n: int) -> None:
        self.downloader.active = set(range(n))


def test_the_room_narrows_follows_what_is_in_flight_and_widens_again():
    crawler = _Crawler(total=96)
    room = DownloaderRoom(crawler, room=10)
    crawler.hold(90)
    room.update(busy=False, parked=80)
    assert crawler.downloader.total_concurrency == 96 and room.narrowings == 0
    room.update(busy=True, parked=80)
    assert crawler.downloader.total_concurrency == 20 and room.narrowings == 1
    crawler.hold(30)
    room.update(busy=True, parked=15)  # more in flight (exits took more): wider, still narrowed
    assert crawler.downloader.total_concurrency == 25 and room.narrowings == 1
    room.update(busy=False, parked=15)
    assert crawler.downloader.total_concurrency == 96
    room.update(busy=True, parked=25)
    assert crawler.downloader.total_concurrency == 15 and room.narrowings == 2
    room.restore()
    assert crawler.downloader.total_concurrency == 96


def test_the_room_keeps_what_concurrent_requests_was_not_what_it_set():
    crawler = _Crawler(total=40)
    room = DownloaderRoom(crawler, room=5)
    crawler.hold(40)
    room.update(busy=True, parked=38)
    assert crawler.downloader.total_concurrency == 7
    room.update(busy=True, parked=0)  # 40 in flight + 5: capped by the 40 configured
    assert crawler.downloader.total_concurrency == 40
    room.restore()
    assert crawler.downloader.total_concurrency == 40 and room.configured == 40


def test_without_an_engine_nothing_is_read_or_set():
    crawler = SimpleNamespace(engine=None)
    room = DownloaderRoom(crawler)
    room.update(busy=True, parked=3)
    room.restore()
    assert room.configured is None and room.narrowings == 0


class _WatchingSpider(PagesSpider):
    """Records, at every answer, how many requests the downloader may hold."""

    totals: list[int]

    def parse(self, response):
        self.totals.append(self.crawler.engine.downloader.total_concurrency)
        yield from super().parse(response)


@pytest_twisted.ensureDeferred
async def test_a_cpu_bound_crawl_waits_in_the_scheduler_and_loses_nothing(monkeypatch):
    """Busy, the downloader holds what is in flight and the room, below the 32 the add-on
    sized (2 exits x 8 + 16); every page still arrives, and CONCURRENT_REQUESTS holds
    again at the end. With CPU to spare it is never narrowed."""
    seen = {}
    for busy in (False, True):
        cpu_reads_busy(monkeypatch, busy)
        _WatchingSpider.totals = []
        lab = Lab(exits=2, origin=OriginConfig(rate=None, latency=0.05))
        crawler = await crawl_lab(lab, {"EXITLIMIT_RATE": 1000}, 60, _WatchingSpider)
        assert len(crawler.spider.ok) == 60 and not crawler.spider.failed
        configured = crawler.settings.getint("CONCURRENT_REQUESTS")
        assert configured == 2 * 8 + PARKING_ROOM
        seen[busy] = (set(_WatchingSpider.totals), configured,
                      crawler.stats.get_value("exitlimit/downloader_narrowed", 0),
                      crawler.engine.downloader.total_concurrency if crawler.engine else None)
    totals, configured, narrowed, _ = seen[False]
    assert totals == {configured} and narrowed == 0
    totals, configured, narrowed, end = seen[True]
    assert min(totals) <= 2 * 2 + PARKING_ROOM and narrowed >= 1  # 2 exits, 2 each at most
    assert end in (None, configured)  # restored (when the engine is still there to ask)
