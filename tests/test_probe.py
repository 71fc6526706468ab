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
from scrapy_exitlimit.probe import LevelResult, Stop, analyze, format_verdicts, parse_levels

SCRAPY = str(Path(sys.executable).parent / "scrapy")
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody:DeprecationWarning")


def level(n: int, mean: float, errors: int = 0, exit_: str = "e:1",
          rate_limited: int = 0) -> LevelResult:
    result = LevelResult(exit_, n, latencies=[mean] * 5, rate_limited=rate_limited)
    if errors:
        result.errors["HTTP 503"] = errors
    return result


def test_knee_where_throughput_stops_growing_and_suggestion_is_what_was_kept_in_service():
    # capacity 4 at 0.1 s each: 10, 20, 40 answers/s, then level 8 only queues (0.2 s)
    verdict = analyze("e:1", [level(1, 0.1), level(2, 0.1), level(4, 0.1), level(8, 0.2),
                              level(16, 0.4)])
    assert verdict.knee == 8 and verdict.stop == Stop.SATURATED
    assert "saturated: 40.0/s at 8 in flight" in verdict.reason
    assert verdict.throughput == pytest.approx({1: 10, 2: 20, 4: 40, 8: 40})
    assert verdict.suggested == 4


def test_errors_are_a_knee_and_that_level_does_not_count():
    verdict = analyze("e:1", [level(1, 0.1), level(2, 0.1), level(4, 0.11, errors=2)])
    assert verdict.knee == 4 and verdict.stop == Stop.ERRORS and "HTTP 503 x2" in verdict.reason
    assert verdict.suggested == 2


def test_no_knee_and_failed_exits():
    verdict = analyze("e:1", [level(1, 0.1), level(2, 0.1), level(4, 0.12)])
    assert verdict.knee is None and verdict.suggested == 4  # it carried the highest level
    dead = analyze("d:1", [LevelResult("d:1", 1, errors=Counter(ConnectionRefusedError=20))])
    assert dead.knee == 1 and dead.suggested is None
    text = format_verdicts([verdict, dead])
    assert "not saturated up to 4" in text
    assert 'EXITLIMIT_EXIT_SETTINGS = {\n    "e:1": {"concurrency": 4},\n}' in text
    assert "# no answer to size: d:1" in text


def test_429s_are_the_targets_limit_not_the_exits_capacity():
    # the rate limit answers from level 2 on: no capacity seen, the default stays
    verdict = analyze("e:1", [level(1, 0.002), level(2, 0.002, rate_limited=9),
                              level(4, 0.002, rate_limited=30)])
    assert verdict.knee == 2 and verdict.stop == Stop.RATE_LIMITED
    assert verdict.suggested is None
    text = format_verdicts([verdict])
    assert "rate-limited (9 x 429)" in text and "keep the default" in text
    assert "EXITLIMIT_EXIT_SETTINGS = {\n}" in text
    assert "# rate-limited before saturating (default kept): e:1" in text
    # 429s at level 1 alone: nothing to size either
    assert analyze("e:1", [level(1, 0.002, rate_limited=19)]).suggested is None


def test_milliseconds_that_stop_speeding_up_are_not_a_knee():
    # an origin that answers at once: this machine, not the exit, sets the pace
    verdict = analyze("e:1", [level(1, 0.001), level(2, 0.002), level(4, 0.004),
                              level(8, 0.008), level(16, 0.016), level(32, 0.03)])
    assert verdict.knee is None and verdict.suggested == 32


def test_parse_levels():
    assert parse_levels("8, 1,2,2,4") == [1, 2, 4, 8]
    for bad in ("", "0,1", "1,x", "1,10000"):
        with pytest.raises(ValueError, match="--levels"):
            parse_levels(bad)


@pytest_twisted.ensureDeferred
async def test_lab_capacity_queues_answers_per_client_ip():
    from twisted.internet import reactor

    service = 0.3
    lab = Lab(exits=0, origin=OriginConfig(rate=None, latency=service, capacity=2))
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
    # two in service at once: two answers after one service time, two after two. Each
    # bound sits where the alternative begins: served one at a time, the second answer
    # would take two service times; unqueued, the third would take one (the margin is
    # a whole service time of load, less the timers' ~10 ms on the other side)
    assert latencies[1] < 2 * service <= latencies[2] + 0.01, latencies


