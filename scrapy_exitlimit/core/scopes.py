"""Named scopes: a budget every exit shares, keyed by something the request carries.

A server that limits an account, an API key or a cookie session counts that key's
requests whatever exit they leave from. A request naming scopes needs a token from
each scope's bucket, taken together with the origin's and the pair's token and the
exit lease (``limiter.py``: ``take_together``), or none of them.

A scope's rate is configured (a fixed bucket of ``rate`` and ``burst``), or learned
with the site rate's machinery (``learner.SharedRateLearner``): a 429 its pair's
spacing does not explain, on a request that needed the scope, is evidence against the
scope (not the site nor the pairs); once such 429s come from two exits, the scope's
rate goes where the scope actually took requests, and is learned from there. Unlike
the site, a learned scope is paced from its first request: naming a scope says it is
limited, so it starts at the start rate (a guess, proven by clean answers at that
pace, then slow start), and the first burst over every exit does not all land on it.
Found with no limit (its rate grown to the maximum), it has no bucket until 429s say
otherwise.

Scopes are named by id, never by the name a request gave: names may be secrets (an
API key), so an id is ``scope~<12 hex>``, a keyed hash of the name (``scope_id``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .bucket import ArrivalFloor, TokenBucket
from .exits import keyed_hash
from .learner import SharedRateLearner
from .learning import RateEstimate

#: a scope untouched this long (seconds), with no lease in flight, is dropped
SCOPE_IDLE = 3600.0
#: a scope's requests leave through many exits, each path delaying them its own way, so
#: two paced 1/rate apart may arrive closer: a scope's interval is this much longer
SCOPE_SPREAD = 0.02


def _margin(rate: float, margin: float) -> float:
    return margin + SCOPE_SPREAD / rate


def scope_id(name: str, key: bytes | None = None) -> str:
    """What logs, stats, telemetry and shared keys call the scope ``name``."""
    return f"scope~{keyed_hash(name, key)}"


@dataclass(frozen=True)
class Scope:
    """A scope a request needs: its id, and its configured rate (None: learned)."""

    id: str
    rate: float | None = None
    burst: int = 1


class ScopeState:
    """One scope's bucket and, when its rate is learned, its learner."""

    __slots__ = ("arrivals", "bucket", "id", "last_admit", "last_tick", "last_used", "learner")

    def __init__(self, scope: Scope, *, start_rate: float, min_rate: float, max_rate: float,
                 margin: float) -> None:
        self.id = scope.id
        self.learner: SharedRateLearner | None = None
        self.bucket: TokenBucket | None = None
        if scope.rate is not None:
            self.bucket = TokenBucket(scope.rate, scope.burst, _margin(scope.rate, margin))
        else:
            self.learner = SharedRateLearner(
                min_rate=min_rate, max_rate=max_rate, kind="scope",
                site=RateEstimate(start_rate, floor=min_rate, ceiling=max_rate, proven=False))
        self.last_admit = -math.inf
        self.last_used = -math.inf
        self.last_tick = -math.inf
        self.arrivals = ArrivalFloor()

    def answered(self, now: float, latency: float) -> None:
        """A request of the scope was answered ``latency`` after admission: the scope's
        next request goes an interval after it surely arrived (``bucket.ArrivalFloor``)."""
        self.arrivals.answered(now, latency, self.bucket)

    def budget(self, now: float, margin: float) -> TokenBucket | None:
        """The bucket to take from (a learned rate synced first; None: no limit yet)."""
        learner = self.learner
        if learner is None:
            return self.bucket
        elapsed = now - self.last_tick
        if elapsed >= 1.0:
            self.last_tick = now
            if math.isfinite(elapsed):
                learner.drift(elapsed)
        rate = learner.site_rate()
        if rate is None:
            self.bucket = None
        elif self.bucket is None:
            self.bucket = TokenBucket(rate, 1, _margin(rate, margin))
        elif rate != self.bucket.rate:
            self.bucket.set_rate(rate, margin=_margin(rate, margin))
        return self.bucket

    @property
    def rate(self) -> float | None:
        """The rate the scope is paced at now (None: not limited)."""
        return None if self.bucket is None else self.bucket.rate

    def __repr__(self) -> str:
        return f"<ScopeState {self.id} bucket={self.bucket!r}>"


