"""The origin budget: one bucket for the origin as a whole, over every exit.

It paces at the lower of two rates, and is absent while neither applies:

- the **site rate**: learned once 429s point at the origin as a whole, or
  configured (``EXITLIMIT_ORIGIN_RATE``, also the learned one's ceiling);
- the **503 budget**. A 503 is the origin overloaded, whichever exit asked.
  Once per congestion event (503s to requests admitted before the last
  decrease count once), the budget drops to ``backoff`` times the rate the
  origin was actually admitted at over the second before the refused request
  went out (or the budget's own rate, when lower), floored at ``min_rate``,
  and the bucket is held for the Retry-After (1 s when none is given). No
  increase before twice that (at least 2 s); then each clean answer adds
  ``max(2 %, 1 / rate)`` r/s (about +1 r/s per second), until the budget is
  above every other limit, when it is gone.
"""

from __future__ import annotations

import math

from .bucket import ArrivalFloor, TokenBucket


class OriginBudget:
    """The origin-wide bucket and the 503 budget's state."""

    __slots__ = ("arrivals", "bucket", "burst", "margin", "overload_at", "overload_rate",
                 "overloaded_until")

    def __init__(self, rate: float | None, burst: int, margin: float) -> None:
        #: None while neither a site rate nor a 503 budget applies
        self.bucket: TokenBucket | None = TokenBucket(rate, burst) if rate is not None else None
        self.burst = burst
        self.margin = margin
        self.overloaded_until = -math.inf  # 503: no budget increase before this
        self.overload_at = -math.inf  # the last 503 decrease
        self.overload_rate: float | None = None  # the 503 budget, growing back while clean
        #: when the origin's requests surely arrived: its pacing is re-anchored on answers
        self.arrivals = ArrivalFloor()

    def sync(self, site_rate: float | None, last_admit: float = -math.inf
             ) -> TokenBucket | None:
        """Pace at the lower of the site rate and the 503 budget (None: no budget). A new
        budget's first request goes an interval after ``last_admit``, the origin's latest
        request: the server counted that one too (a site limit found on the crawl's first
        burst, its budget's first request at once, had drawn a 429 that set the site's
        ceiling at twice its start)."""
        rates = [r for r in (site_rate, self.overload_rate) if r is not None]
        if not rates:
            self.bucket = None
            return None
        rate = min(rates)
        bucket = self.bucket
        if bucket is None:
            bucket = self.bucket = TokenBucket(rate, self.burst, self.margin)
            if math.isfinite(last_admit):
                bucket.arrived(last_admit)
        elif rate != bucket.rate:
            bucket.set_rate(rate)
        return bucket

    @property
    def pacing_margin(self) -> float:
        """What the budget adds to every 1/rate interval while it paces (a configured
        rate's bucket has none), 0 while it does not."""
        return 0.0 if self.bucket is None else self.bucket.margin

    def answered(self, now: float, latency: float) -> None:
        """An answer ``latency`` after admission: while a budget paces the origin, its next
        request goes an interval after this one surely arrived (``bucket.ArrivalFloor``)."""
        self.arrivals.answered(now, latency, self.bucket)

    def congestion_is_new(self, admitted_at: float) -> bool:
        """A 503 to a request admitted after the last decrease: a new congestion event."""
        return admitted_at > self.overload_at

    def overloaded(self, now: float, admitted_rate: float, site_rate: float | None,
                   retry_after: float | None, *, backoff: float, min_rate: float
                   ) -> tuple[TokenBucket, float]:
        """A new congestion event (see ``congestion_is_new``): slow down and pause.
        Returns the bucket and the pause (seconds)."""
        self.overload_at = now
        current = self.bucket.rate if self.bucket is not None else math.inf
        self.overload_rate = max(min(admitted_rate, current) * backoff, min_rate)
        bucket = self.sync(site_rate)
        assert bucket is not None
        pause = retry_after if retry_after is not None else 1.0
        self.overloaded_until = now + max(pause, 1.0) * 2
        bucket.hold_until(now + max(pause, 0.0))
        return bucket, pause

    def may_recover(self, now: float) -> bool:
        return self.overload_rate is not None and now >= self.overloaded_until

    def recover(self, site_rate: float | None, top: float) -> None:
        """A clean answer once the pause is over: the 503 budget grows back, and is gone
        once above ``site_rate`` (or ``top`` when there is none)."""
        rate = self.overload_rate
        assert rate is not None
        rate += max(0.02 * rate, 1.0 / rate)
        if rate >= (site_rate if site_rate is not None else top):
            self.overload_rate = None
        else:
            self.overload_rate = rate
        self.sync(site_rate)

    def __repr__(self) -> str:
        return f"OriginBudget(bucket={self.bucket!r}, overload_rate={self.overload_rate!r})"
