"""The origin models a learner change is judged on, all at once.

Each scenario builds a :class:`Crawl` and says what the origin allowed: a
capacity in requests/s, or the ideal time for its pages when the limit moves.
``utilization`` is that ideal over the simulated wall time; on an origin with
no limit it is the throughput against a bare crawl (random exit, no limiter)
of the same pages in the same simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from .crawl import Crawl, Network, Result, exit_ip, origin_names, simulate
from .origins import FixedWindow, Gcra, OriginModel, Scheduled, SlidingWindow, Unlimited


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    build: Callable[[float], Crawl]  # scale (1.0: the long version) -> crawl
    #: ideal seconds for ``ok`` pages (None: compare with a bare crawl)
    ideal: Callable[[int], float] | None
    known_rate: float | None = None  # the per-IP rate a user would configure
    #: 429 share counted from this time on (a limit that moves: after the move)
    share_from: float = 0.0


def _per_ip(rate: float, burst: int = 1) -> Callable[[], Gcra]:
    return lambda: Gcra(rate, burst)


def _pages(n: int, scale: float) -> int:
    return max(20, int(n * scale))


def _single(model: Callable[[], OriginModel], pages: int, **kw: object) -> Callable[[float], Crawl]:
    return lambda scale: Crawl({"http://site.test": model()}, _pages(pages, scale), **kw)


def _moving(before: float, after: float, at: float) -> Callable[[], OriginModel]:
    return lambda: OriginModel(per_ip=lambda: Scheduled([(0.0, Gcra(before)),
                                                         (at, Gcra(after))]))


def _moving_ideal(before: float, after: float, at: float, exits: int = 10
                  ) -> Callable[[int], float]:
    def ideal(ok: int) -> float:
        early = before * exits * at  # pages the old limit allowed before the move
        if ok <= early:
            return ok / (before * exits)
        return at + (ok - early) / (after * exits)
    return ideal


def _mixed() -> OriginModel:
    slow = {exit_ip(0): _per_ip(1.0), exit_ip(1): _per_ip(1.0)}
    return OriginModel(per_ip=_per_ip(5.0), per_ip_override=slow, banned=frozenset({exit_ip(8)}))


def _broad(scale: float) -> Crawl:
    models = {name: OriginModel(per_ip=_per_ip(1.0)) for name in origin_names(30)}
    return Crawl(models, _pages(100, scale))


SCENARIOS = [
    Scenario("per-ip", "10 exits, 5 r/s per IP, strict", _single(
        lambda: OriginModel(per_ip=_per_ip(5.0)), 1000), lambda ok: ok / 50, 5.0),
    Scenario("per-ip-fast", "10 exits, 20 r/s per IP, strict", _single(
        lambda: OriginModel(per_ip=_per_ip(20.0)), 3000), lambda ok: ok / 200, 20.0),
    Scenario("site-wide", "20 r/s for the site, 5 r/s per IP", _single(
        lambda: OriginModel(per_ip=_per_ip(5.0), site=Gcra(20.0)), 600), lambda ok: ok / 20, 5.0),
    Scenario("site-only", "20 r/s for the site, no per-IP limit", _single(
        lambda: OriginModel(site=Gcra(20.0)), 600), lambda ok: ok / 20),
    Scenario("mixed", "2 exits at 1 r/s (one scouts first), 1 banned, 1 dead, rest 5", _single(
        _mixed, 600, dead=1), lambda ok: ok / 37, 5.0),
    Scenario("tighten", "5 -> 2 r/s per IP at 6 s", _single(_moving(5.0, 2.0, 6.0), 1000),
             _moving_ideal(5.0, 2.0, 6.0), 5.0, share_from=6.0),
    Scenario("loosen", "2 -> 5 r/s per IP at 6 s", _single(_moving(2.0, 5.0, 6.0), 1000),
             _moving_ideal(2.0, 5.0, 6.0), 5.0, share_from=6.0),
    Scenario("given-high", "2 r/s per IP, 5 given (known: a rate given too high)", _single(
        lambda: OriginModel(per_ip=_per_ip(2.0)), 1000), lambda ok: ok / 20, 5.0),
    Scenario("burst", "5 r/s per IP, burst 5", _single(
        lambda: OriginModel(per_ip=_per_ip(5.0, 5)), 1000), lambda ok: ok / 50, 5.0),
    Scenario("fixed-window", "20 per 10 s per IP, fixed windows", _single(
        lambda: OriginModel(per_ip=lambda: FixedWindow(20, 10.0)), 600),
        lambda ok: ok / 20, 2.0),
    Scenario("sliding-window", "20 per 10 s per IP, sliding", _single(
        lambda: OriginModel(per_ip=lambda: SlidingWindow(20, 10.0)), 600),
        lambda ok: ok / 20, 2.0),
    Scenario("jitter-small", "5 r/s per IP, 20 ms + U(0, 60 ms) on the way", _single(
        lambda: OriginModel(per_ip=_per_ip(5.0)), 1000,
        network=Network(base=0.02, jitter=0.06, back=0.02)), lambda ok: ok / 50, 5.0),
    Scenario("jitter-large", "5 r/s per IP, 50 ms + U(0, 300 ms) on the way", _single(
        lambda: OriginModel(per_ip=_per_ip(5.0)), 1000,
        network=Network(base=0.05, jitter=0.3, back=0.05)), lambda ok: ok / 50, 5.0),
    Scenario("broad", "30 origins x 1 r/s per IP, interleaved", _broad,
             lambda ok: ok / 300, 1.0),
    Scenario("unlimited", "no limit (throughput against a bare crawl)", _single(
        lambda: OriginModel(per_ip=Unlimited), 3000), None, 1000.0),
]


@dataclass
class Row:
    scenario: str
    mode: str
    ok: int
    lost: int
    share_429: float
    utilization: float
    wall: float


def run(scenario: Scenario, mode: str, scale: float = 1.0, seed: int = 1,
        tuning: dict[str, float] | None = None) -> Row:
    """``mode``: "learned" (no rate given) or "known" (the per-IP rate given);
    ``tuning``: control-law knobs over the crawl defaults (``Crawl.tuning``)."""
    crawl = replace(scenario.build(scale), seed=seed, tuning=dict(tuning or {}))
    if mode == "known":
        crawl = replace(crawl, rate=scenario.known_rate)
    result = simulate(crawl)
    if scenario.ideal is not None:
        utilization = scenario.ideal(result.ok) / result.wall if result.wall else 0.0
    else:
        bare = simulate(replace(crawl, strategy="bare", rate=None))
        utilization = (result.ok / result.wall) / (bare.ok / bare.wall) if result.wall else 0.0
    share = result.share_429_after(scenario.share_from) if scenario.share_from else \
        result.share_429
    return Row(scenario.name, mode, result.ok, result.lost, share,
               utilization if math.isfinite(utilization) else 0.0, result.wall)


def table(scale: float = 1.0, names: list[str] | None = None, seed: int = 1,
          tuning: dict[str, float] | None = None) -> list[Row]:
    return [run(scenario, mode, scale, seed, tuning) for scenario, mode in jobs(names)]


def jobs(names: list[str] | None = None) -> list[tuple[Scenario, str]]:
    """(scenario, mode) for every row of the table: learned, and known where a user
    could give the rate."""
    out = []
    for scenario in SCENARIOS:
        if names and scenario.name not in names:
            continue
        out.append((scenario, "learned"))
        if scenario.known_rate is not None:
            out.append((scenario, "known"))
    return out


def mean_rows(rows: list[Row]) -> Row:
    """One scenario and mode over several seeds: utilization, 429 share and wall time
    averaged, pages counted."""
    n = len(rows)
    return Row(rows[0].scenario, rows[0].mode, sum(r.ok for r in rows),
               sum(r.lost for r in rows), sum(r.share_429 for r in rows) / n,
               sum(r.utilization for r in rows) / n, sum(r.wall for r in rows) / n)


def format_table(rows: list[Row]) -> str:
    lines = [f"{'scenario':16} {'mode':8} {'ok':>5} {'lost':>5} {'429 %':>7} "
             f"{'util':>6} {'wall s':>7}"]
    for r in rows:
        lines.append(f"{r.scenario:16} {r.mode:8} {r.ok:5d} {r.lost:5d} "
                     f"{100 * r.share_429:7.2f} {r.utilization:6.3f} {r.wall:7.1f}")
    return "\n".join(lines)


__all__ = ["SCENARIOS", "Result", "Row", "Scenario", "format_table", "jobs", "mean_rows", "run",
           "table"]
