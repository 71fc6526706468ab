"""Learning one rate limit from the server's answers: what is known clean, what drew a 429."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: slow start multiplies the rate by this on every confirmation until the first 429
GROWTH = 2.0
#: stop probing once the gap between known-clean and known-rejected is this small
RESOLUTION = 0.03
#: ... in units of RESOLUTION: converged once clean and rejected are 2 x 3 % apart
CONVERGED = 2.0
#: after a 429 at or below what was thought clean, restart this far under it: gently
#: for a lone 429 (near a converged limit, timing noise), hard when 429s come in a row
BACKOFF_BY_STREAK = (0.94, 0.7, 0.5)
#: a gap between clean and rejected narrower than this factor is climbed, not bisected
CLIMB_BELOW = 1.5
#: steps up in a row beyond which a climb's step stops doubling
MAX_CLIMBS = 20
#: a start rate never proven clean that draws a 429 is tried again this much lower
DISCOVERY_BACKOFF = 0.5
#: a known ceiling is forgotten this fast while clean (per second), so a raised limit
#: is found: fast at first, slower each time a re-probe finds the ceiling where it was
CEILING_DRIFT = 0.0075
CEILING_DRIFT_MIN = 0.001


@dataclass
class RateEstimate:
    """What one limit is known to be: ``lo`` was seen clean, ``hi`` drew a 429.

    The rate to use is ``lo``; the rate to probe is ``target()``: ``lo`` itself
    until it is ``proven`` (a start rate is a guess), then ``lo x GROWTH`` before
    any 429 (slow start), then the geometric middle of ``lo`` and ``hi``
    (bisection) until they are within ``RESOLUTION``. While clean, ``hi`` drifts
    up so that probing resumes; a confirmation at or above the rate that last drew
    a 429 (``seen``) says the limit was raised: slow start again from there.
    Plain arithmetic: the caller brings time and decides what counts as a
    confirmation.
    """

    lo: float
    hi: float | None = None
    floor: float = 0.05
    ceiling: float = math.inf
    #: when ``lo``/``hi`` last changed: 429s from requests admitted before this
    #: belong to a congestion event already accounted for
    changed_at: float = -math.inf
    proven: bool = True
    #: the rate that last drew a 429, before any drift
    seen: float | None = None
    drift_rate: float = CEILING_DRIFT
    #: how close clean and rejected must come before probing stops
    resolution: float = RESOLUTION
    #: probes confirmed in a row under a known ceiling: each step up is twice the last
    climbs: int = 0
    #: converged since the last change: a 429 now comes from a re-probe
    settled: bool = False
    #: once settled, probe above the last 429 when the ceiling has drifted past it, and
    #: never at it or just under it (a shared estimate, one scout at a time; a pair's
    #: own would re-probe on every pair, and walks up to its 429 again instead)
    reprobe_above: bool = False
    #: the clean rate before the last raise when slow start made it, and when: a raise
    #: that draws 429s at once was wrong, and goes back
    raised_from: float | None = None
    raised_at: float = -math.inf
    #: probe under the last 429 once settled, where the ceiling's drift has reopened a
    #: gap there (False: hold at ``lo`` until it drifts past the 429; the owner decides)
    refine: bool = True
    #: (lo, seen, the data) as recalled from an earlier run: what this run did not
    #: learn anew is remembered as it was
    recalled: tuple[float, float | None, dict[str, Any]] | None = field(
        default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.lo = min(max(self.lo, self.floor), self.ceiling)

    @property
    def converged(self) -> bool:
        if self.lo >= self.ceiling:
            return True
        return self.hi is not None and self.hi <= self.lo * (1 + CONVERGED * self.resolution)

    def target(self) -> float:
        """The next rate worth trying; equal to ``lo`` when there is nothing to probe."""
        if not self.proven:
            return self.lo
        if self.reprobe_above and self.settled and self.seen is not None and \
                self.hi is not None and self.lo >= self.seen * (1 - CONVERGED * RESOLUTION):
            # settled right under the last 429: only a probe above it tells whether the
            # limit was raised, once the ceiling has drifted well past it (8 s at first);
            # one at the 429 or within half a resolution under it is that 429 again
            # (lab and nginx per-IP: a 429 4 s after converging, one in 1,000 pages;
            # the simulator's loosened limit found 2 s sooner, its broad crawl the same)
            if self.hi >= self.seen * (1 + CONVERGED * RESOLUTION):
                return min(self.hi, self.ceiling)
            if not self.refine:
                return self.lo
            probe = self._next_probe()
            return probe if probe < self.seen * (1 - RESOLUTION / 2) else self.lo
        return self._next_probe()

    def _next_probe(self) -> float:
        if self.converged:
            return self.lo
        if self.hi is None:
            return min(self.lo * GROWTH, self.ceiling)
        # bisection; in a narrow gap, climb from what is clean in steps that double
        # while they run clean (a limit often sits right at the clean rate: one 429
        # finds that), never past the middle of the gap
        middle = math.sqrt(self.lo * self.hi)
        if self.hi > self.lo * CLIMB_BELOW:
            return min(middle, self.ceiling)
        step = self.lo * (1 + 2 * self.resolution * 2 ** min(self.climbs, MAX_CLIMBS))
        return min(step, middle, self.ceiling)

    def confirmed(self, rate: float, now: float) -> None:
        """``rate`` ran clean: it is the new floor of what we know (and an unproven
        ``lo`` is proven: the caller judged the pace close enough to it)."""
        if not self.proven:
            self.proven = True
            self.changed_at = now
        if rate > self.lo:
            # (a slow-start step, one clean answer far from any known ceiling)
            self.raised_from = self.lo if self.hi is None else None
            self.raised_at = now
            self.lo = min(rate, self.ceiling)
            self.climbs += 1
            if self.hi is not None and (self.hi <= self.lo or self.seen is not None
                                        and self.lo > self.seen * (1 + 1e-6)):
                # the limit was raised: slow start again from here
                self.forget_ceiling(now)
            self.changed_at = now
            self.settled = self.converged

    def ran_clean_under(self) -> None:
        """A probe ran clean but what went through stayed under ``lo`` (the pacing's own
        margin held it back): nothing new is known clean, yet the next probe steps
        further up, as after a confirmed step."""
        self.climbs = min(self.climbs + 1, MAX_CLIMBS)

    def rejected(self, rate: float, now: float, streak: int = 1) -> None:
        """A 429 at ``rate`` (what was actually admitted just before it), the
        ``streak``-th in a row without a success in between."""
        rate = max(rate, self.floor)
        # (a settled pool probes above the last 429 only: a 429 under it is the limit
        # found again, or lower, and probing less often would find a raised one late)
        if self.settled and self.seen is not None and \
                rate >= self.seen * (1.0 if self.reprobe_above else 1 - RESOLUTION):
            # a re-probe found the ceiling where it was: probe less often (and it is
            # where the last 429 put it, not at a probe above that)
            self.drift_rate = max(self.drift_rate / 2, CEILING_DRIFT_MIN)
            rate = min(rate, self.seen)
        self.seen = rate
        self.climbs = 0
        self.hi = rate if self.hi is None else min(self.hi, rate)
        if not self.proven:  # the start rate was a guess, and too high
            self.lo = max(min(self.lo, rate * DISCOVERY_BACKOFF), self.floor)
        elif self.lo >= self.hi:  # what we thought clean is not: the limit is lower
            self.lo = max(self.hi * backoff(streak), self.floor)
        self.changed_at = now
        self.settled = self.converged

    def forget_ceiling(self, now: float) -> None:
        """The ceiling no longer holds (the limit was raised, or slow exits set it): slow
        start again."""
        self.hi = self.seen = None
        self.drift_rate, self.climbs = CEILING_DRIFT, 0
        self.changed_at = now
        self.settled = self.converged

    def drift(self, seconds: float) -> None:
        """Forget the ceiling slowly while clean."""
        if self.hi is not None and seconds > 0:
            self.hi *= 1 + self.drift_rate * seconds

    # -- across runs (warm start) ----------------------------------------------
    def remembered(self, allowance: float = 0.0) -> dict[str, Any]:
        """What a later run may start from: the clean rate, the ceiling, how settled.
        ``allowance``: seconds the pacing added to every 1/rate interval on top of what
        a later run starts with (rates are remembered as the pace they really were)."""
        def pace(rate: float | None) -> float | None:
            return None if rate is None else 1.0 / (1.0 / rate + allowance)
        out = {"clean": pace(self.lo), "ceiling": pace(self.hi), "seen": pace(self.seen),
               "settled": self.settled, "drift": self.drift_rate}
        if self.recalled is not None:  # a recalled pace is a pace already
            lo, seen, data = self.recalled
            if self.lo == lo:
                out["clean"] = data["clean"]
            if self.seen == seen and seen is not None:
                out["seen"] = data["seen"]
        return out

    def recall(self, data: Mapping[str, Any], now: float) -> None:
        """Start from what an earlier run learned (``remembered()``): its clean rate is
        proven, so there is no discovery, within this run's floor and ceiling; its ceiling
        is where the last 429 found it, without the drift of the earlier run or of the
        time between runs (probing above it resumes as it drifts from now on)."""
        self.lo = min(max(float(data["clean"]), self.floor), self.ceiling)
        hi, seen = data.get("ceiling"), data.get("seen")
        self.seen = None if seen is None else float(seen)
        if hi is not None and self.seen is not None:
            hi = min(hi, self.seen)
        self.hi = None if hi is None else max(float(hi), self.lo)
        drift = data.get("drift")
        self.drift_rate = CEILING_DRIFT if drift is None else \
            min(max(float(drift), CEILING_DRIFT_MIN), CEILING_DRIFT)
        self.proven = True
        self.climbs = 0
        self.changed_at = now
        self.settled = bool(data.get("settled")) and self.converged
        self.recalled = (self.lo, self.seen, dict(data))


def backoff(streak: int) -> float:
    return BACKOFF_BY_STREAK[min(max(streak, 1), len(BACKOFF_BY_STREAK)) - 1]
