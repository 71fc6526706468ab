"""The learner on every model origin at once (the simulator: the real core, no sockets).

A regression check, not a benchmark: each row's floor is a little under what the
learner reaches today (``python bench/sim.py`` prints the table). A change to the
learner that loses on one model fails here even when it wins on another; raise the
floors when a change earns it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from scrapy_exitlimit.sim import SCENARIOS, Crawl, OriginModel, Unlimited, run, simulate, table

#: (scenario, mode) -> (lowest utilization, highest 429 share): today's figures (seed 1),
#: less 0.04 of utilization and plus one point of 429s (none where there were none)
FLOORS = {
    ("per-ip", "learned"): (0.89, 0.016),
    ("per-ip", "known"): (0.94, 0.001),
    # (known: the 5 ms safety margin is a tenth of a 50 ms interval)
    ("per-ip-fast", "learned"): (0.89, 0.012),
    ("per-ip-fast", "known"): (0.87, 0.001),
    # ((0.88, 0.034) and (0.88, 0.031) until a site rate whose budget's margin keeps its
    # pace under what is known clean probed further up: now 0.912 at 3.7 % and 0.943 at
    # 3.2 %; on nginx the cold runs' 429 share stayed 1.6-2.1 %, warm runs 0.888 -> 0.939)
    ("site-wide", "learned"): (0.87, 0.047),
    # (known: 0.039 until the site's start left the first burst out: seed 1 3.85 -> 4.15 %,
    # seeds 1-8 3.44 % either way, 0.919 -> 0.924)
    ("site-wide", "known"): (0.86, 0.052),
    ("site-only", "learned"): (0.90, 0.042),
    ("mixed", "learned"): (0.74, 0.042),
    ("mixed", "known"): (0.79, 0.026),
    # (known: 0.79 at 7.4 % until a 429 after a pause, nothing taken lately, stopped
    # sending the pair to the floor rate, and a pair kept the pace it had just taken)
    ("given-high", "learned"): (0.94, 0.016),
    ("given-high", "known"): (0.81, 0.079),
    # (0.83, 3.7 % until the pool halved on a 429 wave over three exits or more; 0.86,
    # 2.6 % until jitter-like 429s among mostly clean answers were the pool's, not the
    # site's)
    ("tighten", "learned"): (0.84, 0.035),
    ("tighten", "known"): (0.77, 0.109),
    ("loosen", "learned"): (0.79, 0.018),
    ("loosen", "known"): (0.81, 0.001),
    # (seed 1 was 0.886 until the origin budget re-anchored on arrivals, then 0.80, and
    # 0.72 since a lone 429 is checked from below; seeds 1-8 average 0.765 -> 0.775 with
    # that change: seed 1 moved, not the model; 0.86 since 429s at the pool's pace among
    # mostly clean answers are the pool's: the site budget had held the origin down)
    # (0.842 over seeds 1-8 until a far leap proved 8 r/s in an eighth of a second;
    # 0.96 until the jump after it: seed 1 0.985 -> 0.936, seeds 1-8 0.884 -> 0.949)
    ("burst", "learned"): (0.89, 0.041),
    ("burst", "known"): (0.94, 0.001),
    # (12.6 % and 13 % until the model client's CPU load reached the limiter: up to eight
    # requests per exit had been on their way into a window's wall)
    ("fixed-window", "learned"): (0.74, 0.107),
    ("fixed-window", "known"): (0.97, 0.001),
    ("sliding-window", "learned"): (0.68, 0.112),
    ("sliding-window", "known"): (0.97, 0.001),
    ("jitter-small", "learned"): (0.75, 0.015),
    ("jitter-small", "known"): (0.78, 0.015),
    # (1.19 % until a leap tried twice the start rate at once: seed 1's pool then stays
    # at 4.24 r/s, a lone 429 every second or two; seeds 1-8 1.11 -> 1.21 %, 0.420 -> 0.439)
    ("jitter-large", "learned"): (0.39, 0.03),
    ("jitter-large", "known"): (0.45, 0.024),
    # (0.644 once the model sent requests behind the client's queued work, while a
    # pair's slower pace counted from its cold first request's admission, not its answer:
    # an origin halved to 0.5 r/s on one 429 and finished seconds after the rest)
    # (0.058 until an origin with a small share of the crawl stopped refining under its
    # last 429: seed 1 4.8 -> 3.85 %)
    ("broad", "learned"): (0.9, 0.049),
    ("broad", "known"): (1.0, 0.001),
    # (0.83 until the far leap: seed 1 at 0.931 -> 0.966)
    ("unlimited", "learned"): (0.92, 0.001),
    ("unlimited", "known"): (0.96, 0.001),
}


@pytest.fixture(scope="module")
def rows():
    return {(r.scenario, r.mode): r for r in table()}


def test_every_model_and_mode_has_a_floor(rows):
    assert set(rows) == set(FLOORS)


@pytest.mark.parametrize("key", sorted(FLOORS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_no_page_is_lost_and_no_model_regresses(rows, key):
    row = rows[key]
    least, most_429 = FLOORS[key]
    assert row.lost == 0
    assert row.utilization >= least, f"{key}: utilization {row.utilization:.3f} < {least}"
    assert row.share_429 <= most_429, f"{key}: 429 share {row.share_429:.4f} > {most_429}"


def test_the_simulation_is_deterministic():
    scenario = next(s for s in SCENARIOS if s.name == "mixed")
    first, second = simulate(scenario.build(0.3)), simulate(scenario.build(0.3))
    assert (first.ok, first.requests, first.wall) == (second.ok, second.requests, second.wall)


@pytest.mark.parametrize("name", ["broad", "mixed", "tighten", "jitter-small", "unlimited"])
def test_a_rescan_narrowed_to_the_exits_released_admits_exactly_as_a_full_one(
        name, monkeypatch):
    """After a failed scan, until the time it gave, the limiter judges only the exits
    released since (``Limiter._scan``): every answer at the same time with the same
    status as with every exit judged each time, in far fewer judgements."""
    from scrapy_exitlimit.core import selector
    from scrapy_exitlimit.sim.crawl import _Sim

    judged = [0]

    def counting(judge):
        def counted(*args, **kwargs):
            judged[0] += 1
            return judge(*args, **kwargs)
        return counted

    # the scan judges an exit's pair after settling the exit itself; the heap, whole
    monkeypatch.setattr(selector, "judge_pair", counting(selector.judge_pair))
    monkeypatch.setattr(selector, "judge", counting(selector.judge))
    scenario = next(s for s in SCENARIOS if s.name == name)
    runs = {}
    for narrow in (False, True):
        judged[0] = 0
        sim = _Sim(scenario.build(0.3))
        sim.limiter.narrow_rescans = narrow
        result = sim.run()
        runs[narrow] = (result.answers, result.requests, judged[0])
    assert runs[True][:2] == runs[False][:2] and len(runs[True][0]) > 100
    assert runs[True][2] < runs[False][2] * (0.5 if name == "broad" else 1.0)


def test_a_bare_crawl_hammers_where_the_limiter_paces():
    """The model origin is strict: without the limiter the same crawl draws 429s."""
    from scrapy_exitlimit.sim import Gcra

    model = {"http://site.test": OriginModel(per_ip=lambda: Gcra(5.0))}
    bare = simulate(Crawl(model, 200, strategy="bare"))
    model = {"http://site.test": OriginModel(per_ip=lambda: Gcra(5.0))}
    paced = simulate(Crawl(model, 200, rate=5.0))
    assert bare.share_429 > 0.5 and paced.share_429 == 0.0
    assert paced.ok == bare.ok == 200


def test_without_a_limit_the_bare_crawl_is_the_yardstick():
    model = {"http://site.test": OriginModel(per_ip=Unlimited)}
    bare = simulate(Crawl(model, 500, strategy="bare"))
    assert bare.status == {200: 500} and bare.wall > 0


def test_the_simulated_client_reads_its_cpu_load_as_the_middleware_does():
    """The model client does one thing at a time (2 ms a request): a crawl with no limit
    keeps it saturated, and the limiter hears so on clean answers (``CpuLoad``, as the
    middleware reads it), so each exit's in-flight limit shrinks to one request; the same
    crawl with the reading ignored grows them to the ceiling, every request past the
    start waiting in the client (a window's wall then met up to eight requests per exit
    on their way: 11.2 % of 429s against 9.3 %)."""
    from scrapy_exitlimit.core.health import BUSY_LIMIT
    from scrapy_exitlimit.sim.crawl import _Sim

    def limits(heeded: bool) -> tuple[list[bool], int]:
        sim = _Sim(Crawl({"http://site.test": OriginModel(per_ip=Unlimited)}, 2000))
        heard, read = [], sim.limiter.cpu_bound
        sim.limiter.cpu_bound = lambda busy: (heard.append(busy), heeded and read(busy))
        sim.run()
        return heard, max(state.limit for state in sim.limiter.exits.values())

    heard, heeded = limits(True)
    assert heard[-1] and heeded == BUSY_LIMIT
    heard, ignored = limits(False)
    assert heard[-1] and ignored == 8  # Crawl.per_exit, the ceiling


def test_the_simulated_downloader_is_narrowed_while_the_client_is_busy():
    """As the middleware narrows Scrapy's downloader (``room.py``): saturated, the client
    holds what is in flight and EXITLIMIT_BUSY_ROOM more, not the 96 the add-on sized,
    and still loses nothing; with the room 0 it keeps the 96. A broad crawl's origins
    (1 r/s per IP, the client saturated at 250 r/s) park in 30 queues that get the room
    each: more than 96, so it is never narrowed, and runs as it did."""
    from scrapy_exitlimit.sim.crawl import _Sim

    def lowest(crawl: Crawl) -> tuple[int, int, int]:
        sim = _Sim(crawl)
        seen, narrow = [], sim.narrow
        sim.narrow = lambda busy: (narrow(busy), seen.append(sim.slots))
        result = sim.run()
        assert result.lost == 0
        return min(seen), sim.configured_slots, result.ok

    def unlimited(**kw) -> Crawl:
        return Crawl({"http://site.test": OriginModel(per_ip=Unlimited)}, 2000, **kw)

    def broad(room: int) -> Crawl:  # a fresh build each run: the models keep state
        crawl = scenario("broad").build(0.25)
        return replace(crawl, network=replace(crawl.network, cpu=0.004), busy_room=room)

    narrowed, configured, ok = lowest(unlimited())
    assert configured == 96 and ok == 2000 and narrowed <= 10 * 1 + 16 + 4
    assert lowest(unlimited(busy_room=0))[0] == 96
    assert lowest(broad(16))[0] == 96
    assert simulate(broad(16)) == simulate(broad(0))  # the same crawl, event for event
    assert lowest(broad(1))[0] < 96  # (a room of one is not enough for 30 queues)


def scenario(name: str):
    return next(s for s in SCENARIOS if s.name == name)


def test_jitter_at_a_per_ip_limit_is_not_taken_for_a_site_limit():
    """Arrival jitter at the pool's per-IP limit draws 429s now and then, on any exit, at
    paces the pairs ran clean: three exits within the blame window read as a site limit
    (these seeds learned a site rate of 31-32 r/s), and the site budget held the origin
    down. Among mostly clean answers they are the pool's; a site the pool's pace went
    past refuses a good share, and is still learned as one."""
    for seed in (6, 7, 8):
        run = simulate(replace(scenario("jitter-small").build(0.5), seed=seed))
        assert run.lost == 0
        assert [e.get("site") for e in run.learned.values()] == [None], seed
    site_wide = simulate(scenario("site-wide").build(0.5))
    assert all(e.get("site") for e in site_wide.learned.values())


def test_jitter_at_a_given_rate_is_not_taken_for_a_site_limit():
    """The same with the rate given (EXITLIMIT_RATE): 429s that arrival jitter draws at
    the configured pace, among mostly clean answers, lower the pairs under it (a given
    rate is a ceiling); they had read as a site limit in 14 seeds of 20, and the lab's
    known-rate crawl then ran at the 38 r/s site rate it learned (0.71 of 50). A site
    limit under the given pairs' pace is still learned."""
    for seed in (1, 2, 4):
        run = simulate(replace(scenario("jitter-small").build(0.5), seed=seed, rate=5.0))
        assert run.lost == 0
        assert [e.get("site") for e in run.learned.values()] == [None], seed
    site_wide = simulate(replace(scenario("site-wide").build(0.5), rate=5.0))
    assert all(e.get("site") for e in site_wide.learned.values())


