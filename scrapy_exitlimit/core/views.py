"""What the operator and the glue see of the state: read-only records, no control law."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExitLoad:
    """How loaded an exit is now."""

    limit: int  # its in-flight cap now (adaptive; 1 while suspect)
    in_flight: int  # leases held on it, over all origins
    ceiling: int  # the most its cap may grow to (EXITLIMIT_CONCURRENCY, or its own)
