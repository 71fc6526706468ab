"""Warm start (EXITLIMIT_STATE_FILE): what is remembered, what is recalled, what the file
holds and survives. Arithmetic on a fake clock and the simulator; no sockets."""

from __future__ import annotations

import json
import logging
import math
import random
from dataclasses import replace

import pytest
from scrapy.settings import Settings

from scrapy_exitlimit.config import ExitLimitConfig
from scrapy_exitlimit.core import Limiter, Limits, Tuning, make_exit
from scrapy_exitlimit.core.learning import RateEstimate
from scrapy_exitlimit.core.warm import recall, remember
from scrapy_exitlimit.sim import Gcra, OriginModel
from scrapy_exitlimit.sim.crawl import Crawl, simulate
from scrapy_exitlimit.state_file import (
    FORMAT,
    StateFile,
    StateFileError,
    dump,
    merge,
    merge_scopes,
    parse,
    read,
    show,
)

from .conftest import FakeClock
from .test_core_learner import drive

SITE = "http://site.test"
DAY = 86400.0


def limiter(clock: FakeClock, n: int = 4, first: int = 0, rate: float | None = None) -> Limiter:
    exits = [make_exit(f"http://127.0.0.{10 + i}:3128") for i in range(first, first + n)]
    return Limiter(exits, Limits(rate=rate, concurrency=4), clock=clock,
                   tuning=Tuning(margin=0.005), rng=random.Random(7))


def learned(clock: FakeClock, model: OriginModel, seconds: float = 30.0, **kw) -> Limiter:
    lim = limiter(clock, **kw)
    drive(lim, clock, model, seconds)
    return lim


def estimate(clean: float, ceiling: float | None = None, at: float = 0.0) -> dict:
    return {"clean": clean, "ceiling": ceiling, "seen": ceiling, "settled": False,
            "drift": None}


# -- one estimate -----------------------------------------------------------------------
def test_a_recalled_rate_is_proven_at_the_clean_rate_its_ceiling_without_drift():
    est = RateEstimate(2.0, floor=0.05, ceiling=1000.0, proven=False)
    est.recall({"clean": 4.8, "ceiling": 5.6, "seen": 5.05, "settled": True, "drift": 0.002},
               now=7.0)
    assert est.proven and est.lo == 4.8 and est.target() == 4.8  # converged: no probe
    assert est.hi == 5.05  # where the 429 found it: the drift of 5.05 -> 5.6 is not carried
    assert est.settled and est.changed_at == 7.0 and est.drift_rate == 0.002


def test_a_recalled_rate_stays_within_this_runs_floor_and_ceiling():
    est = RateEstimate(2.0, floor=0.5, ceiling=3.0, proven=False)
    est.recall({"clean": 4.8, "ceiling": None}, now=0.0)
    assert est.lo == 3.0 and est.hi is None
    est = RateEstimate(2.0, floor=0.5, ceiling=3.0, proven=False)
    est.recall({"clean": 0.01, "ceiling": 0.02, "seen": 0.02}, now=0.0)
    assert est.lo == 0.5 and est.hi == 0.5


def test_a_rate_is_remembered_as_the_pace_it_was_with_the_jitter_allowance_folded_in():
    est = RateEstimate(5.0, hi=5.2, seen=5.2)
    got = est.remembered(allowance=0.002)  # 200 ms + 2 ms between requests
    assert got["clean"] == pytest.approx(1 / 0.202)
    assert got["seen"] == pytest.approx(1 / (1 / 5.2 + 0.002))


def test_what_a_run_did_not_learn_anew_is_remembered_as_it_was_recalled():
    est = RateEstimate(2.0, proven=False)
    data = {"clean": 4.9, "ceiling": 5.2, "seen": 5.2, "settled": False, "drift": None}
    est.recall(data, now=0.0)
    again = est.remembered(allowance=0.003)  # folded once already: not twice
    assert again["clean"] == 4.9 and again["seen"] == 5.2
    est.confirmed(5.0, now=1.0)  # learned anew in this run: this run's pace
    assert est.remembered(allowance=0.003)["clean"] == pytest.approx(1 / (0.2 + 0.003))


