"""Issue 12, must-show 2: two budgets every exit shares on one request (an account's
named scope and the origin's) are granted atomically, in the memory backend's core and
in the Redis script:

- no budget is ever exceeded: over any window, the grants that took a budget's tokens
  number at most ``window * rate + burst`` (the origin's counts every request, the
  account's only the requests naming it, a pair's those on its exit);
- no request holds a token it cannot use: an admission that grants nothing takes no
  token from any budget (origin, account, pair) and no lease, and one that grants
  ``k`` takes exactly ``k`` tokens from each budget its requests need, and ``k`` leases.

Hypothesis drives random sequences of admissions (with and without the account),
releases and waits; bounded (max_examples, no deadline) to run in seconds.
"""

from __future__ import annotations

import math
import random
from importlib import resources

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from scrapy_exitlimit.core import Lease, Limiter, Limits, make_exit
from scrapy_exitlimit.core import limiter as limiter_module
from scrapy_exitlimit.core.scopes import Scope

from .conftest import FakeClock

SITE = "http://site.test"
LUA = resources.files("scrapy_exitlimit.backends").joinpath("exitlimit.lua").read_text()
EPS = 1e-5  # the script keeps times to the microsecond
BOUNDED = settings(max_examples=60, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])


def check_windows(times: list[float], rate: float, burst: int, what: str) -> None:
    """At most window * rate + burst grants in any window [times[i], times[j]]."""
    times = sorted(times)
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            window = times[j] - start + 2e-6  # times go over the wire in µs
            assert j - i + 1 <= window * rate + burst + EPS, (what, rate, burst, times)


# -- memory: the core's Limiter ------------------------------------------------------
mem_ops = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("wait"), st.integers(1, 40).map(lambda k: k / 128)),
    st.tuples(st.just("release"), st.integers(0, 50), st.booleans()),
), min_size=1, max_size=60)


def _mem_snapshot(lim: Limiter, acct: Scope) -> tuple:
    ostate = lim.origin_state(SITE)
    budget = ostate.budget.bucket
    scope = lim.scopes.states.get(acct.id)
    # a bucket not made yet is a full one (-inf): made on first use, it has given nothing
    return (budget.tat if budget else -math.inf,
            scope.bucket.tat if scope is not None and scope.bucket is not None else -math.inf,
            {key: pair.bucket.tat for key, pair in ostate.pairs.items()},
            {exit_id: state.in_flight for exit_id, state in lim.exits.items()},
            len(lim.leases))


@BOUNDED
@given(st.sampled_from([4.0, 8.0, 16.0]), st.integers(1, 3),  # pair rate, burst
       st.sampled_from([8.0, 16.0, 32.0]), st.integers(1, 2),  # origin rate, burst
       st.sampled_from([2.0, 4.0, 8.0]), st.integers(1, 3),  # account rate, burst
       st.integers(1, 3), mem_ops)
def test_memory_two_shared_budgets_are_granted_together(rate, burst, origin_rate, origin_burst,
                                                        acct_rate, acct_burst, concurrency,
                                                        steps):
    run_memory(rate, burst, origin_rate, origin_burst, acct_rate, acct_burst, concurrency,
               steps)


