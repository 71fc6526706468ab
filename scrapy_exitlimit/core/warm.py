"""Warm start: what a limiter learned, as plain data a later run starts from.

A run against an origin learned yesterday need not learn it again: the pool's
per-IP rate (clean rate, ceiling), the site's rate and the pairs slower than
the pool are remembered with the wall-clock time each was last used (and so is
the rate of each named scope learned, once proven), and recalled at the next
start:

1. an origin or pair last used more than ``max_age`` ago is ignored (limits move);
2. a pair of an exit no longer in the pool is dropped (ids are credential-free
   HMACs under the deployment's id key, so the same exit has the same id);
3. what is recalled is proven: no discovery, no slow start, the site budget in
   place from the first request; probing above a known ceiling resumes as it drifts;
4. a per-IP rate is remembered as the pace it really was: near a limit each pair
   spaces its requests wider by (a share of) the arrival jitter it measured, which a
   new run's pairs measure anew over their first answers, so the (median) allowance,
   what the pairs' pacing margin holds beyond the safety margin, is folded into the rate.

Only origins crawled in this run are remembered (an origin recalled and never
used keeps its old time, from wherever it was read). Times in the data are
wall-clock seconds (``time.time()``); the limiter runs on its own clock, so the
caller gives the offset between the two.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .learner import OriginLearner
from .limiter import INDEX_ABOVE, Limiter, PairState

#: pools up to this size start staggered (larger ones use the limiter's index)
STAGGER_MAX = INDEX_ABOVE


@dataclass
class Recalled:
    """What a recall took, and what it left out."""

    origins: list[str] = field(default_factory=list)
    pairs: int = 0
    stale_origins: int = 0
    stale_pairs: int = 0
    #: pairs of exits no longer in the pool
    gone_pairs: int = 0
    #: learned scopes (an account's, an API key's rate), and those too old to use
    scopes: int = 0
    stale_scopes: int = 0


def remember(limiter: Limiter, offset: float,
             origins: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """origin -> {"at", "pool", "site", "pairs": {exit id: {"at", "own"}}}, for the
    origins admitted on in this run (of ``origins``, when given); ``offset``: wall-clock
    time minus the limiter's."""
    out: dict[str, dict[str, Any]] = {}
    for origin in limiter.origins if origins is None else origins:
        ostate = limiter.origins.get(origin)
        if ostate is None:
            continue
        learner = ostate.learner
        if not math.isfinite(learner.first_admission):
            continue  # not crawled in this run: nothing new to say
        pairs = {}
        spreads = []  # the arrival jitter the pool's pairs allow for, when near its limit
        for pair_key, pair in ostate.pairs.items():
            pl = pair.learning
            allowance = _allowance(limiter, learner, pair)
            if pl.own is None:
                if limiter.arrival_slack(pair) > 0:  # warm: its spread is measured
                    spreads.append(allowance)
                continue
            own = learner.remembered_pair(pl, allowance)
            if own is not None and math.isfinite(pair.last_admit):
                pairs[pair_key] = {"at": pair.last_admit + offset, "own": own}
        learned = learner.remembered(statistics.median(spreads) if spreads else 0.0)
        if learned is None and not pairs:
            continue
        out[origin] = {"at": ostate.last_used + offset,
                       **(learned or {"pool": None, "site": None}), "pairs": pairs}
    return out


def remember_scopes(limiter: Limiter, offset: float) -> dict[str, dict[str, Any]]:
    """scope id -> {"at", "rate"}: the learned scopes used in this run, their rate once
    proven (a scope with a configured rate has nothing to remember)."""
    return {scope_id: {**entry, "at": entry["at"] + offset}
            for scope_id, entry in limiter.scopes.remember().items()}


def recall_scopes(limiter: Limiter, scopes: Mapping[str, Mapping[str, Any]], got: Recalled,
                  *, wall_now: float, max_age: float) -> None:
    """Learned scope rates (as ``remember_scopes`` returns them) for the scopes of this
    run: each starts from its rate when first met (a configured one keeps its own)."""
    for scope_id, entry in scopes.items():
        if wall_now - entry["at"] > max_age:
            got.stale_scopes += 1
        else:
            limiter.scopes.recalled[scope_id] = entry["rate"]
            got.scopes += 1


def _stagger(limiter: Limiter, origin: str, now: float) -> None:
    """Spread the exits' first requests over one interval of the recalled rate: pairs
    that start together at the same rate stay in step, so one stall of the client (or
    of a shared backend) delays a request on every exit at once, and the 429s that
    follow, on many exits within a moment, read as a site-wide limit."""
    exits = list(limiter.exits)
    if len(exits) > STAGGER_MAX:
        return  # a large pool is brought in a few exits at a time anyway
    interval = 1.0 / limiter.origin_state(origin).learner.pool.lo
    for i, exit_id in enumerate(exits):
        limiter.pair_state(origin, exit_id).bucket.hold_until(now + interval * i / len(exits))


def _allowance(limiter: Limiter, learner: OriginLearner, pair: PairState) -> float:
    """What the pair's pacing adds to every interval beyond its safety margin (near a
    limit, for the arrival jitter the pair measured)."""
    given = learner.given_limit(pair.learning)
    return max(pair.bucket.margin - limiter.safety_margin(pair, given), 0.0)


def recall(limiter: Limiter, origins: Mapping[str, Mapping[str, Any]], *, wall_now: float,
           max_age: float) -> Recalled:
    """Start the limiter from remembered ``origins`` (as ``remember`` returns them)."""
    got = Recalled()
    now = limiter.clock()
    for origin, entry in origins.items():
        if wall_now - entry["at"] > max_age:
            got.stale_origins += 1
            continue
        ostate = limiter.origin_state(origin)
        ostate.learner.recall(entry, now)
        got.origins.append(origin)
        _stagger(limiter, origin, now)
        for exit_id, pair in (entry.get("pairs") or {}).items():
            if wall_now - pair["at"] > max_age:
                got.stale_pairs += 1
            elif exit_id not in limiter.exits:
                got.gone_pairs += 1
            else:
                learning = limiter.pair_state(origin, exit_id).learning
                ostate.learner.recall_pair(learning, pair["own"], now)
                got.pairs += 1
    return got


__all__ = ["Recalled", "recall", "recall_scopes", "remember", "remember_scopes"]