# -- a limiter --------------------------------------------------------------------------
def test_a_warm_limiter_skips_discovery_and_paces_every_exit_at_the_learned_rate():
    clock = FakeClock(0.0)
    cold = learned(clock, OriginModel(per_ip=lambda: Gcra(5.0)))
    state = remember(cold, offset=1000.0)
    pool = state[SITE]["pool"]
    assert 4.5 <= pool["clean"] <= 5.2, pool
    assert state[SITE]["at"] == pytest.approx(1000.0 + clock.now, abs=1.0)

    clock2 = FakeClock(50.0)
    warm = limiter(clock2)
    got = recall(warm, state, wall_now=1100.0, max_age=DAY)
    assert got.origins == [SITE]
    learner = warm.origin_state(SITE).learner
    assert learner.pool.proven and learner.pool.lo == pool["clean"]
    # every exit within one interval (staggered over it, not in step), each at the
    # learned pace: no scout, no slow start
    interval = 1 / pool["clean"]
    leases = []
    while clock2.now < 50.0 + interval:
        got = warm.try_admit(SITE)
        if isinstance(got, float):
            clock2.now = got
        else:
            leases.append((clock2.now, got))
    assert len({lease.exit_id for _, lease in leases}) == 4
    starts = sorted(at for at, _ in leases)
    gaps = [round(b - a, 6) for a, b in zip(starts, starts[1:], strict=False)]
    assert gaps == [round(interval / 4, 6)] * 3
    assert {lease.rate for _, lease in leases} == {pool["clean"]}
    assert learner.scout is None


def test_the_site_rate_is_recalled_with_the_pool_and_the_budget_paces_from_the_first_request():
    clock = FakeClock(0.0)
    cold = learned(clock, OriginModel(per_ip=lambda: Gcra(5.0), site=Gcra(8.0)), 40.0)
    state = remember(cold, offset=0.0)
    assert state[SITE]["site"] is not None, state
    warm = limiter(FakeClock(0.0))
    recall(warm, state, wall_now=clock.now, max_age=DAY)
    ostate = warm.origin_state(SITE)
    assert ostate.learner.site_rate() == pytest.approx(state[SITE]["site"]["clean"], rel=0.07)
    first = warm.try_admit(SITE)
    assert not isinstance(first, float)
    bucket = ostate.budget.bucket
    assert bucket is not None and bucket.rate == ostate.learner.site_rate()


def test_stale_origins_and_pairs_are_ignored():
    entry = {"at": 0.0, "pool": estimate(4.0), "site": None,
             "pairs": {make_exit("http://127.0.0.10:3128").id: {"at": 0.0,
                                                                  "own": estimate(1.0, 1.1)}}}
    fresh = {**entry, "at": 90_000.0, "pairs": {
        make_exit("http://127.0.0.11:3128").id: {"at": 0.0, "own": estimate(1.0, 1.1)}}}
    lim = limiter(FakeClock(0.0))
    got = recall(lim, {"http://old.test": entry, SITE: fresh}, wall_now=100_000.0,
                 max_age=DAY)
    assert got.origins == [SITE] and got.stale_origins == 1 and got.stale_pairs == 1
    assert "http://old.test" not in lim.origins
    # the stale pair was not recalled
    assert all(p.own_limit is None for p in lim.origin_state(SITE).pairs.values())


def test_pairs_of_exits_no_longer_in_the_pool_are_dropped_and_the_rest_recalled():
    clock = FakeClock(0.0)
    slow = make_exit("http://127.0.0.10:3128").id
    state = {SITE: {"at": 10.0, "pool": estimate(5.0, 5.2), "site": None, "pairs": {
        slow: {"at": 10.0, "own": estimate(1.0, 1.05)},
        make_exit("http://127.0.0.99:3128").id: {"at": 10.0, "own": estimate(2.0, 2.1)}}}}
    lim = limiter(clock)  # 127.0.0.10 .. 13: .99 left the pool
    got = recall(lim, state, wall_now=20.0, max_age=DAY)
    assert got.pairs == 1 and got.gone_pairs == 1
    own = lim.pair_state(SITE, slow).own_limit
    assert own is not None and own.proven and own.lo == 1.0
    # a new pool (other exits): the pool's rate still holds, no pair is recalled
    other = limiter(clock, first=20)
    got = recall(other, state, wall_now=20.0, max_age=DAY)
    assert got.origins == [SITE] and got.pairs == 0 and got.gone_pairs == 2
    assert other.origin_state(SITE).learner.pool.lo == 5.0