def test_lab_cli_capacity():
    from scrapy_exitlimit.lab.__main__ import build_lab, parse_args

    assert build_lab(parse_args(["--capacity", "4"])).origin.config.capacity == 4
    assert build_lab(parse_args([])).origin.config.capacity is None
    lab = build_lab(parse_args(["--exits", "2", "--body-time", "0.2",
                                "--proxy-capacity", "127.0.0.11=6"]))
    assert lab.origin.config.body_time == 0.2
    assert [p.capacity for p in lab.proxies] == [None, 6]


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
                     "--levels", "1,2,4,8,16", "--requests-per-level", "16", "-L",
                     "WARNING"],
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


def test_between_two_levels_littles_law_gives_the_capacity():
    # capacity 6 at 0.1 s: 40/s at 4, 60/s at 8 and 16: 60/s x 0.1 s = 6 in service
    verdict = analyze("e:1", [level(1, 0.1), level(2, 0.1), level(4, 0.1), level(8, 0.133),
                              level(16, 0.267)])
    assert verdict.knee == 16 and verdict.suggested == 6


def test_a_slow_spell_at_the_lowest_level_does_not_inflate_the_capacity():
    # capacity 2 at 0.05 s, but this machine was busy while level 1 ran (0.065 s): the
    # unloaded time is the lowest level's median that queueing did not lengthen, 0.05 s
    # (40/s x 0.065 s would be 2.6 in service, suggested 3)
    verdict = analyze("e:1", [level(1, 0.065), level(2, 0.05), level(4, 0.1)])
    assert verdict.knee == 4 and verdict.suggested == 2


def test_a_level_that_held_fewer_in_flight_than_it_says_counts_what_it_held():
    # capacity 4 at 0.055 s (72/s at most). At level 8 this machine sent refills late: its
    # timed requests reached the downloader with 6 in flight, not 8, and took 0.075 s.
    # 8 / 0.075 would be 107/s, and 107/s x 0.055 s a suggestion of 6; 6 / 0.075 is 80/s
    late = level(8, 0.075)
    late.loads = [6] * len(late.latencies)
    levels = [level(1, 0.055), level(2, 0.055), level(4, 0.06), late, level(16, 0.2)]
    assert late.throughput == pytest.approx(80.0)
    assert analyze("e:1", levels).suggested == 4
    late.loads = []  # counted as if it held its level: the old overestimate
    assert analyze("e:1", levels).suggested == 6


def test_a_fast_level_above_a_slow_lowest_one_is_not_taken_for_a_machine_bound_exit():
    # level 1 at 12 ms (a slow spell), level 2 at 8 ms, saturated at 4: not machine-bound
    # (the walk judged the lowest level, 12 ms), so Little's law: 250/s x 8 ms = 2, not
    # the saturated level 4 a fast-answer verdict would suggest
    verdict = analyze("e:1", [level(1, 0.012), level(2, 0.008), level(4, 0.06)])
    assert verdict.stop == Stop.SATURATED and verdict.suggested == 2


@pytest_twisted.ensureDeferred
async def test_probe_times_whole_bodies_and_tells_429s_from_saturation(tmp_path):
    # exit 0: a proxy that forwards 2 at once, bodies that take 0.1 s to send (the head
    # comes at once); exit 1: the origin lets its address go 2 r/s
    lab = Lab(exits=2, proxy_kwargs={0: {"capacity": 2}}, origin=OriginConfig(
        rate=None, body_time=0.1, per_ip={"127.0.0.11": IPRule(rate=2)}))
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
    saturating, limited = (e.id for e in read_exits(Settings({"EXITLIMIT_EXIT_SETTINGS": {},
                                                                "EXITLIMIT_EXITS": exits})))
    first_row = next(line for line in out.splitlines() if line.startswith(saturating))
    median = float(first_row.split()[5])
    assert 0.1 <= median < 0.2, out  # the whole body, not the head (~1 ms)
    assert "saturated" in out and "rate-limited (" in out, out
    namespace: dict = {}
    exec(out[out.index("EXITLIMIT_EXIT_SETTINGS = {"):], namespace)
    assert namespace["EXITLIMIT_EXIT_SETTINGS"] == {saturating: {"concurrency": 2}}, out
    assert f"# rate-limited before saturating (default kept): {limited}" in out


def test_fast_answers_that_stop_speeding_up_are_this_machines_limit():
    # 1.5 ms unloaded, and at 64 in flight ~1,200/s like at 32: one process's ceiling
    verdict = analyze("e:1", [level(1, 0.0015), level(8, 0.007), level(32, 0.026),
                              level(64, 0.055)])
    assert verdict.knee == 64 and verdict.stop == Stop.MACHINE
    assert verdict.suggested == 64  # Little's law would say 2: this machine, not the exit
    failed = analyze("e:1", [level(1, 0.0015), level(8, 0.007), level(16, 0.01, errors=3)])
    assert failed.stop == Stop.ERRORS and failed.suggested == 8
