"""Token bucket as a GCRA: state is one timestamp, computed lazily from elapsed time."""

from __future__ import annotations

import math


class TokenBucket:
    """A token bucket of ``rate`` tokens/s holding at most ``burst`` tokens.

    Stored as the *theoretical arrival time* (GCRA): the bucket is full when
    ``tat <= now``; a token is available when ``now >= tat - tolerance``.
    ``margin`` is added to every emission interval so that a little arrival
    jitter on the way to a strict server does not land two requests closer
    than the server allows.
    """

    __slots__ = ("_interval", "_tolerance", "burst", "margin", "rate", "tat")

    def __init__(self, rate: float, burst: int = 1, margin: float = 0.0) -> None:
        self.tat = -math.inf
        self.margin = margin
        self.set_rate(rate, burst)

    def set_rate(self, rate: float, burst: int | None = None,
                 margin: float | None = None) -> None:
        if not rate > 0 or math.isinf(rate):
            raise ValueError(f"rate must be a positive finite number, got {rate!r}")
        burst = self.burst if burst is None else burst
        if margin is not None:
            self.margin = margin
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0, got {self.margin!r}")
        old_interval = getattr(self, "_interval", None)
        self.rate = rate
        self.burst = burst
        self._interval = 1.0 / rate + self.margin
        self._tolerance = (burst - 1) * self._interval
        if old_interval is not None and self._interval > old_interval and math.isfinite(self.tat):
            # A slower rate widens the tolerance (burst - 1 intervals, now longer): with
            # ``tat`` kept, tokens the old rate had not yet refilled would be free at once.
            # Keep the next token where it was; the slower pacing starts from there.
            self.tat += (burst - 1) * (self._interval - old_interval)

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def tolerance(self) -> float:
        """How far ahead of schedule a token may be taken: (burst - 1) intervals."""
        return self._tolerance

    def ready_at(self, now: float) -> float:
        """The earliest time, not before ``now``, at which a token is available."""
        return max(now, self.tat - self._tolerance)

    def consume(self, now: float) -> None:
        """Take one token; the caller has checked ``ready_at(now) <= now``."""
        self.tat = max(self.tat, now) + self._interval

    def arrived(self, when: float) -> None:
        """A request reached the server as late as ``when``: the next one is one interval on."""
        self.tat = max(self.tat, when + self._interval)

    def hold_until(self, when: float) -> None:
        """No token before ``when``, and then one, not a burst."""
        self.tat = max(self.tat, when + self._tolerance)

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self.rate:g}, burst={self.burst}, tat={self.tat:.3f})"


#: seconds at most a budget's second request waits for the first one's answer
FIRST_ANSWER_WAIT = 1.0
#: answers a budget (or a pair, ``pair.py``) needs before its fastest answer is trusted
#: to bound when its requests reached the server
WARM_ANSWERS = 3


class ArrivalFloor:
    """When the requests of a budget every exit shares (the origin's, a named scope's)
    surely reached the server: an answer ``latency`` after admission came from a request
    that arrived no later than the answer less the fastest answer seen, once a few answers
    show what fast is; before that (the first requests ride cold connections, and the
    first answer would be its own floor), no earlier than the answer itself. The next
    request goes an interval after that, as a pair's does: requests of a shared budget
    take many paths, and one that came late must not bring the next too close."""

    __slots__ = ("answers", "fastest", "first_out")

    def __init__(self) -> None:
        self.fastest = math.inf  # the shortest answer time seen: a path's floor
        self.answers = 0
        #: when the budget's first request went (None: not yet), see ``gate``
        self.first_out: float | None = None

    def gate(self, now: float) -> float | None:
        """Until when the budget's next request waits for its first one's answer (None:
        it need not). The first request rides a cold connection (through a proxy, a new
        tunnel), tens to hundreds of ms slower than the next, which, an interval behind
        it, would reach a strict server with it; the answer then anchors the next an
        interval on (``answered``). At most FIRST_ANSWER_WAIT, for a request that never
        hears back."""
        if self.answers or self.first_out is None:
            return None
        until = self.first_out + FIRST_ANSWER_WAIT
        return until if now < until else None

    def pending(self, bucket: TokenBucket) -> bool:
        """The budget's next request is its first, to be gated (one at a time). A budget
        with a burst takes two requests arriving together anyway: never gated."""
        return self.first_out is None and not self.answers and bucket.burst == 1

    def taken(self, now: float, bucket: TokenBucket) -> None:
        """A token of ``bucket`` was taken for a request."""
        if self.pending(bucket):
            self.first_out = now

    @property
    def slack(self) -> float:
        """How long before its answer a request surely reached the server."""
        return self.fastest if self.answers > WARM_ANSWERS else 0.0

    def answered(self, now: float, latency: float, bucket: TokenBucket | None) -> None:
        self.fastest = min(self.fastest, latency)
        self.answers += 1
        if bucket is not None:
            bucket.arrived(now - self.slack)