def test_a_slow_exit_is_remembered_with_its_own_rate_and_recalled_so():
    clock = FakeClock(0.0)
    slow_ip = "127.0.0.10"
    model = OriginModel(per_ip=lambda: Gcra(5.0), per_ip_override={slow_ip: lambda: Gcra(1.0)})
    cold = learned(clock, model, 60.0)
    state = remember(cold, offset=0.0)
    slow = make_exit(f"http://{slow_ip}:3128").id
    assert slow in state[SITE]["pairs"], state
    assert state[SITE]["pairs"][slow]["own"]["clean"] <= 1.05
    warm = limiter(FakeClock(0.0))
    recall(warm, state, wall_now=clock.now, max_age=DAY)
    assert warm.pair_state(SITE, slow).own_limit.lo <= 1.05


def test_an_origin_only_recalled_is_not_remembered_again_with_a_new_time():
    state = {SITE: {"at": 5.0, "pool": estimate(5.0), "site": None, "pairs": {}}}
    lim = limiter(FakeClock(0.0))
    recall(lim, state, wall_now=10.0, max_age=DAY)
    assert remember(lim, offset=100.0) == {}  # not crawled: the file's entry stands


def test_a_configured_rate_keeps_its_ceiling_when_a_lower_rate_is_recalled():
    exit_id = make_exit("http://127.0.0.10:3128").id
    state = {SITE: {"at": 5.0, "pool": None, "site": None, "pairs": {
        exit_id: {"at": 5.0, "own": estimate(3.0, 3.3)}}}}
    lim = limiter(FakeClock(0.0), rate=4.0)
    recall(lim, state, wall_now=10.0, max_age=DAY)
    own = lim.pair_state(SITE, exit_id).own_limit
    assert own.lo == 3.0 and own.ceiling == 4.0


# -- the simulator: cold, then warm --------------------------------------------------------
@pytest.mark.parametrize("model, capacity", [
    (lambda: OriginModel(per_ip=lambda: Gcra(5.0)), 50.0),
    (lambda: OriginModel(per_ip=lambda: Gcra(5.0), site=Gcra(20.0)), 20.0),
], ids=["per-ip", "site-wide"])
def test_a_warm_run_draws_no_429_in_its_first_seconds_and_runs_at_the_limit_at_once(model,
                                                                                    capacity):
    crawl = Crawl({SITE: model()}, pages=600, exits=10)
    cold = simulate(crawl)
    warm = simulate(replace(crawl, origins={SITE: model()}, learned=cold.learned))

    def first(result, seconds):
        statuses = [s for at, _, s in result.answers if at < seconds]
        return statuses.count(200), statuses.count(429)

    ok, limited = first(warm, 1.0)
    assert first(cold, 1.0)[0] < ok  # cold: discovery, slow start
    assert limited == 0 and ok >= 0.95 * capacity
    assert first(warm, 3.0)[1] == 0
    assert warm.share_429 <= 0.005
    assert (warm.ok / capacity) / warm.wall >= 0.95


# -- the file ---------------------------------------------------------------------------
def state_text(origins: dict, written: float = 100.0) -> str:
    return dump(origins, written)


def an_origin(at: float = 100.0) -> dict:
    return {"at": at, "pool": estimate(4.9, 5.1), "site": None, "pairs": {}}


