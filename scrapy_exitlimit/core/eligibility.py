"""Whether an exit can take a request for an origin now, and if not, what would change that.

One judgement for every exit search (the scan, the heap, and the plan a shared
backend sends to its shared state), checked in this order:

1. an evicted exit: ``DEAD`` until its eviction ends;
2. an exit at its lease limit: ``FULL``, a release on it helps;
3. a pair waiting for an answer (its first request, a half-open probe, or
   discovery holding it): ``AWAITS_ANSWER``, the answer helps;
4. the pair is paced at its current rate (which may move its next token), then
   ``LATER`` until its token, cooldown, ban and answer gate (``pair.py``) allow
   it, else ``READY``.

A shared backend checks tokens and leases in the shared state, so its plan asks
with ``token=False``: step 4 is then the cooldown and the ban (a pair held is
not paced; its pacing is synced when it comes back), then the answer gate.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Protocol

from .pair import PairState
from .pool import ExitState


class Verdict(Enum):
    READY = "ready"
    DEAD = "dead"
    FULL = "full"
    AWAITS_ANSWER = "awaits_answer"
    LATER = "later"


#: (verdict, until: when DEAD or LATER could change by itself (READY: now, else inf),
#: the pair: None when DEAD or FULL, not looked at). A plain tuple: this is the hot path.
Look = tuple[Verdict, float, "PairState | None"]

_READY, _DEAD, _FULL, _AWAITS, _LATER = (Verdict.READY, Verdict.DEAD, Verdict.FULL,
                                         Verdict.AWAITS_ANSWER, Verdict.LATER)
_LOOK_FULL: Look = (_FULL, math.inf, None)


class PairRules(Protocol):
    """What the judgement needs from the origin's state and laws."""

    def pair(self, exit_id: str) -> PairState:
        """The exit's pair for the origin (made when new)."""

    def awaits_answer(self, exit_id: str, pair: PairState, now: float) -> bool:
        """One request at a time (new pair, half-open, slow start wary after a 429), or
        discovery holding it."""

    def pace(self, exit_id: str, pair: PairState) -> float:
        """Bring the pair's pacing up to date; returns its rate."""


def settled(exit_state: ExitState, now: float) -> Look | float:
    """Steps 1 and 2, which need no pair: DEAD or FULL, else the exit's load (in flight
    over its limit; the pair decides)."""
    health = exit_state.health
    if health.dead(now):
        return (_DEAD, health.dead_until, None)
    limit = exit_state.limit
    if exit_state.in_flight >= limit:
        return _LOOK_FULL
    return exit_state.in_flight / limit


def judge(exit_id: str, exit_state: ExitState, rules: PairRules, now: float,
          token: bool = True) -> Look:
    """Whether ``exit_id`` can take a request now (see the module docstring)."""
    look = settled(exit_state, now)
    if isinstance(look, tuple):
        return look
    return judge_pair(exit_id, rules, now, token)


def judge_pair(exit_id: str, rules: PairRules, now: float, token: bool = True) -> Look:
    """Steps 3 and 4, for an exit ``settled`` left to its pair."""
    pair = rules.pair(exit_id)
    if rules.awaits_answer(exit_id, pair, now):
        return (_AWAITS, math.inf, pair)
    if not token:
        held = pair.held_until
        if held > now:
            return (_LATER, held, pair)
        rules.pace(exit_id, pair)
        gate = pair.answer_gate()  # (what this process has in flight on the pair)
        if gate > now:
            return (_LATER, gate, pair)
        return (_READY, now, pair)
    rules.pace(exit_id, pair)
    ready = pair.ready_at(now)
    if ready > now:
        return (_LATER, ready, pair)
    return (_READY, now, pair)
