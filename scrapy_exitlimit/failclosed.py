"""Fail closed: what the middleware promises the download handler about a request.

The middleware records, on every request it admits, where that request must go: the
proxy address of its exit and whether the exit has credentials (no secret). The
download handler the add-on installs checks it last thing before the network
(:func:`proxy_problem`), so a middleware ordered after ours that drops or changes
``meta['proxy']`` (or its credentials) fails the request instead of sending it from
this machine's own address, or through someone else's proxy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest

from .core.exits import proxy_address

if TYPE_CHECKING:
    from scrapy import Request

__all__ = ["EXPECTED_PROXY_KEY", "PROXY_LOST_STAT", "ProxyLost", "proxy_problem"]

#: meta key the middleware sets on a request it admits: ``(proxy address, has credentials)``
#: of the exit it was given
EXPECTED_PROXY_KEY = "_exitlimit_expected_proxy"
PROXY_LOST_STAT = "exitlimit/proxy_lost"


class ProxyLost(IgnoreRequest):
    """A request reached the download handler without the proxy its exit gave it.

    An IgnoreRequest: RetryMiddleware leaves it alone, the spider's errback gets it."""


def proxy_problem(request: Request, expected: tuple[str, bool]) -> str | None:
    """Why ``request`` would not leave through the exit it was given, or None."""
    address, with_credentials = expected
    proxy = request.meta.get("proxy")
    if not proxy:
        return f"meta['proxy'] is gone (it was {address})"
    actual = proxy_address(str(proxy))
    if actual != address:
        return f"meta['proxy'] changed from {address} to {actual}"
    if with_credentials and not request.headers.get(b"Proxy-Authorization") \
            and "@" not in str(proxy):
        return f"the credentials of {address} are gone (no Proxy-Authorization header)"
    return None
