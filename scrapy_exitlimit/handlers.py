"""An HTTP/1.1 download handler that never lets two proxy credentials share a connection.

Scrapy's handler pools keep-alive connections by a key the agent builds. For a plain
``http://`` target behind a proxy that key is ``("http-proxy", proxy host, proxy port,
bind address)``: the ``Proxy-Authorization`` header is sent with every request but is
not part of the key, so two exits that differ only in their credentials (two sessions on
one gateway) ride one connection, and a gateway that binds a session to its connection
sees session B's request on session A's connection. For an ``https://`` target (a CONNECT
tunnel) Scrapy 2.19 does add the header to the key, but the raw header, the secret itself.

:class:`CredentialKeyedDownloadHandler` hands every request's agent a view of the one
shared pool that rewrites the key: the raw header is removed and an HMAC of it (a key
drawn at random per handler, so the digest is not a stable fingerprint of the secret)
is added. Plain-HTTP, CONNECT and direct requests all go through it; a request without
the header keeps Scrapy's key. The add-on installs it for ``http`` and ``https`` unless
you set your own handler for the scheme.

It is also the last place a request passes before the network, so it checks there that
a request :class:`~scrapy_exitlimit.middleware.ExitLimitMiddleware` handled still goes
through the proxy it was given (another middleware may have dropped or changed
``meta['proxy']``, or its credentials): if not, the request fails with
:class:`ProxyLost` (stat ``exitlimit/proxy_lost``) and nothing is sent.
``dont_exitlimit`` requests are not checked: their proxy is your business.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler, _ScrapyAgent
from scrapy.exceptions import ResponseDataLossError
from scrapy.utils._download_handlers import get_dataloss_msg, wrap_twisted_exceptions
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.deprecate import warn_on_deprecated_spider_attribute

from .failclosed import EXPECTED_PROXY_KEY, PROXY_LOST_STAT, ProxyLost, proxy_problem

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IStreamClientEndpoint
    from twisted.web.client import HTTP11ClientProtocol, HTTPConnectionPool

__all__ = ["CredentialKeyedDownloadHandler", "ProxyLost", "pool_key"]

logger = logging.getLogger(__name__)

_TAG = "proxy-auth"


def pool_key(key: tuple[Any, ...], auth: bytes | None, secret: bytes) -> tuple[Any, ...]:
    """``key`` without the raw ``auth`` header and with an HMAC of it (unchanged if None)."""
    if not auth:
        return key
    digest = hmac.new(secret, auth, hashlib.sha256).hexdigest()[:32]
    return (*(part for part in key if part != auth), (_TAG, digest))


class _CredentialKeyedPool:
    """The handler's one pool, seen by one request: every key it asks for carries that
    request's credentials (hashed). Connections still live in, and close with, the pool."""

    def __init__(self, pool: HTTPConnectionPool, auth: bytes | None, secret: bytes) -> None:
        self._pool = pool
        self._auth = auth
        self._secret = secret

    def getConnection(  # noqa: N802 - Twisted's name
        self, key: Hashable, endpoint: IStreamClientEndpoint
    ) -> Deferred[HTTP11ClientProtocol]:
        keyed = pool_key(key if isinstance(key, tuple) else (key,), self._auth, self._secret)
        return self._pool.getConnection(keyed, endpoint)

    def __getattr__(self, name: str) -> Any:  # persistent, maxPersistentPerHost, ...
        return getattr(self._pool, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._pool!r}>"


class CredentialKeyedDownloadHandler(HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 handler, with connections pooled per proxy credential."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._key_secret = os.urandom(32)

    async def download_request(self, request: Request) -> Response:
        self._check_proxy(request)
        # Scrapy 2.19's HTTP11DownloadHandler.download_request, but for the pool argument.
        spider = self._crawler.spider
        if hasattr(spider, "download_maxsize"):  # pragma: no cover
            warn_on_deprecated_spider_attribute("download_maxsize", "DOWNLOAD_MAXSIZE")
        if hasattr(spider, "download_warnsize"):  # pragma: no cover
            warn_on_deprecated_spider_attribute("download_warnsize", "DOWNLOAD_WARNSIZE")
        auth = request.headers.get(b"Proxy-Authorization")
        agent = _ScrapyAgent(
            contextFactory=self._contextFactory,
            bindAddress=self._bind_address,
            pool=_CredentialKeyedPool(self._pool, auth, self._key_secret),  # type: ignore[arg-type]
            maxsize=getattr(spider, "download_maxsize", self._default_maxsize),
            warnsize=getattr(spider, "download_warnsize", self._default_warnsize),
            fail_on_dataloss=self._fail_on_dataloss,
            crawler=self._crawler,
            tls_verbose_logging=self._tls_verbose_logging,
        )
        try:
            with wrap_twisted_exceptions():
                return await maybe_deferred_to_future(agent.download_request(request))
        except ResponseDataLossError:
            if not self._fail_on_dataloss_warned:
                logger.warning(get_dataloss_msg(request.url))
                self._fail_on_dataloss_warned = True
            raise

    def _check_proxy(self, request: Request) -> None:
        """Fail closed: a request of ours goes out through its exit or not at all."""
        expected = request.meta.get(EXPECTED_PROXY_KEY)
        if expected is None:
            return
        problem = proxy_problem(request, expected)
        if problem is None:
            return
        stats = self._crawler.stats
        if stats is not None:
            stats.inc_value(PROXY_LOST_STAT)
        logger.error("scrapy_exitlimit: not sending %s: %s after ExitLimitMiddleware "
                     "(a downloader middleware ordered after it?)", request, problem)
        raise ProxyLost(f"not sent: {problem} after ExitLimitMiddleware")
