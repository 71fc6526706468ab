"""What the control laws report: one record per change worth a log line and a stat.

An :class:`Event` is for people (a log line, a stat ``exitlimit/<kind>``, a
telemetry record); what a shared backend must copy elsewhere is returned apart,
as typed state changes (:mod:`.changes`). Event kinds are a closed set: a new
one is added here, with the stat it becomes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class EventKind(str, Enum):
    """What changed. The value is the stat name (``exitlimit/<value>``) and the
    telemetry ``kind``; a kind compares equal to its value."""

    # a pair's cooldown, breaker and ban (the pair law)
    COOLDOWN = "cooldown"  # logged, not counted: ``exitlimit/response_429`` counts them
    BREAKER_OPEN = "breaker_open"
    RECOVERED = "recovered"
    PAIR_BANNED = "pair_banned"
    # what the server stated (RateLimit headers)
    RATE_ANNOUNCED = "rate_announced"
    ANNOUNCEMENT_WRONG = "announcement_wrong"
    QUOTA_EXHAUSTED = "quota_exhausted"
    # learned rates (the learner)
    RATE_UP = "rate_up"
    RATE_DOWN = "rate_down"
    SITE_LIMITED = "site_limited"
    SITE_RATE_UP = "site_rate_up"
    SITE_RATE_DOWN = "site_rate_down"
    # the origin budget (503)
    ORIGIN_SLOWED = "origin_slowed"
    # an exit's health and concurrency
    CONCURRENCY_INCREASE = "concurrency_increase"
    CONCURRENCY_DECREASE = "concurrency_decrease"
    ORIGIN_TIMEOUT = "origin_timeout"
    EVICTED = "evicted"
    EXIT_IP_CHANGED = "exit_ip_changed"

    # as its value wherever it is written out (stats, logs, telemetry, metric labels)
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    __hash__ = str.__hash__  # equal to its value, so hashed as it


@dataclass(frozen=True)
class Event:
    """A change worth a log line and a stat: kind, origin, exit id, detail."""

    kind: EventKind
    origin: str
    exit_id: str | None
    detail: str

    def __post_init__(self) -> None:
        if not isinstance(self.kind, EventKind):  # a kind given by its value
            object.__setattr__(self, "kind", EventKind(self.kind))