def run_memory(rate, burst, origin_rate, origin_burst, acct_rate, acct_burst, concurrency,
               steps):
    clock = FakeClock(0.0)
    exits = [make_exit(f"http://127.0.0.1:{9000 + i}") for i in range(3)]
    lim = Limiter(exits, Limits(rate=rate, burst=burst, concurrency=concurrency,
                                origin_rate=origin_rate, origin_burst=origin_burst),
                  clock=clock, rng=random.Random(0))
    acct = Scope("scope~acct", acct_rate, acct_burst)
    held: list[Lease] = []
    origin_times, acct_times = [], []
    pair_times: dict[str, list[float]] = {}
    for step in steps:
        if step[0] == "wait":
            clock.advance(step[1])
            continue
        if step[0] == "release":
            if held:
                lease = held.pop(step[1] % len(held))
                lim.release(lease.id, step[2])
            continue
        _, want, scoped = step
        scopes = [acct] if scoped else []
        for _ in range(want):
            before = _mem_snapshot(lim, acct)
            got = lim.try_admit(SITE, clock(), scopes=scopes)
            if not isinstance(got, Lease):
                # denied: no budget's token, no pair's, no lease
                after = _mem_snapshot(lim, acct)
                assert after[:2] == before[:2]
                assert {k: after[2][k] for k in before[2]} == before[2]
                assert after[3:] == before[3:]
                assert got > clock()
                break
            assert got.scopes == tuple(scopes)
            held.append(got)
            origin_times.append(got.admitted_at)
            if scoped:
                acct_times.append(got.admitted_at)
            pair_times.setdefault(got.pair, []).append(got.admitted_at)
    check_windows(origin_times, origin_rate, origin_burst, "origin")
    check_windows(acct_times, acct_rate, acct_burst, "account")
    for pair, times in pair_times.items():
        check_windows(times, rate, burst, pair)


# -- Redis: exitlimit.lua on a real redis-server, on Redis TIME ------------------------
EXITS = ["a", "b", "c"]
redis_ops = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 4), st.booleans(),
              st.lists(st.sampled_from(EXITS), min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("release"), st.integers(0, 50), st.booleans()),
), min_size=1, max_size=40)


RUNS = iter(range(10**9))


class ScriptPool:
    """Exits, an origin budget and an account scope, admitted through the script as the
    Redis backend calls it (scope keys and their pacing after the candidates)."""

    def __init__(self, client, script, interval: float, burst: int, limit: int,
                 origin: tuple[float, int], acct: tuple[float, int]):
        self.client, self.script = client, script
        self.p = f"{{pscope{next(RUNS)}}}"
        self.interval, self.burst, self.limit = interval, burst, limit
        self.origin, self.acct = origin, acct  # (interval, burst) each
        self.next_id = 1
        self.held: list[tuple[str, str, bool]] = []  # (exit, token, scoped)
        self.times: dict[str, list[float]] = {"origin": [], "acct": [],
                                              **{e: [] for e in EXITS}}

    def key(self, kind: str, e: str) -> str:
        return f"{self.p}:{kind}:{e}"

    def _tat(self, key: str) -> float | None:
        value = self.client.hget(key, "tat")
        return None if value is None else float(value)

    def snapshot(self) -> dict[str, float | int | None]:
        state: dict[str, float | int | None] = {
            "origin": self._tat(self.key("origin", "o")),
            "acct": self._tat(self.key("scope", "acct"))}
        for e in EXITS:
            state[e] = self._tat(self.key("pair", e))
            state[f"lease:{e}"] = self.client.zcard(self.key("lease", e))
        return state

    def admit(self, want: int, scoped: bool, exits: list[str]) -> None:
        (oint, oburst), (aint, aburst) = self.origin, self.acct
        keys = [self.key("origin", "o"), self.key("learn", "o")]
        args = ["admit", want, "t", self.next_id, 30.0, repr(oint), repr((oburst - 1) * oint),
                0, 0, 0.5]  # no reservations ahead (scoped requests never have them)
        for e in exits:
            keys += [self.key("pair", e), self.key("lease", e), self.key("exit", e)]
            args += [repr(self.interval), repr((self.burst - 1) * self.interval), self.limit, 1]
        if scoped:
            keys.append(self.key("scope", "acct"))
            args += [repr(aint), repr((aburst - 1) * aint)]
        before = self.snapshot()
        reply = self.script(keys=keys, args=args)
        after = self.snapshot()
        now = float(reply[0])
        granted = [exits[int(i) - 1] for i in reply[4::4]]
        assert all(float(at) == 0 for at in reply[7::4])  # all now: nothing reserved
        k = len(granted)
        budgets = [("origin", oint)] + ([("acct", aint)] if scoped else [])
        for name, interval in budgets:
            if k == 0:  # no request, no token
                assert after[name] == before[name], name
            else:  # k requests, k tokens: no more (none held for a request not granted)
                start = max(before[name] if before[name] is not None else now, now)
                assert after[name] == pytest.approx(start + k * interval, abs=EPS * k), name
        if not scoped:  # a request without the account takes none of its tokens
            assert after["acct"] == before["acct"]
        for e in EXITS:
            n = granted.count(e)
            assert after[f"lease:{e}"] == before[f"lease:{e}"] + n
            assert after[f"lease:{e}"] <= self.limit
            if n == 0:
                assert after[e] == before[e], e
        for i, e in enumerate(granted):
            self.held.append((e, f"t:{self.next_id + i}", scoped))
            self.times["origin"].append(now)
            self.times[e].append(now)
            if scoped:
                self.times["acct"].append(now)
        self.next_id += want

    def release(self, pick: int, answered: bool) -> None:
        if not self.held:
            return
        e, token, scoped = self.held.pop(pick % len(self.held))
        keys = [self.key("lease", e), self.key("pair", e)]
        args = ["release", token, 1 if answered else 0, 0.0, repr(self.interval)]
        if scoped and answered:  # the scope re-anchored, as the backend sends it
            keys += [self.key("lease", e), self.key("scope", "acct")]
            args += [token, 1, 0.0, repr(self.acct[0])]
        self.script(keys=keys, args=args)

    def check(self) -> None:
        (oint, oburst), (aint, aburst) = self.origin, self.acct
        check_windows(self.times["origin"], 1 / oint, oburst, "origin")
        check_windows(self.times["acct"], 1 / aint, aburst, "account")
        for e in EXITS:
            check_windows(self.times[e], 1 / self.interval, self.burst, e)