def test_two_slow_exits_that_scouted_first_give_the_pool_back_as_soon_as_it_outpaces_them():
    """Seed 15 of the mixed pool: both 1 r/s exits draw the first 429s (at the 2 r/s
    start), so their ceiling becomes the pool's. The pool climbs under a ceiling set at
    the start rate one confirmation a step (not three), and once the other exits run
    clean 1.2 times faster than then, a 429 on either at the pool's pace is its own limit
    at once: by 2.5 s both are marked slower and the pool slow-starts again (it stayed
    under their ceiling until 5.5 s when each waited out a strike first, and at 1.41 r/s
    until past 4 s with three confirmations a step); by 3.5 s it runs at 4.7 r/s (by 3 s
    until the check under a lone 429 took three confirmations, as near a ceiling: that 429
    may be the ceiling). No leap: the scout alone, as when the leap too is a slow exit."""
    alone = {"start_leap": 1.0}
    run = simulate(replace(scenario("mixed").build(1.0), seed=15, time_limit=2.5,
                           tuning=alone))
    learned = run.learned["http://site.test"]
    assert sorted(learned["pairs"]) == ["127.0.0.10:8000", "127.0.0.11:8000"]
    assert learned["pool"]["ceiling"] is None
    later = simulate(replace(scenario("mixed").build(1.0), seed=15, time_limit=3.5,
                             tuning=alone))
    assert later.learned["http://site.test"]["pool"]["clean"] > 4.0


