"""Where the numbers come from: global settings with per-origin and per-exit overrides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: what a crawl adds to the core's exact arithmetic (the defaults of EXITLIMIT_SAFETY_MARGIN
#: and EXITLIMIT_JITTER, and the simulator's): seconds added to every pair interval, and
#: the stretch of a cooldown. Tuning itself defaults to none of either, so its laws are
#: plain arithmetic on a fake clock.
CRAWL_TUNING = {"margin": 0.005, "jitter": 0.1}


@dataclass(frozen=True)
class PairLimits:
    rate: float | None  # None: learn it from the server's answers
    burst: int


@dataclass(frozen=True)
class OriginLimits:
    rate: float | None  # None: no budget for the origin as a whole
    burst: int


@dataclass(frozen=True)
class Limits:
    """Limits from configuration.

    A pair's rate is the most specific one given: the exit's override or the
    origin's override (the lower of the two when both are set), else ``rate``;
    ``None`` everywhere means the rate is learned. ``concurrency`` is the
    ceiling of each exit's adaptive in-flight limit.
    """

    rate: float | None = None
    burst: int = 1
    concurrency: int = 8
    origin_rate: float | None = None
    origin_burst: int = 1
    origins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    exits: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def pair(self, origin: str, exit_id: str) -> PairLimits:
        o = self.origins.get(origin)
        e = self.exits.get(exit_id)
        if o is None and e is None:  # no override (most pairs, asked on every answer)
            return PairLimits(rate=self.rate, burst=self.burst)
        o, e = o or {}, e or {}
        rates = [r for r in (o.get("rate"), e.get("rate")) if r is not None]
        bursts = [b for b in (o.get("burst"), e.get("burst")) if b is not None]
        return PairLimits(
            rate=min(rates) if rates else self.rate,
            burst=min(bursts) if bursts else self.burst,
        )

    def origin(self, origin: str) -> OriginLimits:
        o = self.origins.get(origin, {})
        return OriginLimits(
            rate=o.get("origin_rate", self.origin_rate),
            burst=o.get("origin_burst", self.origin_burst),
        )

    def exit_concurrency(self, exit_id: str) -> int:
        return int(self.exits.get(exit_id, {}).get("concurrency", self.concurrency))
