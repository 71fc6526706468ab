"""Reading telemetry back: summary tables, plot, CLI and the scrapy command."""

from __future__ import annotations

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


def test_plot_caps_exits_busiest_first(tmp_path):
    pytest.importorskip("matplotlib")
    records, _ = report.load(write_crawl(tmp_path / "t.jsonl", exits=4))
    out = tmp_path / "plot.png"
    shown = report.plot(records, out, max_exits=2)
    assert shown[0] == "e0:1" and len(shown) == 2
    assert out.read_bytes().startswith(b"\x89PNG")


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
