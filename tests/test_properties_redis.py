"""The core's invariants, held by the shared-state Lua script against a real Redis.

Times come from Redis TIME (returned by every call), so the bounds are checked on the
clock the script itself used; nothing sleeps: hypothesis drives random sequences of
admissions, releases, cooldowns and bans with random pacing and lease limits.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXITS = ["a", "b", "c"]
EPS = 1e-5  # the script keeps times to the microsecond

ops = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 4), st.lists(st.sampled_from(EXITS), min_size=1,
                                                           max_size=3, unique=True)),
    st.tuples(st.just("release"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("hold"), st.sampled_from(EXITS), st.sampled_from(["cool", "ban"]),
              st.floats(0.0, 0.05)),
), min_size=1, max_size=40)


class Pool:
    """One random pool of pacing and limits, driven through the script."""

    def __init__(self, client, script, run: int, interval: float, burst: int, limit: int):
        self.client, self.script = client, script
        self.p = f"{{prop{run}}}"
        self.interval, self.tol, self.limit = interval, (burst - 1) * interval, limit
        self.burst = burst
        self.next_id = 1
        self.held: list[tuple[str, str]] = []  # (exit, token)
        self.admitted: dict[str, list[float]] = {e: [] for e in EXITS}
        self.blocked_until: dict[str, float] = {e: float("-inf") for e in EXITS}

    def key(self, kind: str, e: str) -> str:
        return f"{self.p}:{kind}:{e}"

    def admit(self, want: int, exits: list[str]) -> None:
        keys = [f"{self.p}:origin:o", f"{self.p}:learn:o"]
        # a horizon: a caller finding nothing ready now may be given a later token
        args = ["admit", want, "t", self.next_id, 30.0, 0, 0, 0, 0.05, 0.5]
        for e in exits:
            keys += [self.key("pair", e), self.key("lease", e), self.key("exit", e)]
            args += [repr(self.interval), repr(self.tol), self.limit, 1]
        reply = self.script(keys=keys, args=args)
        now = float(reply[0])
        for i, (index, reserved) in enumerate(zip(reply[4::4], reply[7::4], strict=True)):
            at = float(reserved) or now  # a reserved lease is sent at its time
            e = exits[int(index) - 1]
            assert at >= self.blocked_until[e] - EPS, "admitted during a cooldown or ban"
            self.admitted[e].append(at)
            self.held.append((e, f"t:{self.next_id + i}"))
        self.next_id += want
        for e in EXITS:  # leases never exceed the exit's limit
            assert self.client.zcard(self.key("lease", e)) <= self.limit

    def release(self, pick: int, answered: bool) -> None:
        if not self.held:
            return
        e, token = self.held.pop(pick % len(self.held))
        self.script(keys=[self.key("lease", e), self.key("pair", e)],
                    args=["release", token, 1 if answered else 0, 0.0, repr(self.interval)])

    def hold(self, e: str, field: str, seconds: float) -> None:
        before = self.client.hget(self.key("pair", e), field)
        left = float(self.script(keys=[self.key("pair", e)],
                                 args=["hold", field, repr(seconds), repr(self.tol)]))
        after = float(self.client.hget(self.key("pair", e), field))
        if before is not None:  # a later, shorter hold never shortens one already set
            assert after >= float(before) - EPS
        assert left >= seconds - EPS or before is not None
        self.blocked_until[e] = max(self.blocked_until[e], after)

    def check_rate(self) -> None:
        """Admissions on a pair in any window stay within window / interval + burst."""
        for times in map(sorted, self.admitted.values()):  # reserved ones come later
            for i, start in enumerate(times):
                for j in range(i, len(times)):
                    window = times[j] - start + 2e-6  # times go over the wire in µs
                    assert j - i + 1 <= window / self.interval + self.burst + EPS, times


RUNS = iter(range(10**9))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.floats(0.0005, 0.05), st.integers(1, 3), st.integers(1, 3), ops)
def test_script_keeps_rate_leases_and_cooldowns(lua_client, interval, burst, limit, steps):
    client, script = lua_client
    pool = Pool(client, script, next(RUNS), interval, burst, limit)
    for step in steps:
        if step[0] == "admit":
            pool.admit(step[1], step[2])
        elif step[0] == "release":
            pool.release(step[1], step[2])
        else:
            pool.hold(step[1], step[2], step[3])
    pool.check_rate()
