"""Timeout blame: whose fault is a timeout, the exit's or the origin's?

A timeout is ambiguous: a dead exit and a stalled origin look the same from
here. When several exits time out on one origin within ``TIMEOUT_WINDOW``
while this exit still got answers from it within that window, the origin is
the slow one: the exit carries less (its concurrency) but is not evicted for it.
"""

from __future__ import annotations

#: timeouts on several exits of one origin within this many seconds blame the origin
TIMEOUT_WINDOW = 30.0


class TimeoutBlame:
    """One origin's recent timeouts, by exit."""

    __slots__ = ("recent",)

    def __init__(self) -> None:
        #: exit -> its last timeout here (recent ones only)
        self.recent: dict[str, float] = {}

    def origin_stalls(self, exit_id: str, now: float, last_success: float) -> bool:
        """A timeout on ``exit_id`` (whose last success here was at ``last_success``):
        whether the origin is to blame."""
        recent = self.recent
        recent[exit_id] = now
        for other in [e for e, at in recent.items() if now - at > TIMEOUT_WINDOW]:
            del recent[other]
        return now - last_success <= TIMEOUT_WINDOW and len(recent) >= 2
