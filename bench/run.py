"""Benchmark: every strategy against the same lab, in one run, as ratios.

    python bench/run.py                      # 10 exits x 5 r/s per IP, 500 pages
    python bench/run.py --pages 200 --strategies exitlimit,random-proxy
    python bench/run.py --scenario tighten --repeat 3   # issue 11's kinds of origin
    python bench/run.py --warm --pages 600 --repeat 3   # cold, then warm (EXITLIMIT_STATE_FILE)

Scenarios: foundation, mixed, site-wide, tighten, loosen, jitter-small, jitter-large,
broad (30 origins), unlimited, shared, scale, redis-overhead; issue 16's signals:
overload-503, header-overstated, header-honest, header-window, header-window-epoch
(see SCENARIOS).

Starts the lab in its own process, runs each strategy's crawl in a fresh
process, and reads the origin's own counts. utilization = ideal time for the
pages actually fetched (ok / capacity; for a limit that moves, the old capacity
until the change and the rest at the new one) / wall time from the first request
to the last outcome (plus, where the origin asks for a pause, e.g. one 503 with
Retry-After 3, that pause); 429 share = the origins' 429s / all requests they received
(summed over origins), and for a limit that moves also the share after the change.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scrapy_exitlimit.lab.process import start_lab_process

HERE = Path(__file__).resolve().parent
STRATEGIES = ["random-proxy", "autothrottle", "global-delay", "exitlimit", "exitlimit-learned"]
LEARNED_KNOWN = ["exitlimit-learned", "exitlimit"]


@dataclass(frozen=True)
class Scenario:
    """One kind of origin: how the lab is started and what it lets through.

    ``capacity(args, rate)``: the r/s the healthy part of the lab lets through at a per-IP
    ``rate`` (None: no limit, throughputs are compared instead). ``change``: the per-IP rate
    moves to ``rate`` ``at`` seconds after the crawl's first request; the ideal time is then
    the old capacity until ``at`` and the rest of the pages at the new one. ``pages``,
    ``rate``, ``origins``, ``exits`` and ``timeout`` are defaults the command line can
    override. ``pause``: seconds the origin asks the crawl to stop (one 503's Retry-After),
    added to the ideal time.
    """

    lab_args: list[str]
    capacity: Callable[[argparse.Namespace, float], float] | None
    strategies: list[str]
    pages: int = 500
    rate: float = 5.0
    origins: int = 1
    change: tuple[float, float] | None = None  # (at seconds, new per-IP rate)
    timeout: float = 300.0
    exits: int = 10
    pause: float = 0.0


#: scenarios that compare exitlimit pools of different sizes with each other (per-page CPU
#: and memory), not a crawl with a baseline's
POOL_SCENARIOS = ("scale", "redis-scale")


def _per_ip(a: argparse.Namespace, rate: float) -> float:
    return a.origins * a.exits * rate


SCENARIOS = {
    # 10 exits x 5 r/s per IP, no burst, 429 + Retry-After 1
    "foundation": Scenario([], _per_ip, STRATEGIES),
    # 2 exits limited to 1 r/s, 1 banned (403 to everything), 1 proxy nobody listens on;
    # a slow exit (127.0.0.10) is the first of EXITLIMIT_EXITS, so it scouts first
    "mixed": Scenario(["--slow", "127.0.0.10=1", "127.0.0.19=1", "--ban", "127.0.0.17",
                       "--dead", "1"],
                      lambda a, r: (a.exits - 3) * r + 2 * 1.0, LEARNED_KNOWN, pages=600),
    # the whole site limited to 20 r/s (429 + Retry-After, as nginx) on top of 5 r/s per IP
    "site-wide": Scenario(["--origin-rate", "20", "--origin-status", "429"],
                          lambda a, r: min(a.exits * r, 20.0), ["exitlimit-learned"],
                          pages=600, timeout=120),
    # the per-IP limit tightens 5 -> 2 r/s, or loosens 2 -> 5 r/s, 6 s into the crawl
    "tighten": Scenario([], _per_ip, ["exitlimit-learned"], pages=1000, change=(6.0, 2.0)),
    "loosen": Scenario([], _per_ip, ["exitlimit-learned"], pages=1000, rate=2.0,
                       change=(6.0, 5.0)),
    # 20 ms + U(0, 60 ms), and 50 ms + U(0, 300 ms), between each exit and the origin
    "jitter-small": Scenario(["--delay", "0.02", "--jitter", "0.06"], _per_ip, LEARNED_KNOWN,
                             pages=1000),
    "jitter-large": Scenario(["--delay", "0.05", "--jitter", "0.3"], _per_ip, LEARNED_KNOWN,
                             pages=1000),
    # a broad crawl: 30 origins, each 1 r/s per IP, pages interleaved over them
    "broad": Scenario([], _per_ip, LEARNED_KNOWN, pages=3000, rate=1.0, origins=30),
    # issue 16: one 503 with Retry-After 3, 10 s into a 20 r/s crawl (4 exits x 5 r/s, known
    # rate): the ideal is 30 s plus the 3 s pause, so utilization >= 0.8 is wall <= 41.25 s
    "overload-503": Scenario(["--status-at", "10=503:3"], _per_ip, ["exitlimit"], pages=600,
                             exits=4, pause=3.0, timeout=120),
    # 3 r/s per IP over 4 exits, learned mode: every answer states 10 r/s (a false
    # RateLimit-Policy: 10;w=1), or the true 3 r/s in every header form (--ratelimit-headers)
    "header-overstated": Scenario(["--announce-policy", "10;w=1"], _per_ip,
                                  ["exitlimit-learned"], pages=300, rate=3.0, exits=4,
                                  timeout=120),
    "header-honest": Scenario(["--ratelimit-headers"], _per_ip, ["exitlimit-learned"],
                              pages=300, rate=3.0, exits=4, timeout=120),
    # no per-IP rate but a fixed window, 15 per 5 s per IP, stated only as X-RateLimit-Limit,
    # -Remaining and -Reset (seconds to the window's end, or its Unix time): capacity is
    # the long-run 3 r/s per IP (the first window's burst makes > 1 possible)
    "header-window": Scenario(["--rate", "0", "--window-limit", "15", "--window", "5"],
                              _per_ip, ["exitlimit-learned"], pages=300, rate=3.0, exits=4,
                              timeout=120),
    "header-window-epoch": Scenario(["--rate", "0", "--window-limit", "15", "--window", "5",
                                     "--window-reset", "epoch"], _per_ip,
                                    ["exitlimit-learned"], pages=300, rate=3.0, exits=4,
                                    timeout=120),
    # issue 12: 4 r/s per account (the X-Account header), no per-IP limit, 10 exits; every
    # request names the account as its exitlimit_scope, its rate given or learned
    "account": Scenario(["--rate", "0", "--account-rate", "4"], lambda a, r: r,
                        ["exitlimit-scope", "exitlimit-scope-learned"], pages=400, rate=4.0,
                        timeout=200),
    # no limit at all: learned mode against a bare random-proxy crawl
    "unlimited": Scenario(["--rate", "0"], None, ["random-proxy", "exitlimit-learned"],
                          pages=3000),
    # --procs crawl processes at once on the same exits (disjoint pages): state in each
    # process (exitlimit) against state shared through Redis
    "shared": Scenario([], _per_ip, ["exitlimit", "exitlimit-redis", "exitlimit-redis-learned"]),
    # admission cost against the pool's size: 10, 1000 and 10000 exits (gateway sessions
    # over the lab's 10 proxies), no limit, the same CONCURRENT_REQUESTS
    "scale": Scenario(["--rate", "0"], None,
                      ["exitlimit-pool10", "exitlimit-pool1000", "exitlimit-pool10000"]),
    # the same through the Redis backend: 10 exits against 10,000
    "redis-scale": Scenario(["--rate", "0"], None,
                            ["exitlimit-redis-pool10", "exitlimit-redis-pool10000"]),
    # the Redis backend's cost: no limit, memory against Redis, one process
    "redis-overhead": Scenario(["--rate", "0"], None, ["exitlimit-high", "exitlimit-redis-high"]),
}


def ideal_seconds(sc: Scenario, args: argparse.Namespace, ok: int) -> float:
    """The time the origin needs at least to let ``ok`` pages through."""
    before = sc.capacity(args, args.rate)
    if sc.change is None:
        return ok / before + sc.pause
    at, rate = sc.change
    if ok <= before * at:
        return ok / before + sc.pause
    return at + (ok - before * at) / sc.capacity(args, rate) + sc.pause


def lab_call(origin: str, path: str, method: str = "GET") -> dict:
    data = b"" if method == "POST" else None
    req = urllib.request.Request(origin + path, method=method, data=data)
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
    return json.loads(body) if body.strip().startswith(b"{") else {}


def start_lab(args: argparse.Namespace) -> tuple[subprocess.Popen, dict]:
    sc = SCENARIOS[args.scenario]
    change = ["--rate-change", f"{sc.change[0]:g}={sc.change[1]:g}"] if sc.change else []
    lab_args = ["--exits", str(args.exits), "--rate", str(args.rate), "--burst", "1",
                "--retry-after", "1", "--origins", str(args.origins), *sc.lab_args, *change]
    print("lab: -m scrapy_exitlimit.lab", " ".join(lab_args), file=sys.stderr)
    return start_lab_process(*lab_args, stderr=None)


def origin_totals(origins: list[str]) -> dict:
    """The origins' own counts, summed over all of them."""
    status: Counter[str] = Counter()
    arrivals = 0
    for origin in origins:
        totals = lab_call(origin, "/_lab/stats")["totals"]
        status.update(totals["status"])
        arrivals += totals["arrivals"]
    return {"status": dict(status), "arrivals": arrivals}


def after_change(origins: list[str], at: float) -> tuple[int, int]:
    """(requests, 429s) the origins saw from ``at`` seconds after their first request on."""
    seen = limited = 0
    for origin in origins:
        start = lab_call(origin, "/_lab/stats").get("schedule_start")
        if start is None:
            continue
        for events in lab_call(origin, "/_lab/events").values():
            late = [status for t, status in events if t >= start + at]
            seen += len(late)
            limited += late.count(429)
    return seen, limited


#: --warm: each strategy runs cold (no state), then warm from what the cold run left: its
#: state file, and (Redis) the same Redis with new crawl processes; and (Redis) once more
#: with Redis emptied, from the state file alone
WARM_PHASES = ("cold", "warm")
REDIS_WARM_PHASES = ("cold", "warm", "warm-file")


def phases(name: str, args: argparse.Namespace) -> tuple[str, ...]:
    if not args.warm:
        return ("",)
    return REDIS_WARM_PHASES if "redis" in name else WARM_PHASES


def arrivals(origins: list[str]) -> list[tuple[float, int]]:
    """(time, status) of every request that reached the origins, from the lab."""
    return [e for origin in origins for ip_events in lab_call(origin, "/_lab/events").values()
            for e in ip_events]


def first_seconds(origins: list[str], seconds: float) -> tuple[int, int]:
    """(clean answers, 429s) the origins gave in their first ``seconds`` (from the first
    arrival at any of them)."""
    events = arrivals(origins)
    if not events:
        return 0, 0
    start = min(t for t, _ in events)
    early = [status for t, status in events if t < start + seconds]
    return early.count(200), early.count(429)


def ramp(origins: list[str]) -> tuple[float, float]:
    """(arrivals/s at the origins after the crawl's first second, and the seconds of that
    rate its first second lacked): a throughput split into what each request costs and
    what the start costs, both read off one run (slow start, Scrapy reading its start
    requests)."""
    times = sorted(t for t, _ in arrivals(origins))
    if len(times) < 2 or times[-1] - times[0] <= 1.0:
        return 0.0, 0.0
    start = times[0]
    early = sum(1 for t in times if t < start + 1.0)
    steady = (len(times) - early) / (times[-1] - start - 1.0)
    return steady, 1.0 - early / steady


def run_strategy(name: str, lab: dict, args: argparse.Namespace, run: int = 0,
                 phase: str = "") -> dict:
    origins = lab.get("origin_urls") or [lab["origin_url"]]
    sc = SCENARIOS[args.scenario]
    for origin in origins:
        lab_call(origin, "/_lab/reset", "POST")
    state = []
    if phase:  # a warm-start pair of runs: the state file the cold run leaves
        path = Path(args.state_dir) / f"{name}.{run}.json"
        if phase == "cold":
            path.unlink(missing_ok=True)
        if phase != "warm" and args.redis_server is not None:
            args.redis_server.flush()  # cold; or warm-file: Redis restarted empty
        state = ["--state-file", str(path)]
    pages = args.pages
    if name == "global-delay":  # one global delay crawls at 1/exits of the pool: keep it short
        pages = min(pages, args.global_delay_pages)
    # scenario shared runs 3 processes unless told; any other, one unless told
    procs = args.procs or (3 if args.scenario == "shared" else 1)
    share = pages // procs
    outage = None
    if args.outage and "redis" in name:
        outage = Outage(args.redis_server, *args.outage)
    runs = [subprocess.Popen(
        [sys.executable, str(HERE / "crawl_once.py"), "--strategy", name,
         "--origin", ",".join(origins),
         "--exits", ",".join(lab["exit_urls"]), "--rate", str(args.rate),
         "--pages", str(share if i < procs - 1 else pages - share * i),
         "--first", str(share * i), "--timeout", str(args.timeout), "--redis", args.redis,
         *(["--concurrent-items", str(args.concurrent_items)] if args.concurrent_items else []),
         *state, *(f"--set={kv}" for kv in args.set)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) for i in range(procs)]
    if outage is not None:
        outage.start()
    parts = []
    for i, proc in enumerate(runs):
        stdout, stderr = proc.communicate()
        if args.logs:
            Path(args.logs).mkdir(exist_ok=True)
            tag = f"{name}{'.' + phase if phase else ''}.{run}-{i}"  # one log per process and run
            (Path(args.logs) / f"{tag}.log").write_text(stderr)
        if proc.returncode != 0:
            sys.stderr.write(stderr[-3000:])
            raise SystemExit(f"strategy {name} failed")
        parts.append(json.loads(stdout.strip().splitlines()[-1]))
    result = merge(parts)
    if outage is not None:
        result.update(outage.finish())
    totals = origin_totals(origins)
    if args.events:
        Path(args.events).mkdir(exist_ok=True)
        events = {origin: lab_call(origin, "/_lab/events") for origin in origins}
        # one file per run (``name.K.json``), so a median's own run can be looked at
        (Path(args.events) / f"{name}{'.' + phase if phase else ''}.{run}.json").write_text(
            json.dumps(events if len(origins) > 1 else events[origins[0]]))
    responses = totals["arrivals"]
    # lost pages earn nothing
    ideal = ideal_seconds(sc, args, result["ok"]) if sc.capacity else 0.0
    if phase and sc.capacity:
        ok_1, limited_1 = first_seconds(origins, 1.0)
        ok_3, limited_3 = first_seconds(origins, 3.0)
        capacity = sc.capacity(args, args.rate)
        result.update(phase=phase, first_second_utilization=ok_1 / capacity,
                      first_second_429=limited_1, first_3s_utilization=ok_3 / (3 * capacity),
                      first_3s_429=limited_3)
    if not sc.capacity and args.scenario not in POOL_SCENARIOS:
        result["steady_rate"], result["ramp_seconds"] = ramp(origins)
    if sc.change is not None:
        seen, limited = after_change(origins, sc.change[0])
        result.update(after_change_requests=seen,
                      share_429_after_change=limited / seen if seen else 0.0)
    result.update(
        pages_per_s=result["ok"] / result["wall"],
        cpu_share=result["crawl_cpu"] / result["wall"] / procs if result["wall"] > 0 else 0.0,
        lost=pages - result["ok"],
        responses=responses,
        share_429=(totals["status"].get("429", 0) / responses) if responses else 0.0,
        per_page=responses / pages,
        ideal_seconds=ideal,
        utilization=ideal / result["wall"] if result["wall"] > 0 else 0.0,
    )
    return result


class Outage(threading.Thread):
    """Kills redis-server ``at`` seconds into the crawl and starts it again (empty)
    ``length`` seconds later; meanwhile samples the pool's learned rate in Redis, to
    tell how long after the restart it is back where it was."""

    def __init__(self, server, at: float, length: float) -> None:
        super().__init__(daemon=True)
        self.server, self.at, self.length = server, at, length
        self.samples: list[tuple[float, float]] = []  # (seconds since start, learned r/s)
        self.restarted = self.killed = 0.0
        self.done = threading.Event()

    def learned(self) -> float | None:
        import redis

        try:
            with redis.Redis(port=self.server.port, socket_timeout=0.5) as client:
                rates = [json.loads(client.hget(key, "blob") or b"null")
                         for key in client.keys("{exitlimit}:learn:*")]
        except (redis.RedisError, OSError):
            return None
        rates = [r["estimate"]["lo"] for r in rates if r]
        return max(rates) if rates else None

    def run(self) -> None:
        started = time.monotonic()
        while not self.done.is_set():
            t = time.monotonic() - started
            if not self.killed and t >= self.at:
                self.server.stop()
                self.killed = t
            elif self.killed and not self.restarted and t >= self.at + self.length:
                self.server.start()
                self.restarted = time.monotonic() - started
            if self.server.proc is not None:
                rate = self.learned()
                if rate is not None:
                    self.samples.append((time.monotonic() - started, rate))
            time.sleep(0.2)

    def finish(self) -> dict:
        self.done.set()
        self.join()
        if self.server.proc is None:
            self.server.start()
        before = [r for t, r in self.samples if t < self.killed]
        after = [(t, r) for t, r in self.samples if t >= self.restarted]
        level = before[-1] if before else None
        back = next((t - self.restarted for t, r in after if level and r >= level * 0.95),
                    None)
        return {"outage": [self.killed, self.restarted], "learned_before": level,
                "learned_back_after": back}


def merge(parts: list[dict]) -> dict:
    """Processes that crawled at once: their pages add up, the slowest one sets the time."""
    if len(parts) == 1:
        return parts[0]
    merged = dict(parts[0])
    for key in ("pages", "ok", "failed", "requests", "crawl_cpu"):
        merged[key] = sum(p[key] for p in parts)
    merged["wall"] = max(p["wall"] for p in parts)
    merged["exitlimit"] = {}
    for p in parts:
        for k, v in p["exitlimit"].items():
            if isinstance(v, (int, float)):
                merged["exitlimit"][k] = merged["exitlimit"].get(k, 0) + v
    return merged


def median_row(results: list[dict]) -> dict:
    """The run with the median wall time (the whole row, so its numbers belong together)."""
    ordered = sorted(results, key=lambda r: r["wall"])
    row = dict(ordered[len(ordered) // 2])
    row["runs"] = len(results)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exits", type=int, help="live exits (default: the scenario's, mostly 10)")
    ap.add_argument("--rate", type=float, help="per-IP r/s (default: the scenario's, mostly 5)")
    ap.add_argument("--pages", type=int, help="pages (default: the scenario's, mostly 500)")
    ap.add_argument("--origins", type=int, help="origins (default: the scenario's, mostly 1)")
    ap.add_argument("--global-delay-pages", type=int, default=100)
    ap.add_argument("--timeout", type=float,
                    help="CLOSESPIDER_TIMEOUT per crawl (default: the scenario's, mostly 300)")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="foundation")
    ap.add_argument("--strategies", help="comma-separated (default: the scenario's)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per strategy, alternating (A B, B A, A B, ...); the table shows "
                         "the median run")
    ap.add_argument("--json", help="also write the rows to this file (every run: *.runs.json)")
    ap.add_argument("--events", metavar="DIR",
                    help="save the origin's arrivals per strategy and run (NAME.RUN.json)")
    ap.add_argument("--logs", metavar="DIR", help="save each crawl process's log (BENCH_LOG "
                    "sets its level, WARNING by default)")
    ap.add_argument("--procs", type=int, default=0,
                    help="crawl processes at once on the same exits, each a share of the pages "
                         "(default: 3 in scenario shared, else 1)")
    ap.add_argument("--outage", type=float, nargs=2, metavar=("AT", "FOR"),
                    help="Redis strategies: kill redis-server AT s into each crawl, start it "
                         "again (empty) FOR s later")
    ap.add_argument("--concurrent-items", type=int, default=0, metavar="N",
                    help="CONCURRENT_ITEMS for every crawl (default: Scrapy's, 100)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a Scrapy setting for every crawl (repeatable)")
    ap.add_argument("--warm", action="store_true",
                    help="warm start: each strategy runs cold, then warm from the cold run's "
                         "state file (Redis: the same Redis, new processes; and Redis emptied, "
                         "the state file alone); adds the first seconds' figures")
    ap.add_argument("--state-dir", metavar="DIR", default="",
                    help="--warm: keep the state files here (NAME.RUN.json; default: a "
                         "temporary directory)")
    args = ap.parse_args()
    sc = SCENARIOS[args.scenario]
    for name in ("rate", "pages", "origins", "timeout", "exits"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(sc, name))
    strategies = args.strategies.split(",") if args.strategies else sc.strategies
    lab, info = start_lab(args)
    redis = None
    args.redis = ""
    if any("redis" in name for name in strategies):
        from scrapy_exitlimit.lab.redis_server import RedisServer

        redis = RedisServer()
        redis.start()
        args.redis = redis.url
    args.redis_server = redis
    rows_of = [(name, phase) for name in strategies for phase in phases(name, args)]
    runs: dict[str, list[dict]] = {f"{name} {phase}".strip(): [] for name, phase in rows_of}
    state_dir = (tempfile.TemporaryDirectory(prefix="exitlimit-bench-")
                 if args.warm and not args.state_dir else None)
    if state_dir is not None:
        args.state_dir = state_dir.name
    elif args.state_dir:
        Path(args.state_dir).mkdir(parents=True, exist_ok=True)
    try:
        for k in range(args.repeat):
            # alternating, in turn forwards and backwards (A B, B A, ...): the machine's
            # speed drifts (seen here: each run faster than the one before it for minutes),
            # and a drift that favours whoever runs second then favours each side alike
            names = strategies if k % 2 == 0 else strategies[::-1]
            for name, phase in [(n, p) for n in names for p in phases(n, args)]:
                r = run_strategy(name, info, args, k, phase)
                r["run"] = k
                row = f"{name} {phase}".strip()
                r["strategy"] = row
                runs[row].append(r)
                util = f", utilization {r['utilization']:.3f}" if sc.capacity else ""
                print(f"  {row}: {r['ok']}/{r['pages']} pages, {r['wall']:.1f}s, "
                      f"429 share {r['share_429']:.2%}{util}"
                      + (f", first second {r['first_second_utilization']:.2f} of capacity, "
                         f"{r['first_second_429']} 429s" if "first_second_429" in r else ""),
                      file=sys.stderr)
                if redis is not None and not args.warm:  # each run learns from scratch
                    redis.flush()
    finally:
        if state_dir is not None:
            state_dir.cleanup()
        lab.terminate()
        lab.wait(10)
        if redis is not None:
            redis.stop()
    rows = [median_row(rows) for rows in runs.values()]
    capacity = sc.capacity
    limit = f"{args.rate:g} r/s per IP (no burst), Retry-After 1" if capacity else "no limit"
    if sc.change:
        limit += f", {sc.change[1]:g} r/s per IP from {sc.change[0]:g} s"
    where = f"{args.origins} origins x " if args.origins > 1 else ""
    print(f"\nscenario {args.scenario}: {where}{args.exits} exits, {limit}, "
          f"median of {args.repeat}"
          + (f", healthy capacity {capacity(args, args.rate):g} r/s" if capacity else "")
          + (f" (lab {' '.join(sc.lab_args)})" if sc.lab_args else "")
          + (f"; ideal time includes the origin's {sc.pause:g} s pause" if sc.pause else "")
          + "\n")
    width = max(18, *(len(r["strategy"]) for r in rows))
    header = f"{'strategy':<{width}} {'pages':>6} {'lost':>6} {'429 share':>10} {'req/page':>9} " \
             f"{'wall s':>7} {'pages/s':>8} {'utilization':>12}"
    if sc.change:
        header += f" {'429 after':>10}"
    if args.warm:
        header += f" {'1st s util':>10} {'1st s 429':>9} {'3 s util':>8} {'3 s 429':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        util = f"{r['utilization']:>12.3f}" if capacity else f"{'-':>12}"
        line = f"{r['strategy']:<{width}} {r['pages']:>6} {r['lost']:>6} " \
               f"{r['share_429']:>10.2%} " \
               f"{r['per_page']:>9.2f} {r['wall']:>7.1f} {r['pages_per_s']:>8.1f} {util}"
        if sc.change:
            line += f" {r['share_429_after_change']:>10.2%}"
        if args.warm and "first_second_429" in r:
            line += (f" {r['first_second_utilization']:>10.3f} {r['first_second_429']:>9} "
                     f"{r['first_3s_utilization']:>8.3f} {r['first_3s_429']:>7}")
        print(line)
    if args.scenario in POOL_SCENARIOS:
        base = rows[0]
        for r in rows:
            print(f"{r['strategy']}: {r['pages_per_s'] / base['pages_per_s']:.3f} of "
                  f"{base['strategy']}'s throughput; CPU {1000 * r['cpu_seconds'] / r['ok']:.2f} "
                  f"ms per page; peak RSS {r['max_rss_mb']:.0f} MB")
    for r in rows:
        if r.get("outage"):
            back = r["learned_back_after"]
            print(f"{r['strategy']}: Redis killed at {r['outage'][0]:.1f} s, back at "
                  f"{r['outage'][1]:.1f} s"
                  + (f"; learned rate {r['learned_before']:.3g} r/s before, back "
                     + (f"{back:.1f} s after the restart" if back is not None else "never")
                     if r["learned_before"] and "learned" in r["strategy"] else ""))
    for r in rows:
        trips = r["exitlimit"].get("exitlimit/redis_round_trips")
        if trips:
            admitted = r["exitlimit"]["exitlimit/admitted"]
            ops = {k.removeprefix("exitlimit/redis_calls/"): v / admitted
                   for k, v in r["exitlimit"].items() if k.startswith("exitlimit/redis_calls/")}
            print(f"{r['strategy']}: {trips / admitted:.2f} Redis round trips per admission ("
                  + ", ".join(f"{op} {v:.2f}" for op, v in sorted(ops.items()))
                  + f"; admission calls granting nothing "
                  f"{r['exitlimit'].get('exitlimit/redis_admit_empty', 0) / admitted:.2f})")
    if not capacity and len(rows) >= 2 and args.scenario not in POOL_SCENARIOS:
        base_runs = runs[rows[0]["strategy"]]

        def median_of(key: str, strategy: str) -> float:
            return statistics.median(x[key] for x in runs[strategy])

        for r in rows[1:]:
            print(f"\nthroughput ratio {r['strategy']} / {rows[0]['strategy']}: "
                  f"{r['pages_per_s'] / rows[0]['pages_per_s']:.3f}")
            if args.repeat > 1:
                # each run against the baseline's run beside it (just before or after it):
                # the machine's speed drifts over seconds (here by 20-50 %), and adjacent
                # runs share it
                pairs = zip(runs[r["strategy"]], base_runs, strict=True)
                paired = sorted(mine["pages_per_s"] / theirs["pages_per_s"]
                                for mine, theirs in pairs)
                print(f"  paired runs: median {statistics.median(paired):.3f}, "
                      + ", ".join(f"{p:.3f}" for p in paired))
                # CPU-bound (a crawl's CPU near its wall time), throughput is CPU a page
                cpu = sorted(mine["crawl_cpu"] / mine["ok"] / (theirs["crawl_cpu"] / theirs["ok"])
                             for mine, theirs in zip(runs[r["strategy"]], base_runs, strict=True)
                             if mine["ok"] and theirs["ok"] and theirs["crawl_cpu"])
                print(f"  CPU a page, paired runs: median {statistics.median(cpu or [0]):.3f} of "
                      f"{rows[0]['strategy']}'s ("
                      + ", ".join(f"{c:.3f}" for c in cpu) + "); the crawl's CPU over its "
                      f"wall time: {median_of('cpu_share', r['strategy']):.2f} against "
                      f"{median_of('cpu_share', rows[0]['strategy']):.2f}")
            if r.get("steady_rate") and rows[0].get("steady_rate"):
                # medians over the runs: where the difference is (see ramp())
                print(f"  after the first second: {median_of('steady_rate', r['strategy']):.0f}"
                      f" r/s against {median_of('steady_rate', rows[0]['strategy']):.0f}; "
                      f"the first second lacked {median_of('ramp_seconds', r['strategy']):.2f}"
                      f" s of it against {median_of('ramp_seconds', rows[0]['strategy']):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
        every = Path(args.json).with_suffix(".runs.json")  # every run, not only the medians
        every.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
