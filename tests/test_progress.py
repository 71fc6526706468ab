"""The periodic progress line."""

from __future__ import annotations

import logging

import pytest
import pytest_twisted
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler
from twisted.internet import reactor
from twisted.internet.task import deferLater

from scrapy_exitlimit.progress import ExitLimitProgress, Snapshot, format_progress

from .conftest import FakeClock


def test_format_progress_rates_per_minute_from_deltas():
    prev = Snapshot(admitted_total=1000, rate_limited_total=10)
    snap = Snapshot(exits_ready=8, exits_cooling=1, exits_banned=0, exits_dead=1,
                    admitted_total=1600, rate_limited_total=11, parked=14)
    assert format_progress(snap, prev, 30.0) == (
        "exitlimit: exits 8 ready, 1 cooling, 0 banned, 1 dead; "
        "admitted 1200/min, 429 2/min, parked 14")


def test_format_progress_first_line_counts_from_zero_and_never_negative():
    snap = Snapshot(exits_ready=2, admitted_total=30, rate_limited_total=1)
    assert "admitted 60/min, 429 2/min" in format_progress(snap, None, 30.0)
    # totals that went down (a restarted source) do not make negative rates
    assert "admitted 0/min" in format_progress(Snapshot(), snap, 30.0)
    assert "admitted 0/min" in format_progress(snap, None, 0.0)


class FakePool:
    def __init__(self) -> None:
        self.snap = Snapshot()

    def snapshot(self) -> Snapshot:
        return self.snap


def test_log_uses_the_crawlers_pool_and_the_elapsed_time(caplog):
    crawler = get_crawler(settings_dict={"LOGSTATS_INTERVAL": 60})
    clock = FakeClock()
    ext = ExitLimitProgress(crawler, 60, clock=clock)
    assert ext.log() is None  # no crawler.exitlimit: nothing to report
    crawler.exitlimit = pool = FakePool()
    pool.snap = Snapshot(exits_ready=3, admitted_total=100)
    clock.advance(60)
    with caplog.at_level(logging.INFO, logger="scrapy_exitlimit.progress"):
        assert "admitted 100/min" in ext.log()
        pool.snap = Snapshot(exits_ready=3, admitted_total=130, rate_limited_total=2)
        clock.advance(30)
        assert "admitted 60/min, 429 4/min" in ext.log()
    assert [r.getMessage() for r in caplog.records][-1].startswith("exitlimit: exits 3 ready")


def test_not_configured_without_an_interval_or_when_off():
    with pytest.raises(NotConfigured):
        ExitLimitProgress.from_crawler(get_crawler(settings_dict={"LOGSTATS_INTERVAL": 0}))
    with pytest.raises(NotConfigured):
        ExitLimitProgress.from_crawler(get_crawler(settings_dict={"EXITLIMIT_ENABLED": False}))


@pytest_twisted.ensureDeferred
async def test_logs_every_interval_between_open_and_close(caplog):
    crawler = get_crawler(settings_dict={"LOGSTATS_INTERVAL": 0.05})
    ext = ExitLimitProgress.from_crawler(crawler)
    crawler.exitlimit = FakePool()
    with caplog.at_level(logging.INFO, logger="scrapy_exitlimit.progress"):
        ext._spider_opened()
        await deferLater(reactor, 0.18, lambda: None)
        ext._spider_closed()
        logged = len(caplog.records)
        await deferLater(reactor, 0.1, lambda: None)
    assert 2 <= logged <= 4
    assert len(caplog.records) == logged  # stopped at close


def test_format_progress_counts_scopes_and_origins_paced_as_a_whole():
    base = dict(exits_ready=10, admitted_total=60)
    plain = format_progress(Snapshot(**base), None, 60.0)
    assert plain.endswith("parked 0")  # no scope, no origin rate: nothing more
    line = format_progress(Snapshot(**base, scopes=40, slowest_scope_rate=1.94,
                                    origins_paced=1, slowest_origin_rate=19.6), None, 60.0)
    assert line == plain + "; scopes 40, slowest 1.94 r/s; origin rate 19.6 r/s"
    many = format_progress(Snapshot(**base, origins_paced=3, slowest_origin_rate=250.4),
                           None, 60.0)
    assert many == plain + "; origin rates 3, slowest 250 r/s"
    unlimited = format_progress(Snapshot(**base, scopes=2), None, 60.0)
    assert unlimited == plain + "; scopes 2, none limited"
