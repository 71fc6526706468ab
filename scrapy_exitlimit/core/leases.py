"""The lease table: one entry per admitted request, until it is released."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from .scopes import Scope


@dataclass(frozen=True)
class Lease:
    """One admitted request: holds a place on its exit until released."""

    id: int
    origin: str
    exit_id: str
    admitted_at: float
    rate: float  # the pair's pacing rate at admission
    gap: float  # time since the pair's previous admission
    was_full: bool  # this lease filled the exit's limit
    pair: str = ""  # the pair key (exit IP or exit id) that counts it in flight
    site_gap: float = math.inf  # time since the origin's previous admission, any exit
    #: the named scopes whose tokens it took, and each one's gap since its previous one
    scopes: tuple[Scope, ...] = ()
    scope_gaps: tuple[float, ...] = ()
    #: a shared backend: when another process last admitted a request on the pair before
    #: this one, as far as this process knows (-inf: none it knows of)
    foreign_before: float = -math.inf


class LeaseTable:
    """Leases in flight by id. Ids are this table's (a shared backend names its leases
    in shared state with them, so it may set some aside up front)."""

    def __init__(self) -> None:
        self._leases: dict[int, Lease] = {}
        self._next_id = 1

    def reserve_ids(self, count: int) -> int:
        """Set aside ``count`` consecutive ids; returns the first."""
        first = self._next_id
        self._next_id += count
        return first

    def add(self, lease: Lease) -> None:
        self._leases[lease.id] = lease

    def pop(self, lease_id: int) -> Lease | None:
        return self._leases.pop(lease_id, None)

    def get(self, lease_id: int) -> Lease | None:
        return self._leases.get(lease_id)

    def values(self) -> Iterator[Lease]:
        return iter(self._leases.values())

    def origins(self) -> set[str]:
        """The origins with a lease in flight."""
        return {lease.origin for lease in self._leases.values()}

    def scopes(self) -> set[str]:
        """The scopes with a lease in flight."""
        return {scope.id for lease in self._leases.values() for scope in lease.scopes}

    def older_than(self, seconds: float, now: float) -> list[Lease]:
        return [lease for lease in self._leases.values() if now - lease.admitted_at > seconds]

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._leases

    def __len__(self) -> int:
        return len(self._leases)

    def __repr__(self) -> str:
        return f"<LeaseTable in_flight={len(self._leases)} next_id={self._next_id}>"
