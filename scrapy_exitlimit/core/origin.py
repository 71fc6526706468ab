"""One origin's state: its pairs, its budget, what its answers taught, its exit search."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .blame import TimeoutBlame
from .budget import OriginBudget
from .learner import OriginLearner
from .learning import RateEstimate
from .pair import PairState
from .selector import Search


@dataclass
class OriginState:
    key: str
    #: the origin as a whole: the site rate and the 503 budget (``budget.py``)
    budget: OriginBudget
    #: what the origin's answers taught: the pool's per-IP rate, the site's, scouts
    learner: OriginLearner
    #: pair state by pair key (the exit IP when known, else the exit id)
    pairs: dict[str, PairState] = field(default_factory=dict)
    last_admit: float = -math.inf  # the origin's latest admission, any exit
    last_used: float = -math.inf  # its latest admission attempt (forgetting reads it)
    search: Search = field(default_factory=Search)
    timeouts: TimeoutBlame = field(default_factory=TimeoutBlame)

    @property
    def estimate(self) -> RateEstimate:
        """The origin's typical per-IP limit, learned once for the whole pool."""
        return self.learner.pool

    @property
    def scout(self) -> str | None:
        return self.learner.scout
