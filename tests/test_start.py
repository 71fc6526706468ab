"""Start requests read in slices: the event loop gets its turns while a long list is read."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest_twisted

from scrapy_exitlimit.addon import START_MIDDLEWARE
from scrapy_exitlimit.lab import Lab, OriginConfig
from scrapy_exitlimit.lab.spider import PagesSpider
from scrapy_exitlimit.start import CooperativeStartMiddleware

from .conftest import FakeClock
from .crawling import crawl_lab


async def _items(clock: FakeClock, n: int, cost: int):
    for i in range(n):
        clock.advance(cost)  # making each one takes ``cost`` (whole ms: exact arithmetic)
        yield i


@pytest_twisted.ensureDeferred
async def test_every_start_request_passes_in_order_and_the_loop_gets_a_turn_per_slice():
    clock = FakeClock(start=0)  # in ms
    paused_after: list[int] = []
    out: list[int] = []

    async def pause() -> None:
        paused_after.append(out[-1])

    mw = CooperativeStartMiddleware(clock=clock, pause=pause, slice_seconds=5)
    async for i in mw.process_start(_items(clock, 23, 1)):
        out.append(i)
    assert out == list(range(23))
    # 1 ms each: a turn after every fifth (items 0-4 took 5 ms, 5-9 the next 5, ...)
    assert paused_after == [4, 9, 14, 19] and mw.pauses == 4


@pytest_twisted.ensureDeferred
async def test_cheap_start_requests_read_within_one_slice_never_pause():
    clock = FakeClock(start=0)  # in ms

    async def pause() -> None:
        raise AssertionError("no turn needed")

    mw = CooperativeStartMiddleware(clock=clock, pause=pause, slice_seconds=5)
    assert [i async for i in mw.process_start(_items(clock, 4, 1))] == [0, 1, 2, 3]


@pytest_twisted.ensureDeferred
async def test_no_turn_is_added_while_scrapy_waits_for_one_before_each_read():
    clock = FakeClock(start=0)  # in ms
    eager = [False] * 12 + [True] * 11  # the downloader fills after the 12th

    async def pause() -> None:
        pass

    out: list[int] = []
    mw = CooperativeStartMiddleware(clock=clock, pause=pause, slice_seconds=5,
                                    reads_at_once=lambda: eager[out[-1]])
    async for i in mw.process_start(_items(clock, 23, 1)):
        out.append(i)
    assert out == list(range(23))
    # read lazily, 12 ms went by without a turn added; at once, one every 5 ms
    assert mw.pauses == 2


class SlowStartSpider(PagesSpider):
    """A start list that takes a while to read (0.8 ms a request, 0.24 s for 300), as a
    long one does; with its requests parked and Scrapy's downloader full (from about the
    40th on), Scrapy reads the rest in one go. ``max_lag``: the longest the event loop
    went without a turn while the list was read."""

    name = "slow-start"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_by = None
        self.max_lag = 0.0
        self._tick_at = 0.0

    def _tick(self) -> None:
        now = time.monotonic()
        self.max_lag = max(self.max_lag, now - self._tick_at)
        self._tick_at = now
        if self.read_by is None:
            asyncio.get_running_loop().call_later(0.001, self._tick)

    async def start(self):
        self._tick_at = time.monotonic()
        self._tick()
        async for request in super().start():
            until = time.perf_counter() + 0.0008
            while time.perf_counter() < until:
                pass
            yield request
        self.read_by = time.monotonic()
        self._tick()


@pytest_twisted.ensureDeferred
async def test_the_event_loop_gets_its_turns_while_a_long_start_list_is_read():
    # (no garbage collection meanwhile: late in a full run, one over the test process's
    # heap held the loop 0.07-0.2 s, which is not what this measures)
    settings = {"LOG_LEVEL": "WARNING"}
    gc.collect()
    gc.disable()
    try:
        crawler = await crawl_lab(Lab(exits=3, origin=OriginConfig(rate=None)), settings,
                                  300, SlowStartSpider)
        spider = crawler.spider
        assert len(spider.ok) == 300 and not spider.failed
        assert spider.max_lag < 0.08
        # without it, Scrapy reads the last ~260 in one go (the check can fail)
        crawler = await crawl_lab(Lab(exits=3, origin=OriginConfig(rate=None)),
                                  {**settings, "SPIDER_MIDDLEWARES": {START_MIDDLEWARE: None}},
                                  300, SlowStartSpider)
        spider = crawler.spider
        assert len(spider.ok) == 300 and spider.max_lag > 0.15
    finally:
        gc.enable()
