"""Sticky sessions: which exit each session is pinned to, and which request may pin it.

A session (``meta['exitlimit_session']``) is pinned by its first admission,
and every later request of it, parked or not, is admitted on that exit only.
Until the session is pinned, exactly one of its requests (the *chooser*)
waits in its origin's queue for any exit; the session's other requests wait
for the chooser's admission, then queue on the exit it got. Without that, a
session whose first requests all park before any is admitted would be
pinned anew by each of them, one exit per admission.

A pin is dropped only when its exit can no longer serve the origin (exit
dead, pair banned or its breaker open): the next request of the session
chooses again, the others follow it. ``exitlimit/session_repinned`` counts
the pins dropped.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from .admission import ExitsUnavailable, HandedBack, Repin
from .core import Lease

logger = logging.getLogger(__name__)

#: sticky sessions remembered at most (the least recently used are forgotten)
MAX_PINS = 100_000
#: what a chooser's failure means for the requests following it: they fail as it did
SHARED_FAILURES = (HandedBack, ExitsUnavailable)

#: a lease for (origin, exit or None: any), waiting as long as it takes
Acquire = Callable[[str, "str | None"], Awaitable[Lease]]


class StickySessions:
    """Pins of sticky sessions to exits, and the admission of a session's requests.

    ``usable(origin, exit_id)``: whether the exit can still serve the origin;
    ``acquire(origin, pinned)``: a lease on exit ``pinned`` (any exit when None);
    ``waitable()``: a fresh future (or Deferred) for one follower of a chooser (one
    each: several coroutines awaiting one Deferred would not all get its result).
    """

    def __init__(self, usable: Callable[[str, str], bool], acquire: Acquire,
                 waitable: Callable[[], Any], stats: Any, max_pins: int = MAX_PINS) -> None:
        self.usable = usable
        self.acquire = acquire
        self.waitable = waitable
        self.stats = stats
        self.max_pins = max_pins
        self.pins: OrderedDict[str, str] = OrderedDict()
        #: session being chosen -> its followers' (origin, waitable), each firing when the
        #: chooser is admitted (None) or gave up (the exception, for its own origin)
        self._choosing: dict[str, list[tuple[str, Any]]] = {}
        #: requests waiting for their session's chooser (they are parked too)
        self.following = 0

    def pinned(self, session: str) -> str | None:
        return self.pins.get(session)

    async def admit(self, origin: str, session: str) -> Lease:
        """A lease for a request of ``session``: on its pinned exit, or the one that pins it.

        Raises what ``acquire`` raises (HandedBack, ExitsUnavailable), also for the
        requests that were waiting for a chooser that failed so."""
        while True:
            pin = self._pin(origin, session)
            if pin is not None:
                try:
                    return await self.acquire(origin, pin)
                except Repin:  # its exit went bad while it waited
                    self._unpin(session, pin, origin)
                    continue
            followers = self._choosing.get(session)
            if followers is None:
                return await self._choose(origin, session)
            chosen = self.waitable()
            followers.append((origin, chosen))
            self.following += 1
            try:
                failed = await chosen
            finally:
                self.following -= 1
            if failed is not None:
                raise type(failed)(*failed.args)

    async def _choose(self, origin: str, session: str) -> Lease:
        """Wait for any exit and pin the session to it; then wake its other requests."""
        followers: list[tuple[str, Any]] = []
        self._choosing[session] = followers
        outcome: BaseException | None = None
        try:
            lease = await self.acquire(origin, None)
        except BaseException as exc:
            outcome = exc
            raise
        else:
            self.pins[session] = lease.exit_id
            self.pins.move_to_end(session)
            while len(self.pins) > self.max_pins:
                self.pins.popitem(last=False)
            return lease
        finally:
            del self._choosing[session]
            # a cancelled chooser (or any other trouble of its own), or one for another
            # origin: the next one chooses
            shared = outcome if isinstance(outcome, SHARED_FAILURES) else None
            for their_origin, chosen in followers:
                _settle(chosen, shared if their_origin == origin else None)

    def _pin(self, origin: str, session: str) -> str | None:
        """The exit the session is pinned to, while it can serve the origin."""
        pinned = self.pins.get(session)
        if pinned is None:
            return None
        if self.usable(origin, pinned):
            self.pins.move_to_end(session)
            return pinned
        self._unpin(session, pinned, origin)
        return None

    def _unpin(self, session: str, exit_id: str, origin: str) -> None:
        if self.pins.get(session) != exit_id:
            return  # already dropped (and maybe pinned anew) by another of its requests
        del self.pins[session]
        self.stats.inc_value("exitlimit/session_repinned")
        logger.debug("exitlimit: session pinned to %s re-pinned (exit banned or dead for %s)",
                     exit_id, origin)


def _settle(waitable: Any, value: Any) -> None:
    """Fire a follower's waitable, unless its request stopped waiting (cancelled)."""
    if hasattr(waitable, "set_result"):  # an asyncio future
        if not waitable.done():
            waitable.set_result(value)
    elif not waitable.called:  # a Deferred
        waitable.callback(value)
