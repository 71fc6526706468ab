"""Exit-IP aliasing: pair state follows the address an exit's requests leave from.

A server limits the address it sees. When the provider names it (a response
header), the pair is keyed by that address, not by the exit id: two sessions
the provider puts on one IP share one pair, as the server sees them; a session
moved to a new IP gets pair state of its own (governed from its first request,
as any new pair), and the old address keeps its cooldowns.
"""

from __future__ import annotations


class ExitAliases:
    """exit id -> the address its requests leave from, when the provider tells."""

    def __init__(self) -> None:
        self.ips: dict[str, str] = {}

    def pair_key(self, exit_id: str) -> str:
        """Where an exit's pair state lives: its exit IP when known, else its id."""
        return self.ips.get(exit_id, exit_id)

    def seen(self, exit_id: str, ip: str) -> str | None:
        """The provider says ``exit_id`` leaves from ``ip``. Returns the address it
        was known by before ("" for none), or None when nothing changed."""
        old = self.ips.get(exit_id)
        if old == ip:
            return None
        self.ips[exit_id] = ip
        return old or ""
