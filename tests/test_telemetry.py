"""Telemetry: one JSON object per line, cheap to write, safe to read back."""

from __future__ import annotations

import json

import pytest
from scrapy.settings import Settings

from scrapy_exitlimit.core import Event
from scrapy_exitlimit.middleware import RateChanges
from scrapy_exitlimit.telemetry import Telemetry

from .conftest import FakeClock


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_carry_time_kind_origin_exit_and_their_fields(tmp_path):
    clock = FakeClock(1_700_000_000.0)
    path = tmp_path / "t.jsonl"
    tel = Telemetry(path, clock=clock)
    tel.admission("https://a.com", "p1:8000", wait=0.25, rate=5.0, limit=4, in_flight=2)
    clock.advance(0.3337)
    tel.response("https://a.com", "p1:8000", status=429, signal="rate_limited", latency=0.3337,
                 rate=3.5, limit=4, in_flight=1)
    tel.adjustment("rate_down", "https://a.com", "p1:8000", "5 -> 3.5 r/s")
    tel.close()
    admit, response, adjust = lines(path)
    assert admit == {"t": 1_700_000_000.0, "ev": "admit", "origin": "https://a.com",
                     "exit": "p1:8000", "wait": 0.25, "rate": 5, "limit": 4, "in_flight": 2}
    assert response == {"t": 1_700_000_000.334, "ev": "response", "origin": "https://a.com",
                        "exit": "p1:8000", "status": 429, "signal": "rate_limited",
                        "latency": 0.3337, "rate": 3.5, "limit": 4, "in_flight": 1}
    assert adjust == {"t": 1_700_000_000.334, "ev": "adjust", "origin": "https://a.com",
                      "exit": "p1:8000", "kind": "rate_down", "detail": "5 -> 3.5 r/s"}
    assert tel.records == 3 and tel.closed


def test_missing_and_non_finite_values_are_null_and_strings_are_escaped(tmp_path):
    path = tmp_path / "t.jsonl"
    tel = Telemetry(path, clock=FakeClock())
    odd = 'site "one"\\\n\u00e9'
    tel.admission(odd, "p1:8000", wait=0.0, rate=None, limit=None, in_flight=1)
    tel.admission(odd, "p1:8000", wait=0.0, rate=float("inf"), limit=8, in_flight=1)
    tel.response(odd, "p1:8000", status=None, signal="proxy_fault", latency=None,
                 rate=float("nan"), limit=8, in_flight=0)
    tel.adjustment("origin_slowed", odd, None, 'detail with "quotes"\n')
    tel.close()
    a, b, r, adj = lines(path)
    assert a["origin"] == odd and a["rate"] is None and a["limit"] is None
    assert b["rate"] is None
    assert r["status"] is None and r["latency"] is None and r["rate"] is None
    assert adj["exit"] is None and adj["detail"] == 'detail with "quotes"\n'


def test_events_are_written_as_adjustments(tmp_path):
    path = tmp_path / "t.jsonl"
    tel = Telemetry(path, clock=FakeClock())
    tel.events([Event("breaker_open", "https://a.com", "p1:8000", "5 429s in a row"),
                Event("origin_slowed", "https://a.com", None, "10 -> 5 r/s")])
    tel.close()
    assert [(r["kind"], r["exit"]) for r in lines(path)] == [
        ("breaker_open", "p1:8000"), ("origin_slowed", None)]


def test_buffered_then_flushed_on_interval_and_close(tmp_path):
    clock = FakeClock()
    path = tmp_path / "t.jsonl"
    tel = Telemetry(path, clock=clock, flush_interval=1.0)
    tel.admission("o", "e", 0.0, 1.0, 1, 1)
    assert path.read_text() == ""  # still in the buffer
    clock.advance(1.0)
    tel.admission("o", "e", 0.0, 1.0, 1, 1)
    assert len(path.read_text().splitlines()) == 2  # the interval passed: flushed
    tel.admission("o", "e", 0.0, 1.0, 1, 1)
    tel.close()
    tel.close()  # idempotent
    tel.admission("o", "e", 0.0, 1.0, 1, 1)  # after close: dropped, no error
    assert len(path.read_text().splitlines()) == 3


def test_from_settings(tmp_path):
    assert Telemetry.from_settings(Settings()) is None
    assert Telemetry.from_settings(Settings({"EXITLIMIT_TELEMETRY": ""})) is None
    path = tmp_path / "crawl.jsonl"
    tel = Telemetry.from_settings(Settings({"EXITLIMIT_TELEMETRY": str(path)}))
    assert tel is not None and tel.path == path and path.exists()
    tel.close()
    for bad in (str(tmp_path / "missing" / "t.jsonl"), str(tmp_path), 5):
        with pytest.raises(ValueError, match="EXITLIMIT_TELEMETRY"):
            Telemetry.from_settings(Settings({"EXITLIMIT_TELEMETRY": bad}))


def test_rates_records_carry_an_origin_or_a_scope_id_and_its_rate(tmp_path):
    clock = FakeClock(1_700_000_000.0)
    path = tmp_path / "t.jsonl"
    tel = Telemetry(path, clock=clock)
    tel.origin_rate("https://a.com", 19.6)
    tel.scope_rate("scope~3f2a9c0d1b7e", 3.9)
    tel.origin_rate("https://a.com", None)
    tel.scope_rate("scope~3f2a9c0d1b7e", float("inf"))
    tel.close()
    assert lines(path) == [
        {"t": 1_700_000_000.0, "ev": "rates", "origin": "https://a.com", "origin_rate": 19.6},
        {"t": 1_700_000_000.0, "ev": "rates", "scope": "scope~3f2a9c0d1b7e", "scope_rate": 3.9},
        {"t": 1_700_000_000.0, "ev": "rates", "origin": "https://a.com", "origin_rate": None},
        {"t": 1_700_000_000.0, "ev": "rates", "scope": "scope~3f2a9c0d1b7e", "scope_rate": None},
    ]


def test_rate_changes_give_only_what_changed_and_none_for_what_no_longer_limits():
    changes = RateChanges()
    assert changes.update({"a": 2.0, "b": None}) == {"a": 2.0}  # b never limited: nothing
    assert changes.update({"a": 2.0, "b": None}) == {}  # the same: no record
    assert changes.update({"a": 1.5, "b": 3.0}) == {"a": 1.5, "b": 3.0}
    assert changes.update({"b": None}) == {"a": None, "b": None}  # gone, and unlimited
    assert changes.update({}) == {}
