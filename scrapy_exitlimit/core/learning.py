"""Learning a rate limit from the server's answers: what is known clean, what drew a 429."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: slow start multiplies the rate by this on every confirmation until the first 429
GROWTH = 2.0
#: stop probing once the gap between known-clean and known-rejected is this small
RESOLUTION = 0.03
#: after a 429 at or below what was thought clean, restart this far under it: gently
#: for a lone 429 (near a converged limit, timing noise), hard when 429s come in a row
BACKOFF_BY_STREAK = (0.94, 0.7, 0.5)
#: a known ceiling is forgotten this fast while clean (per second): the server's
#: limit may have been raised, so probing resumes now and then
CEILING_DRIFT = 0.002


@dataclass
class RateEstimate:
    """What one limit is known to be: ``lo`` was seen clean, ``hi`` drew a 429.

    The rate to use is ``lo``; the rate to probe is ``target()``: ``lo x GROWTH``
    before any 429 (slow start), then the geometric middle of ``lo`` and ``hi``
    (bisection) until they are within ``RESOLUTION``. Plain arithmetic: the
    caller brings time and decides what counts as a confirmation.
    """

    lo: float
    hi: float | None = None
    floor: float = 0.05
    ceiling: float = math.inf
    #: when ``lo``/``hi`` last changed: 429s from requests admitted before this
    #: belong to a congestion event already accounted for
    changed_at: float = -math.inf
    #: when ``lo`` last went up: a 429 soon after says the raise was wrong
    raised_at: float = -math.inf

    def __post_init__(self) -> None:
        self.lo = min(max(self.lo, self.floor), self.ceiling)

    @property
    def converged(self) -> bool:
        if self.lo >= self.ceiling:
            return True
        return self.hi is not None and self.hi <= self.lo * (1 + RESOLUTION)

    def target(self) -> float:
        """The next rate worth trying; equal to ``lo`` when there is nothing to probe."""
        if self.converged:
            return self.lo
        if self.hi is None:
            return min(self.lo * GROWTH, self.ceiling)
        return min(math.sqrt(self.lo * self.hi), self.ceiling)

    def confirmed(self, rate: float, now: float) -> None:
        """``rate`` ran clean: it is the new floor of what we know."""
        if rate > self.lo:
            self.lo = min(rate, self.ceiling)
            if self.hi is not None and self.hi <= self.lo:
                self.hi = None  # the limit was raised: slow start again from here
            self.changed_at = self.raised_at = now

    def rejected(self, rate: float, now: float, streak: int = 1) -> None:
        """A 429 at ``rate`` (what was actually admitted just before it), the
        ``streak``-th in a row without a success in between."""
        rate = max(rate, self.floor)
        self.hi = rate if self.hi is None else min(self.hi, rate)
        if self.lo >= self.hi:  # what we thought clean is not: the limit is lower
            self.lo = max(self.hi * backoff(streak), self.floor)
        self.changed_at = now


    def drift(self, seconds: float) -> None:
        """Forget the ceiling slowly while clean."""
        if self.hi is not None and seconds > 0:
            self.hi *= 1 + CEILING_DRIFT * seconds


def backoff(streak: int) -> float:
    return BACKOFF_BY_STREAK[min(max(streak, 1), len(BACKOFF_BY_STREAK)) - 1]