@BOUNDED
@given(st.floats(0.0005, 0.02), st.integers(1, 3), st.integers(1, 3),
       st.tuples(st.floats(0.0002, 0.01), st.integers(1, 2)),
       st.tuples(st.floats(0.0005, 0.03), st.integers(1, 3)), redis_ops)
def test_redis_two_shared_budgets_are_granted_together(lua_client, interval, burst, limit, origin,
                                                       acct, steps):
    run_redis(*lua_client, interval, burst, limit, origin, acct, steps)


def run_redis(client, script, interval, burst, limit, origin, acct, steps):
    pool = ScriptPool(client, script, interval, burst, limit, origin, acct)
    for step in steps:
        if step[0] == "admit":
            pool.admit(*step[1:])
        else:
            pool.release(*step[1:])
    pool.check()


# -- the tests can fail -------------------------------------------------------------------
MUTANT_SEARCH = settings(BOUNDED, derandomize=True, database=None, report_multiple_bugs=False,
                         phases=[Phase.generate])


def greedy_take(buckets, now):
    """Not atomic: each budget ready now gives its token, whether the others can or not."""
    ready = max((bucket.ready_at(now) for bucket in buckets), default=now)
    for bucket in buckets:
        if bucket.ready_at(now) <= now:
            bucket.consume(now)
    return ready if ready > now else None


def test_a_take_that_is_not_atomic_fails_the_memory_property(monkeypatch):
    monkeypatch.setattr(limiter_module, "take_together", greedy_take)

    @MUTANT_SEARCH
    @given(st.integers(1, 3), mem_ops)
    def search(concurrency, steps):
        run_memory(16.0, 1, 16.0, 1, 2.0, 1, concurrency, steps)

    with pytest.raises(AssertionError):
        search()


#: the script's shared take, changed to take a second token of each shared budget
LUA_TAKE = "      b.tat = math.max(b.tat, at) + b.interval\n"


def test_a_script_taking_more_than_it_grants_fails_the_redis_property(lua_client):
    client, _ = lua_client
    assert LUA.count(LUA_TAKE) == 1
    script = client.register_script(LUA.replace(
        LUA_TAKE, "      b.tat = math.max(b.tat, at) + 2 * b.interval\n"))

    @MUTANT_SEARCH
    @given(redis_ops)
    def search(steps):
        run_redis(client, script, 0.001, 2, 2, (0.0005, 2), (0.002, 2), steps)

    with pytest.raises(AssertionError):
        search()
