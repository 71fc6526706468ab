"""The shared-state Lua script against a real redis-server, with Redis TIME."""

from __future__ import annotations

import time
from importlib import resources

import pytest
import redis
from redis.crc import key_slot

LUA = resources.files("scrapy_exitlimit.backends").joinpath("exitlimit.lua").read_text()
P = "{t}"
ORIGIN, LEARN = f"{P}:origin:o", f"{P}:learn:o"


def pair(exit_id: str) -> str:
    return f"{P}:pair:o|{exit_id}"


def lease(exit_id: str) -> str:
    return f"{P}:lease:{exit_id}"


def exit_key(exit_id: str) -> str:
    return f"{P}:exit:{exit_id}"


@pytest.fixture
def script(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client.register_script(LUA)
    client.close()


@pytest.fixture
def client(redis_url):
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        yield c


def admit(script, exits, *, want=1, interval=0.2, tol=0.0, limit=8, ttl=15.0, first_id=1,
          origin_interval=0.0, origin_tol=0.0, reserve=0.0):
    keys, args = [ORIGIN, LEARN], ["admit", want, "proc", first_id, ttl, origin_interval,
                                   origin_tol, 0, reserve, 0]
    for e in exits:
        keys += [pair(e), lease(e), exit_key(e)]
        args += [interval, tol, limit, 1]
    reply = script(keys=keys, args=args)
    now, wait, blocked, version = float(reply[0]), float(reply[1]), int(reply[2]), reply[3]
    granted = [(exits[int(i) - 1], float(g)) for i, g in zip(reply[4::4], reply[5::4],
                                                              strict=True)]
    return now, wait, blocked, version, granted


def server_time(client) -> float:
    s, us = client.time()
    return s + us / 1e6


def test_admit_takes_a_token_and_a_lease_and_answers_in_redis_time(script, client):
    before = server_time(client)
    now, wait, blocked, version, granted = admit(script, ["a"])
    assert before <= now <= server_time(client)
    assert [e for e, _ in granted] == ["a"]
    assert version == "0"
    # the pair's next token is one interval on, on Redis's clock
    assert float(client.hget(pair("a"), "tat")) == pytest.approx(now + 0.2, abs=1e-5)
    assert client.zcard(lease("a")) == 1
    assert client.zscore(lease("a"), "proc:1") == pytest.approx(now + 15.0, abs=1e-5)


def test_a_pair_without_a_token_answers_when_it_will_have_one(script):
    now, *_ = admit(script, ["a"], interval=10.0)
    now2, wait, blocked, _, granted = admit(script, ["a"], interval=10.0)
    assert granted == []
    assert wait == pytest.approx(now + 10.0, abs=1e-5)
    assert blocked == 0


def test_several_leases_in_one_call_spread_over_the_candidates(script):
    *_, granted = admit(script, ["a", "b", "c"], want=5, interval=10.0)
    assert sorted(e for e, _ in granted) == ["a", "b", "c"]  # one token per pair only


def test_burst_allows_that_many_back_to_back(script):
    *_, granted = admit(script, ["a"], want=5, interval=10.0, tol=20.0)
    assert len(granted) == 3


def test_a_slower_rate_does_not_free_the_burst_the_faster_one_spent(script):
    *_, granted = admit(script, ["a"], want=4, interval=10.0, tol=30.0)  # burst 4
    assert len(granted) == 4
    # the rate halves: the wider tolerance must not hand out tokens at once
    *_, granted = admit(script, ["a"], want=4, interval=20.0, tol=60.0, first_id=5)
    assert granted == []


def test_an_exit_at_its_lease_limit_is_skipped_and_reported(script):
    *_, granted = admit(script, ["a"], want=3, interval=0.0001, tol=1.0, limit=2)
    assert len(granted) == 2
    _, wait, blocked, _, granted = admit(script, ["a"], interval=0.0001, tol=1.0, limit=2)
    assert granted == [] and blocked == 1 and wait == float("inf")


def test_a_shared_budget_holding_up_a_ready_pair_is_reported_apart_from_the_pairs(script):
    # the origin's budget spent by the first call: the next one finds "b" ready and the
    # budget not (2), and the caller need not try other candidates for the same token
    *_, granted = admit(script, ["a"], interval=0.0001, origin_interval=10.0)
    assert [e for e, _ in granted] == ["a"]
    now, wait, blocked, _, granted = admit(script, ["b"], interval=0.0001, first_id=2,
                                           origin_interval=10.0)
    assert granted == [] and blocked == 2 and wait == pytest.approx(now + 10.0, abs=0.1)
    # no candidate ready: the pairs' wait, not the budget's doing
    _, _, blocked, _, granted = admit(script, ["a"], interval=10.0, first_id=3,
                                      origin_interval=10.0)
    assert granted == [] and blocked == 0


def test_expired_leases_free_their_place(script, client):
    admit(script, ["a"], limit=1, ttl=-1.0, interval=0.0001)  # a lease that expired already
    *_, granted = admit(script, ["a"], limit=1, interval=0.0001, first_id=2)
    assert [e for e, _ in granted] == ["a"]
    assert client.zrange(lease("a"), 0, -1) == ["proc:2"]


def test_release_frees_the_lease_and_re_anchors_pacing_on_arrival(script, client):
    now, *_ = admit(script, ["a"], interval=0.2)
    reply = script(keys=[lease("a"), pair("a")], args=["release", "proc:1", 1, 0.0, 0.2])
    released_at = float(reply)
    assert client.zcard(lease("a")) == 0
    # answered at released_at: the next request one interval after that
    assert float(client.hget(pair("a"), "tat")) == pytest.approx(released_at + 0.2, abs=1e-5)


def test_a_slower_pace_counts_from_a_cold_paths_answer_even_when_released_late(script,
                                                                           client):
    """Answered 0.1 s after its admission on a cold path (arrived 2), given back 0.05 s
    after the answer (batched with the next call): the request may have reached the
    server as late as the answer, and a slower pace counts from there, not from the
    admission. Answered on a warm path (arrived 1), from the admission, as before."""
    for exit_id, arrived in (("a", 2), ("b", 1)):
        admitted, *_ = admit(script, [exit_id], interval=0.05)
        time.sleep(0.15)
        reply = script(keys=[lease(exit_id), pair(exit_id)],
                       args=["release", "proc:" + ("1" if exit_id == "a" else "2"), arrived,
                             0.05, 0.05])
        answered = float(reply) - 0.05
        now, wait, *_ = admit(script, [exit_id], interval=1.0, first_id=3)  # 20 -> 1 r/s
        anchor = answered if arrived == 2 else admitted
        assert wait == pytest.approx(anchor + 1.0, abs=2e-3), exit_id


def test_cooldown_latest_deadline_wins_and_holds_the_bucket(script, client):
    script(keys=[pair("a")], args=["hold", "cool", 30.0, 0.0])
    left = float(script(keys=[pair("a")], args=["hold", "cool", 5.0, 0.0]))
    assert left == pytest.approx(30.0, abs=0.5)  # a shorter Retry-After does not shorten it
    now, wait, _, _, granted = admit(script, ["a"])
    assert granted == [] and wait == pytest.approx(now + left, abs=0.5)
    assert float(client.hget(pair("a"), "tat")) >= float(client.hget(pair("a"), "cool"))


def test_a_cooling_pair_leaves_the_others_admissible(script):
    script(keys=[pair("a")], args=["hold", "cool", 30.0, 0.0])
    *_, granted = admit(script, ["a", "b"])
    assert [e for e, _ in granted] == ["b"]


def test_dead_exit_and_ban_block_admission(script):
    script(keys=[exit_key("a")], args=["dead", 30.0])
    script(keys=[pair("b")], args=["hold", "ban", 30.0, 0.0])
    *_, granted = admit(script, ["a", "b", "c"], want=3)
    assert [e for e, _ in granted] == ["c"]


def test_origin_budget_caps_the_whole_origin(script):
    *_, granted = admit(script, ["a", "b", "c"], want=3, interval=0.0001, origin_interval=10.0)
    assert len(granted) == 1
    now, wait, _, _, granted = admit(script, ["a", "b", "c"], interval=0.0001,
                                     origin_interval=10.0)
    assert granted == [] and wait == pytest.approx(now + 10.0, abs=0.1)


def test_origin_hold_pauses_every_pair(script):
    script(keys=[ORIGIN], args=["hold", "hold", 30.0, 0.0])
    *_, granted = admit(script, ["a", "b"], origin_interval=0.001)
    assert granted == []


def test_gap_is_the_time_since_the_pairs_previous_admission(script):
    *_, granted = admit(script, ["a"], interval=0.0001)
    assert granted[0][1] > 1e9  # never admitted before
    *_, granted = admit(script, ["a"], interval=0.0001, first_id=2)
    assert 0 <= granted[0][1] < 1.0


def test_the_origin_gap_counts_every_exits_and_every_callers_admissions(script, client):
    def origin_gaps(exits, first_id):
        keys, args = [ORIGIN, LEARN], ["admit", 1, "proc", first_id, 15.0, 0.0, 0.0, 0, 0.0, 0]
        for e in exits:
            keys += [pair(e), lease(e), exit_key(e)]
            args += [0.0001, 0.0, 8, 1]
        reply = script(keys=keys, args=args)
        return float(reply[0]), [float(g) for g in reply[6::4]]

    first_at, first = origin_gaps(["a"], 1)
    assert first[0] > 1e9  # the origin's first admission
    at, second = origin_gaps(["b"], 2)  # another exit (another caller, as far as it knows)
    assert second[0] == pytest.approx(at - first_at, abs=2e-6)
    # kept in the origin's hash, with no budget configured (its interval is 0)
    assert float(client.hget(ORIGIN, "last")) == at


def test_learned_state_is_compare_and_set(script):
    assert script(keys=[LEARN], args=["learn_get"]) == ["0", ""]
    assert script(keys=[LEARN], args=["learn_put", "0", "first"]) == [1, "1", ""]
    # an update made from version 0 is stale now: refused, with the current state
    assert script(keys=[LEARN], args=["learn_put", "0", "second"]) == [0, "1", "first"]
    assert script(keys=[LEARN], args=["learn_get"]) == ["1", "first"]
    *_, version, _ = admit(script, ["a"])
    assert version == "1"


def test_learned_state_is_kept_as_long_as_asked_from_its_last_write_or_use(script, client):
    script(keys=[LEARN], args=["learn_put", "0", "first"])
    assert 86000 < client.ttl(LEARN) <= 86400  # a day when not told
    script(keys=[LEARN], args=["learn_put", "1", "second", 600])  # EXITLIMIT_STATE_MAX_AGE
    assert 590 < client.ttl(LEARN) <= 600
    other = f"{P}:learn:other"
    assert script(keys=[LEARN, other], args=["learn_touch", 7200]) == 1  # only what exists
    assert 7190 < client.ttl(LEARN) <= 7200 and not client.exists(other)


def test_renew_extends_leases_and_counts_live_processes(script, client):
    now, *_ = admit(script, ["a"], ttl=1.0)
    reply = script(keys=[f"{P}:procs", lease("a")], args=["renew", "p1", 15.0, "proc:1"])
    assert int(reply[1]) == 1
    assert client.zscore(lease("a"), "proc:1") > now + 10
    # renewing a lease that is gone does not resurrect it
    script(keys=[lease("a"), pair("a")], args=["release", "proc:1", 0, 0, 0.2])
    script(keys=[f"{P}:procs", lease("a")], args=["renew", "p2", 15.0, "proc:1"])
    assert client.zcard(lease("a")) == 0
    assert int(script(keys=[f"{P}:procs"], args=["renew", "p3", 15.0])[1]) == 3


def test_unknown_operation_is_an_error(script):
    with pytest.raises(redis.ResponseError, match="unknown operation"):
        script(keys=[ORIGIN], args=["nope"])


def test_every_key_of_one_pool_shares_a_cluster_slot():
    from scrapy_exitlimit.backends.redis import RedisBackend

    key = RedisBackend._key
    fake = type("B", (), {"prefix": "exitlimit"})()
    keys = [key(fake, "pair", "https://a.example", "gw:7777~ab12"), key(fake, "lease", "x:1"),
            key(fake, "origin", "http://b.example:8080"), key(fake, "learn", "o"),
            key(fake, "exit", "[::1]:3128"), key(fake, "procs")]
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_releases_ride_along_with_an_admission_and_count_first(script, client):
    admit(script, ["a"], limit=1, interval=0.0001)
    keys = [ORIGIN, LEARN, lease("a"), pair("a"), pair("a"), lease("a"), exit_key("a")]
    args = ["admit", 1, "proc", 2, 15.0, 0, 0, 1, 0, 0, "proc:1", 0, 0, 0.0001, 0.0001, 0, 1, 1]
    reply = script(keys=keys, args=args)
    assert reply[4:5] == [1]  # the lease freed in this very call was taken again
    assert client.zrange(lease("a"), 0, -1) == ["proc:2"]


def admit_ahead(script, exits, *, horizon, want=1, interval=0.2, warm=True, first_id=1):
    """An admission call that may be answered with tokens reserved for later:
    (now, [(exit, when its request may go: 0 now)] granted)."""
    keys, args = [ORIGIN, LEARN], ["admit", want, "proc", first_id, 15.0, 0, 0, 0, horizon, 0]
    for e in exits:
        keys += [pair(e), lease(e), exit_key(e)]
        args += [interval, 0.0, 8, 1 if warm else 0]
    reply = script(keys=keys, args=args)
    return float(reply[0]), [(exits[int(i) - 1], float(at))
                             for i, at in zip(reply[4::4], reply[7::4], strict=True)]


def test_callers_woken_for_tokens_get_the_next_ones_reserved_not_a_wait(script, client):
    now, got = admit_ahead(script, ["a", "b", "c"], horizon=0.25, want=3)
    assert sorted(e for e, _ in got) == ["a", "b", "c"] and all(at == 0 for _, at in got)
    _, nothing = admit_ahead(script, ["a", "b", "c"], horizon=0.25, first_id=4)
    assert nothing == []  # the next tokens are more than half an interval off
    time.sleep(0.12)
    # nothing now: the tokens due soon are taken for this caller, each at its own time...
    now3, got3 = admit_ahead(script, ["a", "b", "c"], horizon=0.25, want=2, first_id=4)
    assert len(got3) == 2
    for e, at in got3:
        assert now3 < at == pytest.approx(now + 0.2, abs=0.01)
        assert float(client.hget(pair(e), "tat")) == pytest.approx(at + 0.2, abs=1e-5)
        assert client.zcard(lease(e)) == 2  # the reserved lease counts from now
    # ...and the next caller gets the one left, not the same ones
    _, got4 = admit_ahead(script, ["a", "b", "c"], horizon=0.25, want=3, first_id=6)
    assert [e for e, _ in got4] == sorted({"a", "b", "c"} - {e for e, _ in got3})


def test_no_reservation_beyond_the_horizon_or_on_a_pair_the_caller_knows_cold(script):
    script(keys=[pair("a")], args=["hold", "cool", "30", "0"])  # a 429's cooldown
    _, got = admit_ahead(script, ["a"], horizon=0.25)
    assert got == []  # thirty seconds away
    admit_ahead(script, ["b"], horizon=0.25)
    time.sleep(0.12)
    _, got = admit_ahead(script, ["b"], horizon=0.25, warm=False, first_id=2)
    assert got == []
    _, got = admit_ahead(script, ["b"], horizon=0.25, first_id=3)
    assert [e for e, _ in got] == ["b"]  # the same, warm


def admit_shared(script, exits, *, warm, horizon=0.25, origin_interval=0.2, first_id=1):
    """An admission call under an origin budget (burst 1), pair tokens always ready:
    (now, when to ask again, [(exit, when its request may go: 0 now)] granted)."""
    keys, args = [ORIGIN, LEARN], ["admit", 1, "proc", first_id, 15.0, origin_interval, 0,
                                   0, horizon, 0]
    for e in exits:
        keys += [pair(e), lease(e), exit_key(e)]
        args += [0.0001, 0.0, 8, 1 if e in warm else 0]
    reply = script(keys=keys, args=args)
    return float(reply[0]), float(reply[1]), [
        (exits[int(i) - 1], float(at)) for i, at in zip(reply[4::4], reply[7::4], strict=True)]


def test_a_shared_token_is_reserved_at_most_half_its_interval_ahead(script):
    """The previous request's answer re-anchors the budget on when it arrived: it must be
    in before the next token is promised (a strict site counts arrival to arrival)."""
    t0, _, got = admit_shared(script, ["a"], warm={"a"})
    assert got == [("a", 0.0)]
    _, wait, got = admit_shared(script, ["a"], warm={"a"}, first_id=2)
    assert got == []  # 0.2 s away: beyond half of it
    assert wait == pytest.approx(t0 + 0.2 - 0.1, abs=1e-5)  # ask when it may be reserved
    time.sleep(max(0.0, wait - t0) + 0.02)
    now, _, got = admit_shared(script, ["a"], warm={"a"}, first_id=2)
    assert now < t0 + 0.2 and got == [("a", pytest.approx(t0 + 0.2, abs=1e-5))]


def test_the_pair_that_waited_longest_gets_the_shared_token_even_when_cold(script):
    """A cold pair (its path not known: no reservation) ready for the shared token is
    not passed over for a warm one reserved ahead: it is asked for when the token is due,
    or cold pairs would never warm up and the crawl would ride on a few exits."""
    t0, _, got = admit_shared(script, ["a"], warm={"a"})
    time.sleep(0.12)  # the next shared token within half an interval: reservable
    _, wait, got = admit_shared(script, ["a", "b"], warm={"a"}, first_id=2)
    assert got == [] and wait == pytest.approx(t0 + 0.2, abs=1e-5)
    _, _, got = admit_shared(script, ["a", "b"], warm={"a", "b"}, first_id=2)
    assert got == [("b", pytest.approx(t0 + 0.2, abs=1e-5))]  # warm now: reserved


def test_a_release_with_an_empty_token_re_anchors_a_budget_and_gives_nothing_back(
        script, client):
    t0, _, got = admit_shared(script, ["a"], warm=(), origin_interval=0.2)
    assert float(client.hget(ORIGIN, "tat")) == pytest.approx(t0 + 0.2, abs=1e-5)
    # a request sent 0.1 s after its token's time: the next token 0.2 s after that
    now = float(script(keys=[ORIGIN, ORIGIN], args=["release", "", 1, -0.1, 0.2]))
    assert float(client.hget(ORIGIN, "tat")) == pytest.approx(now + 0.1 + 0.2, abs=1e-5)
    assert client.zcard(lease("a")) == 1  # the lease is still out
