"""What an origin learned, as plain data: for a shared backend to publish and adopt.

The data (JSON-ready, times on the exporting limiter's clock, which a shared
backend keeps on the shared clock) holds the learner's own export, the 503
budget, and each pair's own limit under ``"own"``, by pair key. A configured
pair's limit that has learned nothing yet is left out: every process has it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .learner import estimate_data, load_estimate
from .learning import RateEstimate
from .origin import OriginState
from .pair import PairState

#: the configured rate of an exit's pair for this origin (None: learned)
ConfiguredRate = Callable[[str], "float | None"]


def pristine(own: RateEstimate, configured: float | None) -> bool:
    """A configured pair's limit that has learned nothing yet."""
    return (configured is not None and own.lo == configured and own.hi is None
            and own.ceiling == configured)


def learning_mark(origin: OriginState) -> tuple:
    """Changes whenever what the origin's pairs learned changes (not on ceiling drift)."""
    owns = tuple((key, p.own_limit.lo, p.own_limit.changed_at)
                 for key, p in origin.pairs.items() if p.own_limit is not None)
    return (origin.learner.mark(), origin.budget.overload_at, owns)


def export_learning(origin: OriginState, configured_rate: ConfiguredRate) -> dict[str, Any]:
    owns = {}
    for key, pair in origin.pairs.items():
        own = pair.own_limit
        if own is not None and not pristine(own, configured_rate(key)):
            owns[key] = estimate_data(own)
    budget = origin.budget
    return {
        **origin.learner.export(),
        "overload_rate": budget.overload_rate,
        "overloaded_until": budget.overloaded_until,
        "overload_at": budget.overload_at,
        "own": owns,
    }


def import_learning(origin: OriginState, data: Mapping[str, Any], *,
                    known_exit: Callable[[str], bool], pair_of: Callable[[str], PairState],
                    configured: Callable[[str], RateEstimate | None]) -> None:
    """Adopt what another process published for this origin. ``pair_of`` makes a pair
    (for an exit of this pool), ``configured`` is a pair's configured limit, if any."""
    origin.learner.load(data)
    budget = origin.budget
    budget.overloaded_until = data["overloaded_until"]
    budget.overload_at = data["overload_at"]
    budget.overload_rate = data["overload_rate"]
    budget.sync(origin.learner.site_rate())
    owns = data["own"]
    for key in set(owns) | set(origin.pairs):
        if not known_exit(key) and key not in origin.pairs:
            continue
        pair = origin.pairs.get(key) or pair_of(key)
        if key in owns:
            if pair.own_limit is None:
                pair.own_limit = RateEstimate(1.0)
            load_estimate(pair.own_limit, owns[key])
        else:
            pair.own_limit = configured(key)
