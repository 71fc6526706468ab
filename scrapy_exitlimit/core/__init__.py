"""Pure core: admission arithmetic with an injected clock. No Scrapy, Twisted or Redis here."""

from .bucket import TokenBucket
from .exits import Exit, exit_id, make_exit, mask_url, parse_exit_list
from .limiter import UNTIL_RELEASE, Lease, Limiter, PairState
from .limits import OriginLimits, PairLimits, StaticLimits
from .retry_after import bounded_cooldown, parse_http_date, parse_retry_after

__all__ = [
    "UNTIL_RELEASE",
    "Exit",
    "Lease",
    "Limiter",
    "OriginLimits",
    "PairLimits",
    "PairState",
    "StaticLimits",
    "TokenBucket",
    "bounded_cooldown",
    "exit_id",
    "make_exit",
    "mask_url",
    "parse_exit_list",
    "parse_http_date",
    "parse_retry_after",
]