def test_a_tuning_override_reaches_the_limiter_and_changes_only_what_it_names():
    """``bench/sim.py --set start_rate=4``: the knob reaches the learner (a start rate of
    4 r/s is proven where 2 r/s was: more pages in the first second against no limit),
    and a run without it is the crawl defaults' run, number for number."""
    unlimited = scenario("unlimited")
    default = run(unlimited, "learned", 0.1)
    assert run(unlimited, "learned", 0.1, tuning={}) == default
    faster = run(unlimited, "learned", 0.1, tuning={"start_rate": 4.0})
    assert faster.ok == default.ok
    assert faster.wall < default.wall


@pytest.fixture(scope="module")
def bench_sim():
    """``bench/sim.py``, a script, loaded as a module."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_sim", Path(__file__).parent.parent / "bench" / "sim.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_seeds_table_is_the_mean_of_each_seed_run(bench_sim):
    (row,) = bench_sim.seeds_table(0.1, ["per-ip"], 2, {}, 1)[:1]
    one, two = (run(scenario("per-ip"), "learned", 0.1, seed) for seed in (1, 2))
    assert (row.scenario, row.mode, row.ok, row.lost) == ("per-ip", "learned",
                                                          one.ok + two.ok, one.lost + two.lost)
    assert row.utilization == pytest.approx((one.utilization + two.utilization) / 2)
    assert row.share_429 == pytest.approx((one.share_429 + two.share_429) / 2)
    with pytest.raises(SystemExit, match="start_rate"):
        bench_sim.parse_tuning(["start_rat=4"])
    assert bench_sim.parse_tuning(["start_rate=4"]) == {"start_rate": 4.0}


def test_the_warm_table_runs_each_crawl_on_origins_built_anew(bench_sim):
    """The origin models keep their limiters' state: a warm run on the cold run's models
    (as ``bench/sim.py --warm`` once did) met per-IP limits still counting the cold run's
    last requests, and drew 10 429s in its first second instead of none."""
    lines = bench_sim.warm_table(0.3, ["per-ip"], 1).splitlines()
    warm = next(line.split() for line in lines if line.split()[:2] == ["per-ip", "warm"])
    first_second_429 = int(warm[5])
    assert first_second_429 == 0


@pytest.mark.parametrize("name", ["mixed", "site-wide", "jitter-small"])
def test_an_exit_search_paces_and_holds_as_the_learner_says(name, monkeypatch):
    """An exit search reads the learner once (``PoolPacing``), not once per exit: over a
    crawl with discovery, scouts, leaps and pairs with limits of their own, every pace
    and every hold it made is what the learner itself says for that pair."""
    import math

    from scrapy_exitlimit.core import limiter as limiter_module
    from scrapy_exitlimit.sim.crawl import _Sim

    rules = limiter_module._OriginRules
    real_pace, real_awaits = rules.pace, rules.awaits_answer
    seen = {"own": 0, "special": 0, "plain": 0, "held": 0, "near": 0}

    def pace(self, exit_id, pair):
        rate = real_pace(self, exit_id, pair)
        learner = self._learner
        assert rate == learner.pair_rate(exit_id, pair.learning) * self._share
        near = learner.near_limit(pair.learning)
        assert bool(pair.answer_wait) == bool(pair.spread and near)
        kind = "own" if pair.learning.own is not None else \
            "special" if exit_id in (learner.scout, learner.leap) else "plain"
        seen[kind] += 1
        seen["near"] += near
        return rate

    def awaits_answer(self, exit_id, pair, now):
        held = real_awaits(self, exit_id, pair, now)
        learner = self._learner
        assert held == (pair.single_file or learner.holds(
            exit_id, pair.learning, pair.last_admit > -math.inf) or (
            pair.in_flight > 0 and learner.wary(pair.learning, now)))
        seen["held"] += held
        return held

    monkeypatch.setattr(rules, "pace", pace)
    monkeypatch.setattr(rules, "awaits_answer", awaits_answer)
    scenario = next(s for s in SCENARIOS if s.name == name)
    result = _Sim(scenario.build(0.3)).run()
    assert result.ok > 100
    assert all(seen[k] > 0 for k in ("special", "plain", "held", "near")), seen
    if name == "mixed":  # its slow exits learn limits of their own
        assert seen["own"] > 0, seen
