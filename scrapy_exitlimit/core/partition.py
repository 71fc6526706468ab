"""Which exits a process may use while the processes sharing a pool cannot talk.

Rendezvous (highest-random-weight) hashing: every (exit, process) pair gets
a score from a hash of both ids, and each exit belongs to the process with
the highest score. Every process computes the same owners from the same
member list, with no message exchanged, so no two processes use one exit;
each uses its own exits at their full rate and the pool keeps its capacity.
When a process joins or leaves, only the exits it wins or held move.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence


def _score(exit_id: str, member: str) -> int:
    digest = hashlib.blake2b(f"{exit_id}\x00{member}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(exit_id: str, members: Sequence[str]) -> str:
    """The member an exit belongs to (``members`` must not be empty)."""
    return max(members, key=lambda member: (_score(exit_id, member), member))


def share(exit_ids: Iterable[str], members: Iterable[str], me: str) -> set[str]:
    """The exits that belong to ``me`` among ``members`` (``me`` counts as a member)."""
    everyone = sorted({*members, me})
    return {exit_id for exit_id in exit_ids if owner(exit_id, everyone) == me}
