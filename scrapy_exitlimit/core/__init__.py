"""Pure core: admission arithmetic with an injected clock. No Scrapy, Twisted or Redis here."""

from .bucket import TokenBucket
from .events import Event, EventKind
from .exits import (
    Exit,
    exit_id,
    expand_templates,
    make_exit,
    mask_url,
    parse_exit_list,
    parse_sessions,
)
from .health import ConcurrencyLimit, ExitHealth
from .learning import RateEstimate
from .limiter import UNTIL_RELEASE, Candidate, Lease, Limiter, PairState, Tuning
from .limits import Limits, OriginLimits, PairLimits
from .retry_after import bounded_cooldown, parse_http_date, parse_retry_after

__all__ = [
    "UNTIL_RELEASE",
    "Candidate",
    "ConcurrencyLimit",
    "Event",
    "EventKind",
    "Exit",
    "ExitHealth",
    "Lease",
    "Limiter",
    "Limits",
    "OriginLimits",
    "PairLimits",
    "PairState",
    "RateEstimate",
    "TokenBucket",
    "Tuning",
    "bounded_cooldown",
    "exit_id",
    "expand_templates",
    "make_exit",
    "mask_url",
    "parse_exit_list",
    "parse_http_date",
    "parse_retry_after",
    "parse_sessions",
]