class ScopeTable:
    """Every scope's state, made on first use."""

    def __init__(self, *, start_rate: float, min_rate: float, max_rate: float, margin: float,
                 clock: Callable[[], float]) -> None:
        self.start_rate = start_rate
        self.min_rate = min_rate
        self.max_rate = max_rate
        self.margin = margin
        self.clock = clock
        self.states: dict[str, ScopeState] = {}
        #: learned rates an earlier run remembered, by scope id, for scopes not met yet
        #: in this one (a scope's state is made on first use, when its rule is known)
        self.recalled: dict[str, Mapping[str, Any]] = {}

    def state(self, scope: Scope) -> ScopeState:
        state = self.states.get(scope.id)
        if state is None:
            state = self.states[scope.id] = ScopeState(
                scope, start_rate=self.start_rate, min_rate=self.min_rate,
                max_rate=self.max_rate, margin=self.margin)
            remembered = self.recalled.pop(scope.id, None)
            if remembered is not None and state.learner is not None:  # configured: its rate
                state.learner.recall_rate(remembered, self.clock())
        return state

    # -- what was learned, as data (shared backends, warm start) ---------------------
    def learned(self, scope_id: str) -> SharedRateLearner | None:
        state = self.states.get(scope_id)
        return None if state is None else state.learner

    def export(self, scope_id: str) -> dict[str, Any] | None:
        """What the scope learned (times on this table's clock); None: nothing to say."""
        learner = self.learned(scope_id)
        return None if learner is None else {"rate": learner.export_rate()}

    def adopt(self, scope_id: str, data: Mapping[str, Any]) -> None:
        """Take what another process learned of a learned scope met here."""
        learner = self.learned(scope_id)
        if learner is not None:
            learner.load_rate(data.get("rate"))

    def remember(self) -> dict[str, dict[str, Any]]:
        """scope id -> {"at": last used (this table's clock), "rate": the proven rate},
        for the learned scopes used in this run."""
        out = {}
        for scope_id, state in self.states.items():
            rate = None if state.learner is None else state.learner.remembered_rate()
            if rate is not None and math.isfinite(state.last_used):
                out[scope_id] = {"at": state.last_used, "rate": rate}
        return out

    def budgets(self, scopes: Sequence[Scope], now: float) -> list[TokenBucket]:
        """The buckets these scopes take from now (learned ones not yet limited: none)."""
        out = []
        for scope in scopes:
            state = self.state(scope)
            state.last_used = now
            bucket = state.budget(now, self.margin)
            if bucket is not None:
                out.append(bucket)
        return out

    def admitted(self, scopes: Sequence[Scope], exit_id: str, now: float
                 ) -> tuple[float, ...]:
        """An admission that took these scopes' tokens; returns each one's gap since its
        previous admission."""
        gaps = []
        for scope in scopes:
            state = self.state(scope)
            gaps.append(now - state.last_admit)
            state.last_admit = state.last_used = now
            if state.learner is not None:
                state.learner.admitted(exit_id, now)
        return tuple(gaps)

    def forget_idle(self, busy: Iterable[str], now: float) -> int:
        """Drop scopes idle for SCOPE_IDLE with no lease in flight (``busy``)."""
        keep = set(busy)
        idle = [k for k, s in self.states.items()
                if k not in keep and now - s.last_used > SCOPE_IDLE]
        for key in idle:
            del self.states[key]
        return len(idle)


class ScopeRules:
    """Configured scope rates (EXITLIMIT_SCOPES): exact names first, then ``*`` patterns
    in the order given; a name no rule matches is learned."""

    def __init__(self, rules: Mapping[str, tuple[float | None, int]] | None = None,
                 key: bytes | None = None) -> None:
        self.key = key
        self.exact: dict[str, tuple[float | None, int]] = {}
        self.patterns: list[tuple[re.Pattern[str], tuple[float | None, int]]] = []
        for name, limit in (rules or {}).items():
            if "*" in name:
                regex = ".*".join(re.escape(part) for part in name.split("*"))
                self.patterns.append((re.compile(regex, re.S), limit))
            else:
                self.exact[name] = limit
        self._seen: dict[str, Scope] = {}

    def __bool__(self) -> bool:
        return bool(self.exact or self.patterns)

    def scope(self, name: str) -> Scope:
        """The scope a request names: its id and configured rate (None: learned)."""
        scope = self._seen.get(name)
        if scope is None:
            limit = self.exact.get(name)
            if limit is None:
                limit = next((lim for regex, lim in self.patterns if regex.fullmatch(name)),
                             (None, 1))
            scope = Scope(scope_id(name, self.key), *limit)
            if len(self._seen) >= 10_000:  # names may be many: remember the latest only
                self._seen.clear()
            self._seen[name] = scope
        return scope

    def scopes(self, value: object) -> tuple[Scope, ...]:
        """The scopes of ``meta['exitlimit_scope']``: a string or a list of strings."""
        if value is None or value == () or value == []:
            return ()
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)) or not all(
                isinstance(n, str) and n for n in names):
            raise ValueError("meta['exitlimit_scope'] must be a non-empty string or a list "
                             f"of them, got {type(value).__name__}")
        return tuple(sorted({self.scope(n) for n in names}, key=lambda s: s.id))
