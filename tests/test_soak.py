"""bench/soak.py end to end on a short run, and the spider's counting-only mode it uses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from scrapy_exitlimit.lab.spider import PagesSpider

ROOT = Path(__file__).resolve().parent.parent


def test_the_spider_can_count_without_keeping_urls():
    assert PagesSpider("http://x", 1).keep_urls is True
    assert PagesSpider("http://x", 1, keep_urls="false").keep_urls is False  # -a keep_urls=false
    assert PagesSpider("http://x", 1, keep_urls=False).ok == {}


def test_soak_reports_memory_and_no_lost_page(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--pages", "300", "--exits", "3",
         "--interval", "0.2", "--timeout", "30", "--json", str(out)],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert re.search(r"pages ok / failed / lost +300 / 0 / 0\n", proc.stdout), proc.stdout
    assert re.search(r"growth per 1000 pages +[-+]\d", proc.stdout), proc.stdout
    result = json.loads(out.read_text())
    assert result["lost"] == 0 and result["result"]["ok"] == 300
    assert result["result"]["finish_reason"] == "finished"
    assert result["samples"] and all(rss > 0 for _, _, rss, _ in result["samples"])
