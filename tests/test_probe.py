"""The probe: knee arithmetic, and `scrapy exitlimit-probe` against lab exits of known capacity."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import pytest_twisted
from scrapy.settings import Settings
from twisted.internet import defer
from twisted.internet.utils import getProcessOutputAndValue
from twisted.web.client import Agent, readBody

from scrapy_exitlimit.config import read_exits
from scrapy_exitlimit.lab import IPRule, Lab, OriginConfig
from scrapy_exitlimit.probe import LevelResult, analyze, format_verdicts, parse_levels

SCRAPY = str(Path(sys.executable).parent / "scrapy")
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody:DeprecationWarning")


def level(n: int, median: float, errors: int = 0, exit_: str = "e:1") -> LevelResult:
    result = LevelResult(exit_, n, latencies=[median] * 5)
    if errors:
        result.errors["HTTP 503"] = errors
    return result


def test_knee_where_latency_doubles_and_suggestion_is_what_was_sustained():
    # capacity 4 at 0.1 s each: level 8 queues (0.2 s), level 16 more so (0.4 s)
    verdict = analyze("e:1", [level(1, 0.1), level(2, 0.1), level(4, 0.1), level(8, 0.2),
                              level(16, 0.4)])
    assert verdict.knee == 16 and "4.0x the level-1 median" in verdict.reason
    assert verdict.sustained == {1: 1, 2: 2, 4: 4, 8: 4, 16: 4}
    assert verdict.suggested == 4


def test_errors_are_a_knee_and_that_level_does_not_count():
    verdict = analyze("e:1", [level(1, 0.1), level(2, 0.1), level(4, 0.11, errors=2)])
    assert verdict.knee == 4 and "HTTP 503 x2" in verdict.reason
    assert verdict.suggested == 2


def test_no_knee_and_failed_exits():
    verdict = analyze("e:1", [level(1, 0.1), level(2, 0.1), level(4, 0.12)])
    assert verdict.knee is None and verdict.suggested == 3  # 4 x 0.1 / 0.12 = 3.3
    dead = analyze("d:1", [LevelResult("d:1", 1, errors=Counter(ConnectionRefusedError=20))])
    assert dead.knee == 1 and dead.suggested is None
    text = format_verdicts([verdict, dead])
    assert "no knee up to 4" in text
    assert 'EXITLIMIT_EXIT_SETTINGS = {\n    "e:1": {"concurrency": 3},\n}' in text
    assert "# no answer to size: d:1" in text


def test_parse_levels():
    assert parse_levels("8, 1,2,2,4") == [1, 2, 4, 8]
    for bad in ("", "0,1", "1,x", "1,10000"):
        with pytest.raises(ValueError, match="--levels"):
            parse_levels(bad)


@pytest_twisted.ensureDeferred
async def test_lab_capacity_queues_answers_per_client_ip():
    from twisted.internet import reactor

    lab = Lab(exits=0, origin=OriginConfig(rate=None, latency=0.1, capacity=2))
    await lab.start()
    try:
        agent = Agent(reactor)

        async def timed(n: int) -> float:
            start = time.monotonic()
            response = await agent.request(b"GET", f"{lab.origin_url}/page/{n}".encode())
            await readBody(response)
            return time.monotonic() - start

        latencies = sorted(await defer.gatherResults(
            [defer.ensureDeferred(timed(n)) for n in range(4)]))
    finally:
        await lab.stop()
    # two in service at once: two answers after ~0.1 s, two after ~0.2 s
    assert latencies[1] < 0.17 and latencies[2] > 0.18, latencies


def test_lab_cli_capacity():
    from scrapy_exitlimit.lab.__main__ import build_lab, parse_args

    assert build_lab(parse_args(["--capacity", "4"])).origin.config.capacity == 4
    assert build_lab(parse_args([])).origin.config.capacity is None


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacities"):
        OriginConfig(capacity=0)
    with pytest.raises(ValueError, match="capacities"):
        OriginConfig(per_ip={"127.0.0.10": IPRule(capacity=0)})


@pytest_twisted.ensureDeferred
async def test_probe_command_finds_each_exits_capacity(tmp_path):
    # exit 0 serves 4 at a time, exit 1 only 2; the second has credentials
    lab = Lab(exits=2, proxy_auth=("user", "s3cret"), origin=OriginConfig(
        rate=None, latency=0.05, capacity=4, per_ip={"127.0.0.11": IPRule(capacity=2)}))
    await lab.start()
    try:
        exits = lab.exit_urls
        out, err, code = await getProcessOutputAndValue(
            SCRAPY, ["exitlimit-probe", lab.page_url(1), "--exits", ",".join(exits),
                     "--levels", "1,2,4,8", "--requests-per-level", "8", "-L", "WARNING"],
            env=dict(os.environ), path=str(tmp_path))
    finally:
        await lab.stop()
    out, err = out.decode(), err.decode()
    assert code == 0, err
    assert "s3cret" not in out + err
    first, second = (e.id for e in read_exits(Settings({"EXITLIMIT_EXITS": exits[:2]})))
    assert "~" in first  # credentials: a hashed id
    settings = out[out.index("EXITLIMIT_EXIT_SETTINGS = {"):]
    namespace: dict = {}
    exec(settings, namespace)  # the suggestion is valid Python to paste
    suggested = namespace["EXITLIMIT_EXIT_SETTINGS"]
    assert set(suggested) == {first, second}
    assert 3 <= suggested[first]["concurrency"] <= 5, out
    assert suggested[second]["concurrency"] == 2, out


def test_probe_command_usage_errors(tmp_path):
    import subprocess

    run = subprocess.run([SCRAPY, "exitlimit-probe", "http://127.0.0.1:1/"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no exits" in run.stderr
    run = subprocess.run([SCRAPY, "exitlimit-probe", "http://127.0.0.1:1/", "--exits",
                          "http://127.0.0.1:2", "--levels", "0"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--levels" in run.stderr


def test_a_flat_level_counts_whole_and_a_queued_one_by_littles_law():
    # capacity 3 at 0.05 s: level 4 keeps one queued, 4 x 0.05 / 0.0667 = 3
    verdict = analyze("e:1", [level(1, 0.05), level(2, 0.052), level(4, 0.0667),
                              level(8, 0.133)])
    assert verdict.sustained[2] == 2 and verdict.sustained[4] == pytest.approx(3.0, abs=0.01)
    assert verdict.suggested == 3
