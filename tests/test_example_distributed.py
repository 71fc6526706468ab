"""example_project's distributed mode: several `scrapy crawl lab_distributed`, one crawl."""

from __future__ import annotations

import importlib.util
import io
import runpy
from pathlib import Path

from .crawling import CALLBACK_DELAY
from .redis_server import redis_binary

EXAMPLE = Path(__file__).resolve().parents[1] / "example_project"


def _runner():
    spec = importlib.util.spec_from_file_location("run_distributed",
                                                  EXAMPLE / "run_distributed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_project_is_distributed_only_with_exitlimit_redis_url(monkeypatch):
    settings = EXAMPLE / "example" / "settings.py"
    for name in ("EXITLIMIT_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # a platform's, not ours
    local = runpy.run_path(str(settings))
    assert "SCHEDULER" not in local and "EXITLIMIT_BACKEND" not in local  # the demo's crawl
    monkeypatch.setenv("EXITLIMIT_REDIS_URL", "redis://127.0.0.1:2/0")
    shared = runpy.run_path(str(settings))
    assert shared["SCHEDULER"] == "scrapy_redis.scheduler.Scheduler"
    assert shared["DUPEFILTER_CLASS"] == "scrapy_redis.dupefilter.RFPDupeFilter"
    assert shared["EXITLIMIT_BACKEND"] == "redis" and shared["REDIS_URL"].endswith(":2/0")
    assert shared["SCHEDULER_PERSIST"] is True and shared["MAX_IDLE_TIME_BEFORE_CLOSE"] > 0
    assert shared["CONCURRENT_REQUESTS"] >= 1  # 0 is "no limit": one process would take all


def test_two_processes_share_the_crawl_each_page_once_within_the_exits_limits(tmp_path):
    redis_binary()
    pages, out, runner = 40, io.StringIO(), _runner()
    # each process may hold at most 8 requests, so neither can take the whole (small) crawl
    result = runner.run(
        processes=2, pages=pages, exits=4, rate=10,
        settings=["CONCURRENT_REQUESTS=8", "EXITLIMIT_CONCURRENCY=1",
                  "MAX_IDLE_TIME_BEFORE_CLOSE=2"],
        timeout=60, workdir=str(tmp_path), out=out)
    report = out.getvalue()
    assert result["returncodes"] == [0, 0], report  # both stopped by themselves when idle
    assert not result["lost"] and not result["duplicated"] and not result["unexpected"], report
    assert result["total"] == pages and result["fetched"] == pages, report
    assert all(n > 0 for n in result["items"]), report  # both took part
    assert result["concurrent_requests"] == [8, 8], report
    # the two processes' first requests on an exit ride cold connections: the second, a
    # pair interval after the first (shared through Redis), may reach the origin closer
    # than that, one 429 per exit at most; on Scrapy < 2.18 (0.1 s before each callback) a
    # loaded machine shows it
    allowed = 4 if CALLBACK_DELAY else 0.02 * (result["fetched"] + result["rejected"])
    assert result["rejected"] <= allowed, report
    assert runner.ok(result)
    assert "all exits" in report and f"total:   {pages:>6}" in report


def test_the_single_process_project_needs_no_scrapy_redis(monkeypatch):
    """`python -m scrapy_exitlimit.demo` after a plain `pip install -e .` (no redis extra)."""
    import importlib
    import sys

    from scrapy.settings import Settings
    from scrapy.spiderloader import SpiderLoader

    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setitem(sys.modules, "scrapy_redis", None)  # import scrapy_redis fails
    monkeypatch.delenv("EXITLIMIT_REDIS_URL", raising=False)
    for name in [m for m in sys.modules if m == "example" or m.startswith("example.")]:
        monkeypatch.delitem(sys.modules, name)
    settings = importlib.import_module("example.settings")
    assert "example.distributed" not in settings.SPIDER_MODULES
    # every spider module imports (SpiderLoader raises otherwise), the lab spider among them
    loader = SpiderLoader.from_settings(Settings({"SPIDER_MODULES": settings.SPIDER_MODULES}))
    assert "lab" in loader.list()
