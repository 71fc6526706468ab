"""The operator's view of a real lab crawl: telemetry, the progress line, the report plot."""

from __future__ import annotations

import json
import logging
import re

import pytest
import pytest_twisted

from scrapy_exitlimit import report
from scrapy_exitlimit.lab import Lab, OriginConfig

from .crawling import crawl_lab


@pytest_twisted.ensureDeferred
async def test_lab_crawl_telemetry_renders_a_report_and_a_plot(tmp_path, caplog, capsys):
    pytest.importorskip("matplotlib")
    telemetry = tmp_path / "crawl.jsonl"
    # the origin allows 8 r/s per IP, we claim 12: some 429s to mark on the plot; and an
    # origin-wide rate that never binds (2 exits at 12 r/s), for the pool panel
    lab = Lab(exits=2, origin=OriginConfig(rate=8, retry_after=0.2))
    with caplog.at_level(logging.INFO, logger="scrapy_exitlimit"):
        crawler = await crawl_lab(lab, {"EXITLIMIT_TELEMETRY": str(telemetry),
                                        "EXITLIMIT_RATE": 12, "EXITLIMIT_ORIGIN_RATE": 40,
                                        "LOGSTATS_INTERVAL": 0.5,
                                        "EXITLIMIT_MAX_RETRIES": 30}, 30)
    assert len(crawler.spider.ok) == 30
    records = [json.loads(line) for line in telemetry.read_text().splitlines()]
    kinds = {r["ev"] for r in records}
    assert {"admit", "response", "adjust", "rates"} <= kinds
    # the configured origin rate first; a site rate learned under it would follow
    paced = [(r["origin"], r["origin_rate"]) for r in records if r["ev"] == "rates"]
    assert paced[0] == (crawler.origin, 40)
    assert len(paced) <= crawler.spider.crawl_seconds + 2  # once a second, at most
    admits = [r for r in records if r["ev"] == "admit"]
    assert len(admits) == crawler.stats.get_value("exitlimit/admitted")
    assert all(r["exit"] in crawler.exitlimit.exits for r in admits)
    rejected = [r for r in records if r["ev"] == "response" and r["status"] == 429]
    assert len(rejected) == lab.origin.total(429) > 0
    # the progress line, every LOGSTATS_INTERVAL
    progress = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("exitlimit: exits ")]
    assert progress and "admitted" in progress[-1]
    assert re.search(r"; origin rate [\d.]+ r/s$", progress[-1])
    # scrapy exitlimit-report's work, in process
    png = tmp_path / "plot.png"
    assert report.main([str(telemetry), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = capsys.readouterr().out
    for exit_id in crawler.exitlimit.exits:
        assert exit_id in summary
    assert f"origin rate {crawler.origin}" in summary