def test_the_file_round_trips_and_says_what_it_is():
    text = state_text({SITE: an_origin()})
    data = json.loads(text)
    assert data["format"] == FORMAT and data["version"] == 1 and data["scopes"] == {}
    origins, written = parse(text)
    assert written == 100.0
    assert origins[SITE]["pool"]["clean"] == 4.9 and origins[SITE]["pairs"] == {}


@pytest.mark.parametrize("text, why", [
    ("", "JSON"),
    ('{"format": "scrapy-exitlimit state", "version": 1, "origins": {', "JSON"),
    ("[1, 2]", "not a scrapy-exitlimit state file"),
    ('{"name": "my-package", "version": "1.0"}', "not a scrapy-exitlimit state file"),
    ('{"format": "scrapy-exitlimit state", "version": 9, "origins": {}}', "newer"),
    ('{"format": "scrapy-exitlimit state", "version": "1", "origins": {}}', "version"),
    ('{"format": "scrapy-exitlimit state", "version": 1}', "origins"),
    ('{"format": "scrapy-exitlimit state", "version": 1, "origins": {"o": {"at": 1, '
     '"pool": {"clean": NaN}}}}', "JSON"),
    ('{"format": "scrapy-exitlimit state", "version": 1, "origins": {"o": {"at": 1, '
     '"pool": {"clean": -4}}}}', "rate"),
    ('{"format": "scrapy-exitlimit state", "version": 1, "origins": {"o": {"at": "now", '
     '"pool": null}}}', "time"),
    ('{"format": "scrapy-exitlimit state", "version": 1, "origins": {"o": {"at": 1, '
     '"pairs": {"x": {"at": 1, "own": {"clean": 1, "settled": "yes"}}}}}}', "settled"),
    ('{"format": "scrapy-exitlimit state", "version": 1, "origins": {}, "scopes": [1]}',
     "scopes"),
    ('{"format": "scrapy-exitlimit state", "version": 1, "origins": {}, "scopes": '
     '{"scope~a": {"at": 1, "rate": {"clean": 0}}}}', "scope 'scope~a': rate: clean"),
])
def test_a_file_that_is_not_a_state_file_or_is_broken_is_refused_saying_why(text, why):
    with pytest.raises(StateFileError, match=why):
        parse(text)


def test_reading_a_missing_file_is_no_state_and_an_unreadable_one_an_error(tmp_path):
    assert read(tmp_path / "none.json") == {}
    with pytest.raises(StateFileError, match="cannot be read"):
        read(tmp_path)  # a directory
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(StateFileError, match="UTF-8"):
        read(tmp_path / "bin.json")


def test_merge_keeps_the_newer_entry_per_origin_and_pair_and_drops_what_is_too_old():
    pair = {"at": 50.0, "own": estimate(1.0)}
    old = {SITE: {**an_origin(50.0), "pairs": {"a": pair, "b": pair}},
           "http://other.test": an_origin(60.0), "http://gone.test": an_origin(1.0)}
    new = {SITE: {**an_origin(90.0), "pool": estimate(3.0),
                  "pairs": {"a": {"at": 90.0, "own": estimate(0.5)}}}}
    merged = merge(old, new, now=100.0, max_age=95.0)
    assert set(merged) == {SITE, "http://other.test"}  # gone.test is 99 s old
    assert merged[SITE]["pool"]["clean"] == 3.0
    assert merged[SITE]["pairs"]["a"]["own"]["clean"] == 0.5
    assert merged[SITE]["pairs"]["b"] == pair  # kept from the older entry
    # an older copy never overwrites a newer one
    assert merge(new, old, now=100.0, max_age=95.0)[SITE]["pool"]["clean"] == 3.0


def test_a_write_is_atomic_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "state.json"
    clock = FakeClock(0.0)
    lim = learned(clock, OriginModel(per_ip=lambda: Gcra(5.0)))
    sf = StateFile(path, save_interval=300, max_age=DAY, wall=lambda: 1000.0)
    assert sf.save(lim)
    # and the lock file serializing saves, kept (deleting it would race)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.lock"]
    assert SITE in read(path)


