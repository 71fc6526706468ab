"""What feedback changed, for a shared backend to copy: typed, apart from the log events.

Events (``events.py``) are for people; these are for replication. A backend
sharing state applies each change to the shared copy of the key it names (a
pair, an exit, an origin) and publishes an origin's learning when it changed.
The times are on the limiter's clock (a shared backend keeps that clock on the
shared one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .events import Event


class Hold(Enum):
    """Why a pair holds its requests."""

    COOLDOWN = "cooldown"  # a 429's Retry-After (or an open breaker), an exhausted quota
    BAN = "ban"  # a 403 / block page


@dataclass(frozen=True)
class PairHeld:
    """A pair takes no request before ``until``; then one, not a burst."""

    origin: str
    exit_id: str
    pair: str  # the pair key: the exit IP when known, else the exit id
    hold: Hold
    until: float
    tolerance: float  # its bucket's burst tolerance (the next token waits for the end)


@dataclass(frozen=True)
class OriginHeld:
    """The origin takes no request before ``until`` (a 503's stated Retry-After)."""

    origin: str
    until: float
    tolerance: float  # the origin budget's burst tolerance


@dataclass(frozen=True)
class ExitEvicted:
    """The exit serves no origin before ``until`` (proxy faults)."""

    exit_id: str
    until: float


@dataclass(frozen=True)
class LearningChanged:
    """What the origin learned changed (a rate, the site rate, the 503 budget, a stated
    limit): worth publishing now rather than at the next periodic look."""

    origin: str


Change = PairHeld | OriginHeld | ExitEvicted | LearningChanged


@dataclass
class Feedback:
    """What one piece of feedback did: events to log and count, changes to replicate."""

    events: list[Event] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    def learned(self) -> bool:
        return any(isinstance(change, LearningChanged) for change in self.changes)
