"""Reading telemetry back: summary tables, plot, CLI and the scrapy command."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from scrapy_exitlimit import report
from scrapy_exitlimit.telemetry import Telemetry

from .conftest import FakeClock

SCRAPY = str(Path(sys.executable).parent / "scrapy")


def write_crawl(path: Path, exits: int = 2) -> Path:
    """Exit 0 at 4 r/s (one 429, then 2 r/s), the others at 1 r/s, for 5 s; one bad line."""
    clock = FakeClock(1_700_000_000.0)
    tel = Telemetry(path, clock=clock)
    o = "https://a.com"
    for step in range(20):  # 0.25 s steps
        rate = 4.0 if step < 8 else 2.0
        if step < 8 or step % 2 == 0:
            tel.admission(o, "e0:1", wait=0.1, rate=rate, limit=4, in_flight=1)
            tel.response(o, "e0:1", status=429 if step == 7 else 200,
                         signal="rate_limited" if step == 7 else "ok", latency=0.05,
                         rate=rate, limit=4, in_flight=0)
        if step == 7:
            tel.adjustment("rate_down", o, "e0:1", "4 -> 2 r/s")
        if step % 4 == 0:
            for i in range(1, exits):
                tel.admission(o, f"e{i}:1", wait=0.0, rate=1.0, limit=2, in_flight=1)
                tel.response(o, f"e{i}:1", status=None if step == 4 else 200,
                             signal="ok", latency=0.1, rate=1.0, limit=2, in_flight=0)
        clock.advance(0.25)
    tel.close()
    with open(path, "a") as f:
        f.write("not json\n[1, 2]\n{\"ev\": \"admit\"}\n\n")
    return path


def test_load_skips_and_counts_malformed_lines(tmp_path):
    records, malformed = report.load(write_crawl(tmp_path / "t.jsonl"))
    assert malformed == 3  # not JSON, not an object, no t; the blank line is not counted
    assert {r["ev"] for r in records} == {"admit", "response", "adjust"}


def test_aggregate_per_exit_and_origin(tmp_path):
    records, _ = report.load(write_crawl(tmp_path / "t.jsonl"))
    exits, origins = report.aggregate(records)
    e0 = exits["e0:1"]
    assert e0.requests == 14 and e0.rate_limited == 1 and e0.responses == 14
    assert e0.share_429 == pytest.approx(1 / 14)
    assert e0.statuses == {"200": 13, "429": 1}
    assert e0.peak_rate == 4  # 4 admissions in each of the first two seconds
    assert e0.mean_wait == pytest.approx(0.1)
    assert e0.last_rate == {"https://a.com": 2.0}
    e1 = exits["e1:1"]
    assert e1.requests == 5 and e1.statuses == {"200": 4, "error": 1}
    assert e1.mean_rate == pytest.approx(1.0)
    assert origins["https://a.com"].requests == 19
    assert origins["https://a.com"].last_rate == {"e0:1": 2.0, "e1:1": 1.0}


def test_summary_text(tmp_path):
    records, malformed = report.load(write_crawl(tmp_path / "t.jsonl"))
    text = report.summarize(records, malformed)
    assert "3 malformed lines skipped" in text
    e0 = next(line for line in text.splitlines() if line.startswith("e0:1"))
    assert e0.split()[:4] == ["e0:1", "14", "1", "7.1"]  # requests, 429s, 429 %
    assert "200:13 429:1" in e0
    origin = next(line for line in text.splitlines() if line.startswith("https://a.com"))
    assert "1..2" in origin  # last pair rates over its two exits
    assert "rate_down 1" in text
    assert report.summarize([]) == "no telemetry records"


def test_plot_caps_exits_trouble_first(tmp_path):
    pytest.importorskip("matplotlib")
    records, _ = report.load(write_crawl(tmp_path / "t.jsonl", exits=4))
    out = tmp_path / "plot.png"
    shown = report.plot(records, out, max_exits=2)
    assert shown[0] == "e0:1" and len(shown) == 2
    assert out.read_bytes().startswith(b"\x89PNG")


def troubled_pool(path: Path, clean: int = 8) -> Path:
    """Busy clean exits, and three quiet ones in trouble: a ban after one request, a dead
    proxy evicted, a slow exit with 429s and a breaker."""
    clock = FakeClock(1_700_000_000.0)
    tel = Telemetry(path, clock=clock)
    o = "https://a.com"
    for step in range(40):
        for i in range(clean):
            tel.admission(o, f"busy{i}:1", wait=0, rate=5.0, limit=4, in_flight=1)
            tel.response(o, f"busy{i}:1", status=200, signal="ok", latency=0.05, rate=5.0,
                             limit=4, in_flight=0)
        if step == 0:
            tel.admission(o, "banned:1", wait=0, rate=2.0, limit=2, in_flight=1)
            tel.response(o, "banned:1", status=403, signal="banned", latency=0.05, rate=2.0,
                         limit=2, in_flight=0)
            tel.adjustment("pair_banned", o, "banned:1", "300 s")
        if step < 3:
            tel.admission(o, "dead:1", wait=0, rate=2.0, limit=2, in_flight=1)
            tel.response(o, "dead:1", status=None, signal="proxy_fault")
            if step == 2:
                tel.adjustment("evicted", o, "dead:1", "3 faults")
        if step % 4 == 0:
            tel.admission(o, "slow:1", wait=0, rate=1.0, limit=2, in_flight=1)
            tel.response(o, "slow:1", status=429, signal="rate_limited", latency=0.05, rate=1.0,
                         limit=2, in_flight=0)
            if step == 20:
                tel.adjustment("breaker_open", o, "slow:1", "5 in a row")
        clock.advance(0.25)
    tel.close()
    return path


def test_trouble_is_ranked_first_and_every_kind_is_marked(tmp_path):
    records, _ = report.load(troubled_pool(tmp_path / "t.jsonl"))
    by_exit = report.tracks(records)
    ranked = report.rank_exits(by_exit)
    assert ranked[:3] == ["slow:1", "dead:1", "banned:1"]  # 429+breaker, fault+eviction, ban
    assert by_exit["banned:1"].marks["ban"] and by_exit["dead:1"].marks["eviction"]
    assert by_exit["dead:1"].marks["fault"] and by_exit["slow:1"].marks["breaker"]
    assert len(by_exit["slow:1"].marks["429"]) == 10
    # an exit's lines stop where it was last seen: the ban, not the end of the crawl
    assert by_exit["banned:1"].last_seen < by_exit["busy0:1"].last_seen - 9


def test_the_plot_draws_the_exits_in_trouble_and_says_how_many_are_left_out(tmp_path):
    pytest.importorskip("matplotlib")
    records, _ = report.load(troubled_pool(tmp_path / "t.jsonl"))
    shown = report.plot(records, tmp_path / "p.png", max_exits=4)
    assert {"slow:1", "dead:1", "banned:1"} <= set(shown) and len(shown) == 4
    import matplotlib.pyplot as plt

    texts = []
    real_savefig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        texts.extend(t.get_text() for t in fig.findobj(plt.Text))
        return real_savefig(fig, *args, **kwargs)

    plt.Figure.savefig = spy
    try:
        report.plot(records, tmp_path / "p.png", max_exits=4)
    finally:
        plt.Figure.savefig = real_savefig
    joined = "\n".join(texts)
    assert "exits in detail: 4 of 11" in joined and "7 left out" in joined
    for _, _, label in report.EVENT_MARKS.values():
        assert label in joined  # one legend entry per kind of event


def test_a_large_pool_gets_a_heat_map_and_the_detail_shows_each_kind(tmp_path):
    pytest.importorskip("matplotlib")
    records, _ = report.load(troubled_pool(tmp_path / "t.jsonl", clean=60))
    by_exit = report.tracks(records)
    picked = report.pick_exits(by_exit, report.rank_exits(by_exit), 5)
    assert {"slow:1", "dead:1", "banned:1"} <= set(picked)
    assert any(p.startswith("busy") for p in picked)  # a clean exit too
    out = tmp_path / "big.png"
    report.plot(records, out)
    assert out.stat().st_size > 0


def write_rates(path: Path, scopes: int = 1) -> Path:
    """What the middleware writes: an origin paced at 10 then 8.5 r/s, then no longer;
    scopes at 3 r/s and up (the first one 2 r/s later); admissions around them."""
    clock = FakeClock(1.0)
    tel = Telemetry(path, clock=clock)
    tel.admission("https://a.com", "e:1", wait=0.0, rate=2.0, limit=4, in_flight=1)
    tel.origin_rate("https://a.com", 10.0)
    for i in range(scopes):
        tel.scope_rate(f"scope~{i:012x}", 3.0 + i)
    clock.advance(1.0)
    tel.origin_rate("https://a.com", 8.5)
    tel.scope_rate("scope~000000000000", 2.0)
    clock.advance(1.0)
    tel.origin_rate("https://a.com", None)
    tel.scope_rate("scope~ffffffffffff", None)  # never limited: nothing to draw
    tel.admission("https://a.com", "e:1", wait=0.0, rate=2.0, limit=4, in_flight=1)
    tel.close()
    return path


def test_origin_and_scope_rates_are_read_from_the_rates_records(tmp_path):
    records, malformed = report.load(write_rates(tmp_path / "t.jsonl"))
    assert malformed == 0
    lines = report.pool_rates(records)
    assert set(lines) == {"origin rate https://a.com", "scope scope~000000000000"}
    xs, ys = lines["origin rate https://a.com"]
    assert xs == [1.0, 2.0, 3.0] and ys[:2] == [10.0, 8.5]
    assert math.isnan(ys[2])  # no longer paced: a gap from there on
    assert lines["scope scope~000000000000"] == ([1.0, 2.0], [3.0, 2.0])
    admits = [r for r in records if r["ev"] == "admit"]
    assert admits and report.pool_rates(admits) == {}  # older telemetry: nothing to draw
    # a rate on any other record is not one the telemetry writes
    assert report.pool_rates([{**admits[0], "origin_rate": 10}]) == {}
    text = report.summarize(records)
    assert text.index("scope scope~000000000000") < text.index("origin rate https://a.com")
    origin_row = next(r for r in text.splitlines() if r.startswith("origin rate"))
    assert origin_row.split()[-2:] == ["8.5", "none"]  # lowest, last
    pytest.importorskip("matplotlib")
    report.plot(records, tmp_path / "o.png")


def test_many_scopes_are_cut_to_the_slowest(tmp_path):
    records, _ = report.load(write_rates(tmp_path / "t.jsonl", scopes=30))
    assert len(report.pool_rates(records)) == 31
    slowest = report.slowest_first(report.pool_rates(records))
    assert slowest[:2] == ["scope scope~000000000000", "scope scope~000000000001"]
    assert slowest[-1] == "scope scope~00000000001d"
    text = report.summarize(records)
    assert f"... and {31 - report.MAX_RATE_ROWS} more" in text
    assert "scope~00000000001d" not in text  # the fastest is left out
    pytest.importorskip("matplotlib")
    report.plot(records, tmp_path / "o.png")


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    with pytest.raises(report.PlotUnavailable, match=r"pip install 'scrapy-exitlimit\[plot\]'"):
        report.plot([], tmp_path / "p.png")


def test_main(tmp_path, capsys):
    path = write_crawl(tmp_path / "t.jsonl")
    out = tmp_path / "p.png"
    assert report.main([str(path), "--plot", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "e0:1" in printed and f"written to {out}" in printed and out.exists()
    assert report.main([str(tmp_path / "missing.jsonl")]) == 1


def test_scrapy_command_outside_a_project(tmp_path):
    path = write_crawl(tmp_path / "t.jsonl")
    run = subprocess.run([SCRAPY, "exitlimit-report", str(path), "--plot", "p.png"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "e0:1" in run.stdout and "https://a.com" in run.stdout
    assert (tmp_path / "p.png").exists()
    bad = subprocess.run([SCRAPY, "exitlimit-report"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "one telemetry file" in bad.stderr