def test_a_corrupt_file_is_a_warning_naming_the_setting_and_kept_until_a_good_state(
        tmp_path, caplog):
    path = tmp_path / "state.json"
    path.write_text('{"format": "scrapy-exitlimit state", "version": 1, "orig')
    sf = StateFile(path, save_interval=300, max_age=DAY, wall=lambda: 1000.0)
    lim = limiter(FakeClock(0.0))
    with caplog.at_level(logging.WARNING):
        assert sf.load(lim) is None
    assert "EXITLIMIT_STATE_FILE" in caplog.text and "not valid JSON" in caplog.text
    assert not lim.origins  # a cold start
    before = path.read_text()
    assert not sf.save(lim)  # nothing learned: the file stays as it is
    assert path.read_text() == before
    clock = FakeClock(0.0)
    assert sf.save(learned(clock, OriginModel(per_ip=lambda: Gcra(5.0))))
    assert SITE in read(path)  # a good state replaced it
    assert (tmp_path / "state.json.unreadable").read_text() == before  # kept aside


def test_a_directory_named_as_the_state_file_is_left_alone(tmp_path, caplog):
    (tmp_path / "state.json").mkdir()
    sf = StateFile(tmp_path / "state.json", save_interval=300, max_age=DAY)
    with caplog.at_level(logging.WARNING):
        assert sf.load(limiter(FakeClock(0.0))) is None
        assert not sf.save(learned(FakeClock(0.0), OriginModel(per_ip=lambda: Gcra(5.0))))
    assert (tmp_path / "state.json").is_dir()
    assert not (tmp_path / "state.json.unreadable").exists()
    assert "cannot be read" in caplog.text and "cannot be written" in caplog.text


def test_a_state_file_in_a_missing_directory_is_a_warning_not_an_error(tmp_path, caplog):
    sf = StateFile(tmp_path / "no" / "such" / "state.json", save_interval=300, max_age=DAY)
    with caplog.at_level(logging.WARNING):
        assert sf.load(limiter(FakeClock(0.0))) is None
        assert not sf.save(learned(FakeClock(0.0), OriginModel(per_ip=lambda: Gcra(5.0))))
    assert "EXITLIMIT_STATE_FILE" in caplog.text and "cannot be written" in caplog.text


