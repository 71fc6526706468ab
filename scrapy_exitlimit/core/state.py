"""Origin and pair state, made on first use from the configured limits.

A pair starts from its configured rate (a ceiling, lowered only by 429s: its
own limit, no probing above it) and burst, or, learned, at the origin's pool
rate with no burst (the server has not shown it takes one). An origin starts
with its configured origin rate as its budget, and a learner whose start rate
is a guess, not knowledge (the scout proves it first).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from .aliases import ExitAliases
from .bucket import TokenBucket
from .budget import OriginBudget
from .learner import OriginLearner, PairLearning
from .learning import RateEstimate
from .limits import Limits
from .origin import OriginState
from .pair import PairState

if TYPE_CHECKING:
    from .limiter import Tuning


class StateTable:
    """Every origin's state (its pairs inside), keyed as the server sees them."""

    def __init__(self, limits: Limits, tuning: Tuning, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.tuning = tuning
        self.clock = clock
        self.origins: dict[str, OriginState] = {}
        self.aliases = ExitAliases()

    def origin(self, key: str) -> OriginState:
        state = self.origins.get(key)
        if state is None:
            ol = self.limits.origin(key)
            t = self.tuning
            pool = RateEstimate(t.start_rate, floor=t.min_rate, ceiling=t.max_rate,
                                proven=False, reprobe_above=True)
            learner = OriginLearner(pool=pool, min_rate=t.min_rate, max_rate=t.max_rate,
                                    learning_of=partial(self._learning_of, key),
                                    site_ceiling=ol.rate, leap_factor=t.start_leap)
            state = self.origins[key] = OriginState(
                key, OriginBudget(ol.rate, ol.burst, t.margin), learner,
                last_used=self.clock())
        return state

    def _learning_of(self, origin: str, exit_id: str) -> PairLearning | None:
        pair = self.origins[origin].pairs.get(self.aliases.pair_key(exit_id))
        return None if pair is None else pair.learning

    def pair(self, origin: OriginState, exit_id: str) -> PairState:
        """The exit's pair for ``origin``: under its exit IP when known (``aliases.py``)."""
        key = self.aliases.pair_key(exit_id)
        pair = origin.pairs.get(key)
        if pair is None:
            pl = self.limits.pair(origin.key, exit_id)
            if pl.rate is not None:
                bucket = TokenBucket(pl.rate, pl.burst, self.tuning.margin)
            else:
                bucket = TokenBucket(origin.estimate.lo, 1, self.tuning.margin)
            own = self.configured_limit(origin.key, exit_id)
            pair = origin.pairs[key] = PairState(bucket, PairLearning(own))
        return pair

    def fixed_estimate(self, rate: float) -> RateEstimate:
        """A limit known from configuration or the server: no probing above it."""
        return RateEstimate(rate, floor=min(self.tuning.min_rate, rate), ceiling=rate)

    def configured_rate(self, origin: str, exit_id: str) -> float | None:
        return self.limits.pair(origin, exit_id).rate

    def configured_limit(self, origin: str, exit_id: str) -> RateEstimate | None:
        """The pair's configured rate as its own limit, or None (learned)."""
        rate = self.configured_rate(origin, exit_id)
        return self.fixed_estimate(rate) if rate is not None else None
