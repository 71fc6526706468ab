"""One law, two implementations: the core (memory backend) and the Redis script agree.

The same random sequences of admissions, answers, cooldowns, stated quotas and rate
changes go through the core's ``Limiter`` and through ``exitlimit.lua`` on a real
redis-server; every admission must grant the same exits (with the same gaps) and, when
it grants fewer than asked, name the same time to ask again.

The script is the production one with one line changed: it reads the time from a key
the test sets instead of ``TIME``, so both sides run on one clock, exactly, without
sleeping. The script is driven as the Redis backend drives it: the core's local
knowledge (dead exits, exits it fills, pairs waiting for an answer) decides the
candidates, in pool order (the backend sends its plan's order, which only breaks ties
differently); the typed state changes the core returns are copied in (holds, bans);
releases carry the core's arrival slack and interval.

What the sequences keep to, and why:

- Times, intervals, cooldowns are multiples of 1/64 s: exact in binary floating point
  and in the script's microseconds, so a tie is a tie on both sides.
- Rates are given (``EXITLIMIT_RATE``): learning is the core's alone (the script is
  told the rates); 429s go in without their lease (a cooldown, nothing learned); no
  503s (the 503 budget is the core's: the script carries its rate and a stated pause).
- A pair's third and later answers are released unanswered: latency statistics would
  add a margin (and an arrival slack) that is not a multiple of 1/64 s.
- A new pace starts one new interval after the pair's last admission on both sides
  (``pair.py`` rule 1 and the script's stored interval): later when slower, at once
  when faster. With a burst above 1 the script widens the tolerance lazily, from the
  value it stored at the pair's last admission, so a release or a hold in between lands
  differently: stated rates change only with a burst of 1.
- No bans: the script holds a banned pair's bucket until the ban ends (as for a
  cooldown), the core does not, so after the ban the script ranks the pair as just
  used and the core as the one that waited longest.
- A new or half-open pair is asked one lease at a time: the core makes it wait for
  its answer after one, the script (which does not know) would grant a burst in one
  call. So is a shared budget's first request, and while it waits for its answer
  (``bucket.ArrivalFloor.gate``, local knowledge) the script is not asked.
- The script may name an earlier time to ask again, never a later one: it looks at a
  pair's token before its exit's lease limit (an exit the call filled still counts),
  and when a shared budget (the origin's, a named scope's) stops it, its answer is the
  earliest of the budgets' and the tokens it saw before. Elsewhere the times are equal.
- Named scopes (rule 17) are configured at rates whose interval, 2 % longer
  (``scopes.SCOPE_SPREAD``), is a multiple of 1/64 s (2.04 r/s: 0.5 s); learning a
  scope's rate is the core's alone (the script is told it, as the site rate). A scoped
  lease's answered release re-anchors each scope as the Redis backend sends it: a
  release of the same token onto the scope's key, with the scope's arrival slack (its
  fastest answer, once warm) as the slack; so is the origin budget, when one paces.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from importlib import resources

import pytest
import redis
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from scrapy_exitlimit.backends.redis import HOLD_FIELDS
from scrapy_exitlimit.core import Lease, Limiter, Limits, TokenBucket, Tuning, make_exit
from scrapy_exitlimit.core.changes import Feedback, PairHeld
from scrapy_exitlimit.core.scopes import Scope

SCRIPT = resources.files("scrapy_exitlimit.backends").joinpath("exitlimit.lua").read_text()
TIME_LINE = "local t = redis.call('TIME')"
CLOCK_KEY = "exitlimit-difftest:clock"
TICK = 1 / 64  # seconds: exact in binary and in microseconds
START = 1000.0
EPS = 1e-6  # the script keeps times to the microsecond
ORIGIN = "http://site.test"


def script_on_test_clock(text: str) -> str:
    assert text.count(TIME_LINE) == 1, "the script's clock moved: update this test"
    return text.replace(TIME_LINE, f"local t = redis.call('HMGET', '{CLOCK_KEY}', 's', 'us')")


@pytest.fixture(scope="module")
def client(redis_server):
    if redis_server.proc is None:
        redis_server.start()
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    yield client
    client.close()


@dataclass
class Pool:
    exits: int
    rate: float
    burst: int
    concurrency: int
    origin_rate: float | None
    origin_burst: int
    breaker_after: int
    breaker_cooldown: float
    #: named scopes: (rate, burst) each
    scopes: tuple[tuple[float, int], ...] = ()


pools = st.builds(
    Pool, exits=st.integers(1, 4), rate=st.sampled_from([2.0, 4.0, 8.0, 16.0]),
    burst=st.integers(1, 3), concurrency=st.integers(1, 3),
    origin_rate=st.sampled_from([None, None, 4.0, 16.0, 32.0]), origin_burst=st.integers(1, 2),
    breaker_after=st.integers(2, 4), breaker_cooldown=st.sampled_from([0.5, 2.0]))
ticks = st.integers(0, 128).map(lambda k: k * TICK)
answers = st.tuples(st.just("answer"), st.integers(0, 99),
                    st.sampled_from(["ok", "ok", "ok", "429", "quota", "rate", "rate", "lost"]),
                    ticks, st.sampled_from([2.0, 4.0, 8.0, 16.0]))
step = st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 3)),
    st.tuples(st.just("wait"), st.integers(1, 48).map(lambda k: k * TICK)),
    answers, answers,
    st.tuples(st.just("cool"), st.integers(0, 3), ticks),
)
#: long sequences (a short list is what Hypothesis draws by default), shrinking to short
steps = st.integers(10, 60).flatmap(lambda n: st.lists(step, min_size=n, max_size=n))

#: two named scopes; rates whose interval with the 2 % spread is a multiple of 1/64 s
scope_limits = st.tuples(st.sampled_from([2.04, 4.08, 8.16, 16.32]), st.integers(1, 3))
scoped_pools = st.builds(
    Pool, exits=st.integers(1, 4), rate=st.sampled_from([2.0, 4.0, 8.0, 16.0]),
    burst=st.integers(1, 3), concurrency=st.integers(1, 3),
    origin_rate=st.sampled_from([None, None, 4.0, 16.0]), origin_burst=st.integers(1, 2),
    breaker_after=st.integers(2, 4), breaker_cooldown=st.sampled_from([0.5, 2.0]),
    scopes=st.tuples(scope_limits, scope_limits))
#: an admission names no scope, the first, the second or both (bits of the mask)
scoped_step = st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 3), st.integers(0, 3)),
    st.tuples(st.just("admit"), st.integers(1, 3), st.integers(1, 3)),
    st.tuples(st.just("wait"), st.integers(1, 48).map(lambda k: k * TICK)),
    answers, answers,
    st.tuples(st.just("cool"), st.integers(0, 3), ticks),
)
scoped_steps = st.integers(10, 60).flatmap(
    lambda n: st.lists(scoped_step, min_size=n, max_size=n))


@dataclass
class Run:
    """The core and the script, side by side, on one clock."""

    client: redis.Redis
    script: object
    pool: Pool
    prefix: str
    now: float = START
    core: Limiter = field(init=False)
    #: core lease id -> the script's token for the same lease
    tokens: dict[int, str] = field(default_factory=dict)
    leases: list[Lease] = field(default_factory=list)
    answered: dict[str, int] = field(default_factory=dict)
    next_token: int = 1
    scopes: list[Scope] = field(default_factory=list)

    def __post_init__(self) -> None:
        p = self.pool
        exits = [make_exit(f"http://127.0.0.{10 + i}:3128") for i in range(p.exits)]
        limits = Limits(rate=p.rate, burst=p.burst, concurrency=p.concurrency,
                        origin_rate=p.origin_rate, origin_burst=p.origin_burst)
        tuning = Tuning(margin=0.0, jitter=0.0, breaker_after=p.breaker_after,
                        breaker_cooldown=p.breaker_cooldown)
        self.core = Limiter(exits, limits, clock=lambda: self.now, tuning=tuning,
                            rng=random.Random(0))
        self.scopes = [Scope(f"scope~{i}", rate, burst)
                       for i, (rate, burst) in enumerate(p.scopes)]

    # -- the script, as the Redis backend calls it ---------------------------------
    def key(self, kind: str, *parts: str) -> str:
        return f"{{{self.prefix}}}:{kind}:" + "|".join(parts)

    def call(self, keys: list[str], args: list) -> list:
        seconds = math.floor(self.now)
        self.client.hset(CLOCK_KEY, mapping={"s": seconds,
                                             "us": round((self.now - seconds) * 1e6)})
        reply = self.script(keys=keys, args=args)
        if args[0] == "admit":
            assert float(reply[0]) == self.now  # the script ran on the test's clock
        return reply

    def replicate(self, feedback: Feedback) -> None:
        for change in feedback.changes:  # as RedisBackend._replicate
            if isinstance(change, PairHeld):
                seconds = change.until - self.now
                if seconds > 0:
                    self.call([self.key("pair", change.origin, change.pair)],
                              ["hold", HOLD_FIELDS[change.hold], repr(seconds),
                               repr(change.tolerance)])

    # -- steps -------------------------------------------------------------------
    def admit(self, want: int, mask: int = 0) -> None:
        core, now = self.core, self.now
        scopes = [scope for i, scope in enumerate(self.scopes) if mask >> i & 1]
        ostate = core.origin_state(ORIGIN)
        # what the core rules out locally, as its plan does: dead exits, exits it fills,
        # pairs waiting for an answer; the rest go to the script in pool order
        candidates = []
        for exit_id, exit_state in core.exits.items():
            pair = ostate.pairs.get(core.pair_key(exit_id))
            if (exit_state.health.dead(now) or exit_state.in_flight >= exit_state.limit
                    or (pair is not None and pair.single_file)):
                continue
            candidates.append(exit_id)
        if any((p := ostate.pairs.get(core.pair_key(e))) is None or not p.proven
               or p.half_open for e in candidates):
            # a new pair, or a half-open one, takes one request until it hears back: the
            # core knows after each grant, the script would take a burst in one call
            want = 1
        # so does a shared budget's first request, and the next waits for its answer (or
        # FIRST_ANSWER_WAIT): the Redis backend asks nothing of the script meanwhile
        gate, first = core.first_answer_gate(ORIGIN, scopes, now)
        if gate is not None:  # the core grants nothing either (it may name an earlier
            # time, a pair's token or a lease's release, and then the gate)
            assert not isinstance(core.try_admit(ORIGIN, now, scopes=scopes), Lease)
            return
        if first:
            want = 1
        # the core: as the memory backend admits (admit_here)
        granted: list[Lease] = []
        core_wait = now
        while len(granted) < want:
            got = core.try_admit(ORIGIN, now, scopes=scopes)
            if not isinstance(got, Lease):
                core_wait = got
                break
            granted.append(got)
        # the script, with the pacing the core synced (a new pair's made by now)
        budget = ostate.budget.bucket
        keys = [self.key("origin", ORIGIN), self.key("learn", ORIGIN)]
        args = ["admit", want, "t", self.next_token, 1e6,
                budget.interval if budget is not None else 0,
                budget.tolerance if budget is not None else 0, 0, 0, "0.5"]
        for exit_id in candidates:
            pair = core.pair_state(ORIGIN, exit_id)
            keys += [self.key("pair", ORIGIN, core.pair_key(exit_id)),
                     self.key("lease", exit_id), self.key("exit", exit_id)]
            args += [repr(pair.bucket.interval), repr(pair.bucket.tolerance),
                     core.exits[exit_id].limit, 0]
        scope_budgets = core.scope_budgets(scopes, now)
        for scope_key, bucket in scope_budgets:  # as RedisBackend._admit_on
            keys.append(self.key("scope", scope_key))
            args += [repr(bucket.interval), repr(bucket.tolerance)]
        reply = self.call(keys, args) if candidates else [repr(now), "inf", 0, "0"]
        script_wait = float(reply[1])
        script = [(candidates[int(i) - 1], float(gap))
                  for i, gap in zip(reply[4::4], reply[5::4], strict=True)]
        assert [e for e, _ in script] == [lease.exit_id for lease in granted], (
            f"at {now}: the script granted {script}, the core {granted}")
        for (_, gap), lease in zip(script, granted, strict=True):
            if math.isfinite(lease.gap):
                assert gap == pytest.approx(lease.gap, abs=EPS)
            else:
                assert gap > 1e17  # never admitted before: the script's "never"
            self.tokens[lease.id] = f"t:{self.next_token}"
            self.next_token += 1
        self.leases += granted
        if len(granted) < want:
            # never later; equal unless the script saw a token before the lease limit or
            # the origin budget stopped it (see the module docstring)
            assert script_wait <= core_wait + EPS, (now, script_wait, core_wait)
            if not self._script_may_wake_early(candidates, bool(scope_budgets)):
                assert script_wait == pytest.approx(core_wait, abs=EPS), (now, script_wait,
                                                                         core_wait)

    def _script_may_wake_early(self, candidates: list[str], scoped: bool = False) -> bool:
        core, now = self.core, self.now
        ostate = core.origin_state(ORIGIN)
        for exit_id in candidates:
            pair = core.pair_state(ORIGIN, exit_id)
            ready = pair.ready_at(now) <= now
            full = core.exits[exit_id].in_flight >= core.exits[exit_id].limit
            if (full and not ready) or (ready and not full
                                        and (ostate.budget.bucket or scoped)):
                return True
        return False

    def answer(self, pick: int, kind: str, seconds: float, rate: float) -> None:
        if not self.leases:
            return
        core, pool = self.core, self.pool
        lease = self.leases.pop(pick % len(self.leases))
        if kind == "ok":
            self.replicate(core.success(lease, self.now - lease.admitted_at))
        elif kind == "429":
            self.replicate(core.rate_limited(ORIGIN, lease.exit_id, max(seconds, TICK)))
        elif kind == "quota":
            self.replicate(core.announced(lease, None, 0, max(seconds, TICK)))
        answered = kind != "lost" and self.answered.get(lease.pair, 0) < 2
        self.release(lease, answered)
        if kind == "rate" and pool.burst == 1:
            rate = min(rate, pool.rate)
            # up or down: both sides start the new pace one new interval after the last
            self.replicate(core.announced(lease, rate, None, None))

    def release(self, lease: Lease, answered: bool) -> None:
        core = self.core
        pair = core.pair_state(ORIGIN, lease.exit_id)
        # what the Redis backend sends with a release: slack and interval before it
        slack, interval = core.arrival_slack(pair), pair.bucket.interval
        core.release(lease.id, answered)
        if answered:
            self.answered[lease.pair] = self.answered.get(lease.pair, 0) + 1
        token = self.tokens.pop(lease.id)
        keys = [self.key("lease", lease.exit_id), self.key("pair", ORIGIN, lease.pair)]
        # 2: answered on a cold path, as RedisBackend sends it
        args = ["release", token, 0 if not answered else 1 if slack else 2, repr(slack),
                repr(interval)]
        if answered:  # the origin budget and each scope re-anchored, as RedisBackend sends it
            budget = core.origin_state(ORIGIN).budget
            shared = [(self.key("origin", ORIGIN), budget.arrivals, budget.bucket)]
            shared += [(self.key("scope", scope.id), core.scopes.states[scope.id].arrivals,
                        core.scopes.states[scope.id].bucket) for scope in lease.scopes]
            for key, arrivals, bucket in shared:
                if bucket is not None:
                    keys += [self.key("lease", lease.exit_id), key]
                    args += [token, 1, repr(arrivals.slack), repr(bucket.interval)]
        self.call(keys, args)

    def cool(self, index: int, seconds: float) -> None:
        exit_id = list(self.core.exits)[index % len(self.core.exits)]
        self.replicate(self.core.rate_limited(ORIGIN, exit_id, max(seconds, TICK)))


RUNS = iter(range(10**9))

#: bounded so that a failure shrinks to its minimal example within seconds
SETTINGS = settings(max_examples=150, deadline=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def drive(client, lua: str, pool: Pool, sequence: list) -> Run:
    run = Run(client, client.register_script(lua), pool, f"diff{next(RUNS)}")
    for step in sequence:
        if step[0] == "admit":
            run.admit(*step[1:])
        elif step[0] == "wait":
            run.now += step[1]
        elif step[0] == "answer":
            run.answer(*step[1:])
        else:
            run.cool(*step[1:])
    run.admit(3)
    return run


@SETTINGS
@given(pools, steps)
# a rate stated on one pair's answer, then a tie: the core must rank the pair as paced
# at its new rate (later), as the script does, not by the token it had before
@example(Pool(exits=2, rate=4.0, burst=1, concurrency=1, origin_rate=None, origin_burst=1,
              breaker_after=2, breaker_cooldown=0.5),
         [("admit", 1)] * 6 + [("answer", 0, "rate", 0.0, 2.0), ("wait", TICK),
                               ("answer", 0, "ok", 0.0, 2.0), ("wait", 0.484375)])
def test_the_script_and_the_core_grant_alike(client, pool, sequence):
    drive(client, script_on_test_clock(SCRIPT), pool, sequence)


@SETTINGS
@given(scoped_pools, scoped_steps)
def test_with_named_scopes_the_script_and_the_core_grant_alike(client, pool, sequence):
    drive(client, script_on_test_clock(SCRIPT), pool, sequence)


def test_a_scoped_sequence_takes_scope_tokens_on_both_sides(client):
    """The scoped strategy is not vacuous: a scope's budget, not a pair's, holds the
    second request (the two exits are free and ready) on both sides alike."""
    pool = Pool(exits=2, rate=16.0, burst=1, concurrency=1, origin_rate=None,
                origin_burst=1, breaker_after=4, breaker_cooldown=0.5,
                scopes=((2.04, 1), (16.32, 1)))
    run = drive(client, script_on_test_clock(SCRIPT), pool,
                [("admit", 1, 3), ("wait", 0.0625), ("admit", 1, 1)])
    # the scoped second admission got nothing; the final unscoped admit(3) is not held up
    # by the scope (the other exit), and the first exit waits for its answer
    assert [lease.scopes for lease in run.leases] == [tuple(run.scopes), ()]


#: a pace that changes between two admissions, each way
PACE_CHANGES = {
    "faster": [("admit", 1), ("wait", 0.5), ("answer", 0, "rate", 0.0, 2.0),  # slower, rested
               ("wait", 0.5), ("admit", 1),  # on the slower pace, from the cold answer
               ("answer", 0, "rate", 0.0, 8.0),  # faster: the next token 1/8 s on, not 1/2
               ("admit", 1)],
    "slower": [("admit", 1), ("wait", 0.0625), ("answer", 0, "rate", 0.0, 8.0),
               ("wait", 0.125), ("admit", 1),  # on the 8 r/s pace
               ("answer", 0, "rate", 0.0, 2.0),  # slower: the next token 1/2 s on, not 1/8
               ("wait", 0.25), ("admit", 1)],
    # slower after a cold answer: from the answer (the request may have reached the
    # server as late as that), not from the admission 50 ms before it
    "after-cold": [("admit", 1), ("wait", 0.05), ("answer", 0, "rate", 0.0, 2.0),
                   ("wait", 0.45), ("admit", 1), ("wait", 0.05), ("admit", 1)],
}
SLOWER_PACE = "        c[i].tat = math.max(c[i].tat, math.max(c[i].last, c[i].arr) + c[i].interval)"
#: the script's line for each pace change, changed to keep the old schedule
PACE_MUTANTS = {
    "faster": ("        c[i].tat = c[i].tat - (old_ivl - c[i].interval)",
               "        c[i].tat = c[i].tat"),
    "slower": (SLOWER_PACE,
               "        c[i].tat = c[i].tat"),
    "after-cold": (SLOWER_PACE,
                   "        c[i].tat = math.max(c[i].tat, c[i].last + c[i].interval)"),
}


def pace_pool() -> Pool:
    return Pool(exits=1, rate=16.0, burst=1, concurrency=1, origin_rate=None, origin_burst=1,
                breaker_after=4, breaker_cooldown=0.5)


@pytest.mark.parametrize("change", sorted(PACE_CHANGES))
def test_a_new_pace_starts_one_new_interval_after_the_last_on_both_sides(client, change):
    drive(client, script_on_test_clock(SCRIPT), pace_pool(), PACE_CHANGES[change])


@pytest.mark.parametrize("change", sorted(PACE_MUTANTS))
def test_a_script_that_keeps_the_old_schedule_fails_it(client, change):
    line, changed = PACE_MUTANTS[change]
    lua = script_on_test_clock(SCRIPT)
    assert lua.count(line + "\n") == 1
    with pytest.raises(AssertionError):
        drive(client, lua.replace(line + "\n", changed + "\n"), pace_pool(),
              PACE_CHANGES[change])


# -- the test can fail: a one-line change to either side's token arithmetic fails it ----
#: (line of the script, the same line changed)
SCRIPT_MUTANTS = [
    # a take forgets the pair's schedule (tokens banked ahead of time are lost)
    pytest.param("    x.tat = math.max(x.tat, at) + x.interval", "    x.tat = at + x.interval",
                 id="take"),
    # a release re-anchors on the answer without the interval
    pytest.param("    local when = at + tonumber(interval)",
                 "    local when = at", id="release"),
    # the origin budget forgets its schedule
    pytest.param("      b.tat = math.max(b.tat, at) + b.interval", "      b.tat = at + b.interval",
                 id="origin-budget"),
]
#: (line of the script, the same line changed): named scopes' arithmetic
SCOPE_MUTANTS = [
    # a scope's burst is ignored (its tolerance read as 0)
    pytest.param("    shared[#shared + 1] = {key = key, interval = tonumber(ARGV[a]), "
                 "tol = tonumber(ARGV[a + 1]),",
                 "    shared[#shared + 1] = {key = key, interval = tonumber(ARGV[a]), tol = 0,",
                 id="scope-burst"),
    # a scope forgets its schedule between calls
    pytest.param("                           tat = num(redis.call('HGET', key, 'tat'), NEG), "
                 "hold = NEG}",
                 "                           tat = NEG, hold = NEG}", id="scope-schedule"),
]
#: TokenBucket method -> the same method with one line changed
CORE_MUTANTS = {
    "consume": lambda self, now: setattr(self, "tat", now + self._interval),
    "arrived": lambda self, when: setattr(self, "tat", max(self.tat, when)),
}
#: deterministic, no shrinking: only whether a divergence is found
MUTANT_SEARCH = settings(SETTINGS, derandomize=True, database=None, phases=[Phase.generate],
                         report_multiple_bugs=False)


def find_divergence(client, lua: str, scoped: bool = False) -> None:
    @MUTANT_SEARCH
    @given(scoped_pools if scoped else pools, scoped_steps if scoped else steps)
    def search(pool, sequence):
        drive(client, lua, pool, sequence)

    search()


@pytest.mark.parametrize(("line", "changed"), SCRIPT_MUTANTS)
def test_a_one_line_change_to_the_script_fails_it(client, line, changed):
    lua = script_on_test_clock(SCRIPT)
    assert lua.count(line + "\n") == 1
    with pytest.raises(AssertionError):
        find_divergence(client, lua.replace(line + "\n", changed + "\n"))


@pytest.mark.parametrize("method", sorted(CORE_MUTANTS))
def test_a_one_line_change_to_the_core_fails_it(client, monkeypatch, method):
    monkeypatch.setattr(TokenBucket, method, CORE_MUTANTS[method])
    with pytest.raises(AssertionError):
        find_divergence(client, script_on_test_clock(SCRIPT))


@pytest.mark.parametrize(("line", "changed"), SCOPE_MUTANTS)
def test_a_one_line_change_to_the_scripts_scope_arithmetic_fails_it(client, line, changed):
    lua = script_on_test_clock(SCRIPT)
    assert lua.count(line + "\n") == 1
    with pytest.raises(AssertionError):
        find_divergence(client, lua.replace(line + "\n", changed + "\n"), scoped=True)