def test_the_file_keeps_what_other_crawls_wrote_and_a_new_run_starts_from_it(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(state_text({"http://other.test": an_origin(999.0)}))
    sf = StateFile(path, save_interval=300, max_age=DAY, wall=lambda: 1000.0)
    clock = FakeClock(0.0)
    cold = learned(clock, OriginModel(per_ip=lambda: Gcra(5.0)))
    assert sf.load(cold) is not None
    assert sf.save(cold)
    assert set(read(path)) == {SITE, "http://other.test"}
    warm = limiter(FakeClock(0.0))
    got = StateFile(path, save_interval=300, max_age=DAY, wall=lambda: 1010.0).load(warm)
    assert got is not None and sorted(got.origins) == sorted([SITE, "http://other.test"])
    assert warm.origin_state(SITE).learner.pool.proven


def test_a_learned_scope_rate_goes_through_the_file_by_id_and_a_new_run_starts_from_it(
        tmp_path):
    from scrapy_exitlimit.core.scopes import Scope

    from .test_core_scopes import _crawl

    path = tmp_path / "state.json"
    clock = FakeClock(0.0)
    cold = limiter(clock, n=10)
    acct = Scope("scope~acct")  # a learned scope (an account's rate, no rule)
    _crawl(cold, clock, [acct], 4.0, 60.0)
    sf = StateFile(path, save_interval=300, max_age=DAY, wall=lambda: 1000.0)
    assert sf.save(cold)
    kept = json.loads(path.read_text())["scopes"]
    assert list(kept) == ["scope~acct"] and kept["scope~acct"]["rate"]["clean"] == \
        pytest.approx(4.0, rel=0.15)
    text = show(path, now=1060.0, max_age=DAY)
    assert "1 learned scope(s)" in text and "scope~acct" in text
    warm = limiter(FakeClock(0.0), n=10)
    got = StateFile(path, save_interval=300, max_age=DAY, wall=lambda: 1010.0).load(warm)
    assert got is not None and got.scopes == 1
    [(_, bucket)] = warm.scope_budgets([acct])
    assert bucket.rate == pytest.approx(kept["scope~acct"]["rate"]["clean"])
    # a day later it is too old to start from
    stale = limiter(FakeClock(0.0), n=10)
    got = StateFile(path, save_interval=300, max_age=DAY, wall=lambda: 1000.0 + 2 * DAY
                    ).load(stale)
    assert got is not None and (got.scopes, got.stale_scopes) == (0, 1)
    assert stale.scope_budgets([acct])[0][1].rate == 2.0  # the start rate again


def test_merge_keeps_the_newer_scope_entry_and_drops_what_is_too_old():
    old = {"scope~a": {"at": 50.0, "rate": estimate(1.0)},
           "scope~b": {"at": 60.0, "rate": estimate(2.0)},
           "scope~gone": {"at": 1.0, "rate": estimate(3.0)}}
    new = {"scope~a": {"at": 90.0, "rate": estimate(1.5)}}
    merged = merge_scopes(old, new, now=100.0, max_age=95.0)
    assert merged == {"scope~a": new["scope~a"], "scope~b": old["scope~b"]}
    assert merge_scopes(new, old, now=100.0, max_age=95.0)["scope~a"]["rate"]["clean"] == 1.5


def test_saving_is_due_every_interval_and_never_with_interval_zero():
    now = [0.0]
    sf = StateFile("x.json", save_interval=300, max_age=DAY, wall=lambda: now[0])
    now[0] = 299.0
    assert not sf.due()
    now[0] = 300.0
    assert sf.due()
    assert not StateFile("x.json", save_interval=0, max_age=DAY, wall=lambda: now[0]).due()


def test_show_lists_origins_rates_pairs_and_ages(tmp_path):
    path = tmp_path / "state.json"
    now = 1_000_000.0
    origin = {"at": now - 7200, "pool": estimate(4.9, 5.1), "site": estimate(19.5, 20.4),
              "pairs": {"proxy:8000~abc": {"at": now - 2 * DAY, "own": estimate(0.9, 1.0)}}}
    path.write_text(state_text({SITE: origin}, written=now - 60))
    text = show(path, now=now, max_age=DAY)
    assert "written 1.0m ago" in text
    assert SITE in text and "2.0h" in text and "4.9 / 5.1" in text and "19.5 / 20.4" in text
    assert "proxy:8000~abc" in text and "(stale)" in text
    with pytest.raises(StateFileError):
        show(tmp_path / "none.json", now=0.0, max_age=DAY)


# -- settings ---------------------------------------------------------------------------
@pytest.mark.parametrize("values, name", [
    ({"EXITLIMIT_STATE_MAX_AGE": 0}, "EXITLIMIT_STATE_MAX_AGE"),
    ({"EXITLIMIT_STATE_MAX_AGE": "a day"}, "EXITLIMIT_STATE_MAX_AGE"),
    ({"EXITLIMIT_STATE_SAVE_INTERVAL": -1}, "EXITLIMIT_STATE_SAVE_INTERVAL"),
    ({"EXITLIMIT_STATE_SAVE_INTERVAL": math.inf}, "EXITLIMIT_STATE_SAVE_INTERVAL"),
    ({"EXITLIMIT_STATE_FILE": 5}, "EXITLIMIT_STATE_FILE"),
    ({"EXITLIMIT_STATE_FILE": "a\0b"}, "EXITLIMIT_STATE_FILE"),
])
def test_bad_state_settings_are_refused_naming_the_setting(values, name):
    with pytest.raises(ValueError, match=name):
        ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": ["http://127.0.0.1:1"],
                                                **values}))


def test_state_settings_defaults():
    config = ExitLimitConfig.from_settings(Settings({"EXITLIMIT_EXITS": ["http://127.0.0.1:1"]}))
    assert config.state_file is None
    assert config.state_save_interval == 300.0 and config.state_max_age == DAY
