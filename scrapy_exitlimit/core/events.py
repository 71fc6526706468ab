"""What the control laws report: one record per change worth a log line and a stat."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """A change worth a log line and a stat: kind, origin, exit id, detail."""

    kind: str
    origin: str
    exit_id: str | None
    detail: str
