"""Model origins for the simulator: the limits real servers apply, as plain arithmetic.

Each limit answers one question on a request's arrival: accept it now or not. An
:class:`OriginModel` combines a per-client-IP limit, an optional site-wide one,
banned IPs and a Retry-After, like an nginx ``limit_req`` origin (both zones must
pass; a rejected request consumes nothing).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

_EPS = 1e-9


class Limit:
    """One limiter: ``allows(t)`` asks, ``take(t)`` records an accepted request."""

    def allows(self, t: float) -> bool:
        raise NotImplementedError

    def take(self, t: float) -> None:
        raise NotImplementedError


class Unlimited(Limit):
    def allows(self, t: float) -> bool:
        return True

    def take(self, t: float) -> None:
        pass


class Gcra(Limit):
    """nginx ``limit_req`` with ``nodelay``: ``rate`` per second, ``burst`` at once."""

    def __init__(self, rate: float, burst: int = 1) -> None:
        self.rate, self.burst, self.tat = rate, burst, -math.inf

    def allows(self, t: float) -> bool:
        return t + _EPS >= self.tat - (self.burst - 1) / self.rate

    def take(self, t: float) -> None:
        self.tat = max(self.tat, t) + 1.0 / self.rate


class FixedWindow(Limit):
    """At most ``count`` requests in each window [k*window, (k+1)*window)."""

    def __init__(self, count: int, window: float) -> None:
        self.count, self.window = count, window
        self.slot, self.used = -1, 0

    def allows(self, t: float) -> bool:
        slot = int(t // self.window)
        return slot != self.slot or self.used < self.count

    def take(self, t: float) -> None:
        slot = int(t // self.window)
        if slot != self.slot:
            self.slot, self.used = slot, 0
        self.used += 1


class SlidingWindow(Limit):
    """At most ``count`` accepted requests in any ``window`` seconds (a sliding log)."""

    def __init__(self, count: int, window: float) -> None:
        self.count, self.window = count, window
        self.log: deque[float] = deque()

    def allows(self, t: float) -> bool:
        while self.log and self.log[0] <= t - self.window:
            self.log.popleft()
        return len(self.log) < self.count

    def take(self, t: float) -> None:
        self.log.append(t)


class Scheduled(Limit):
    """A limit that changes over time: ``steps`` are (from time, limit), in order."""

    def __init__(self, steps: Sequence[tuple[float, Limit]]) -> None:
        self.steps = list(steps)

    def _at(self, t: float) -> Limit:
        current = self.steps[0][1]
        for start, limit in self.steps:
            if t >= start:
                current = limit
        return current

    def allows(self, t: float) -> bool:
        return self._at(t).allows(t)

    def take(self, t: float) -> None:
        self._at(t).take(t)


LimitFactory = Callable[[], Limit]


@dataclass
class OriginModel:
    """An origin: a limit per client IP (overridable per IP), a site-wide one, bans."""

    per_ip: LimitFactory = Unlimited
    site: Limit | None = None
    per_ip_override: dict[str, LimitFactory] = field(default_factory=dict)
    banned: frozenset[str] = frozenset()
    retry_after: float = 1.0
    _ips: dict[str, Limit] = field(default_factory=dict, repr=False)

    def arrive(self, ip: str, t: float) -> int:
        """The status this origin answers a request from ``ip`` arriving at ``t``."""
        if ip in self.banned:
            return 403
        limit = self._ips.get(ip)
        if limit is None:
            limit = self._ips[ip] = self.per_ip_override.get(ip, self.per_ip)()
        if not limit.allows(t) or (self.site is not None and not self.site.allows(t)):
            return 429
        limit.take(t)
        if self.site is not None:
            self.site.take(t)
        return 200
