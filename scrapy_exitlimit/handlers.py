"""An HTTP/1.1 download handler that never lets two proxy credentials share a connection.

Scrapy's handler pools keep-alive connections by a key the agent builds. For a plain
``http://`` target behind a proxy that key is ``("http-proxy", proxy host, proxy port,
bind address)``: the ``Proxy-Authorization`` header is sent with every request but is
not part of the key, so two exits that differ only in their credentials (two sessions on
one gateway) ride one connection, and a gateway that binds a session to its connection
sees session B's request on session A's connection. For an ``https://`` target (a CONNECT
tunnel) Scrapy does add the header to the key, but the raw header, the secret itself.

:class:`CredentialKeyedDownloadHandler` is Scrapy's handler with its one pool wrapped:
every key a request's agent asks the pool for is rewritten, the raw header removed and an
HMAC of it (a key drawn at random per handler, so the digest is not a stable fingerprint
of the secret) added. The wrapper learns the request's header from a context variable
the handler sets around Scrapy's own ``download_request``, so everything else (agents,
timeouts, TLS, errors, warnings) stays Scrapy's, whichever version. Plain-HTTP, CONNECT
and direct requests all go through it; a request without the header keeps Scrapy's key.
The add-on installs it for ``http`` and ``https`` unless you set your own handler for the
scheme.

It is also the last place a request passes before the network, so it checks there that
a request :class:`~scrapy_exitlimit.middleware.ExitLimitMiddleware` handled still goes
through the proxy it was given (another middleware may have dropped or changed
``meta['proxy']``, or its credentials): if not, the request fails with
:class:`ProxyLost` (stat ``exitlimit/proxy_lost``) and nothing is sent.
``dont_exitlimit`` requests are not checked: their proxy is your business.

And it hands each answer (or failure) straight to the middleware, where Scrapy would
send ``response_downloaded`` and ``request_left_downloader`` to it: the same point of a
download, without a signal dispatch (two receivers cost about a fifth of what the
middleware adds to a request). The middleware asks for this only when this handler
serves both ``http`` and ``https`` (:func:`delivers_feedback`), else it listens to the
signals.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Hashable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from scrapy.utils.misc import load_object

from ._compat import HANDLER_IS_ASYNC, handler_pool, set_handler_pool
from .failclosed import EXPECTED_PROXY_KEY, PROXY_LOST_STAT, ProxyLost, proxy_problem

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.http import Response
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IStreamClientEndpoint
    from twisted.web.client import HTTP11ClientProtocol, HTTPConnectionPool

__all__ = ["CredentialKeyedDownloadHandler", "ProxyLost", "delivers_feedback", "pool_key"]

logger = logging.getLogger(__name__)

_TAG = "proxy-auth"
#: the Proxy-Authorization header of the request being handed to Scrapy's handler: its
#: agent asks the pool for a connection before download_request first yields
_AUTH: ContextVar[bytes | None] = ContextVar("exitlimit_proxy_auth", default=None)


def pool_key(key: tuple[Any, ...], auth: bytes | None, secret: bytes) -> tuple[Any, ...]:
    """``key`` without the raw ``auth`` header and with an HMAC of it (unchanged if None)."""
    if not auth:
        return key
    digest = hmac.new(secret, auth, hashlib.sha256).hexdigest()[:32]
    return (*(part for part in key if part != auth), (_TAG, digest))


class _CredentialKeyedPool:
    """The handler's one pool, keyed per credential: every key asked for carries the
    credentials (hashed) of the request being sent. Connections still live in, go back
    to and close with the pool."""

    def __init__(self, pool: HTTPConnectionPool, secret: bytes) -> None:
        self._pool = pool
        self._secret = secret

    def getConnection(  # noqa: N802 - Twisted's name
        self, key: Hashable, endpoint: IStreamClientEndpoint
    ) -> Deferred[HTTP11ClientProtocol]:
        keyed = pool_key(key if isinstance(key, tuple) else (key,), _AUTH.get(), self._secret)
        return self._pool.getConnection(keyed, endpoint)

    def __getattr__(self, name: str) -> Any:  # persistent, closeCachedConnections, ...
        return getattr(self._pool, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._pool!r}>"


def delivers_feedback(settings: BaseSettings) -> bool:
    """Whether every request the middleware handles (``http`` and ``https``) goes through
    :class:`CredentialKeyedDownloadHandler` (or a subclass), which then hands the
    middleware its answers itself."""
    handlers = settings.getwithbase("DOWNLOAD_HANDLERS")
    for scheme in ("http", "https"):
        path = handlers.get(scheme)
        if path is None:
            return False
        try:
            cls = load_object(path) if isinstance(path, str) else path
        except (ImportError, NameError, ValueError, AttributeError):
            return False  # Scrapy reports it when the scheme is first used
        if not (isinstance(cls, type) and issubclass(cls, CredentialKeyedDownloadHandler)):
            return False
    return True


class CredentialKeyedDownloadHandler(HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 handler, with connections pooled per proxy credential."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)  # (crawler) since Scrapy 2.14, (settings, crawler) before
        self._crawler = args[-1]
        self._stats: StatsCollector | None = args[-1].stats
        set_handler_pool(self, _CredentialKeyedPool(handler_pool(self), os.urandom(32)))

    def _listener(self) -> Any:
        """The crawl's ExitLimitMiddleware when it takes its answers from here, else None."""
        listener = getattr(self._crawler, "exitlimit", None)
        return listener if getattr(listener, "feedback_from_handler", False) else None

    if HANDLER_IS_ASYNC:  # Scrapy >= 2.14

        async def download_request(self, request: Request) -> Response:
            listener = self._listener()
            try:
                self._check_proxy(request)
                token = _AUTH.set(request.headers.get(b"Proxy-Authorization"))
                try:
                    response = await super().download_request(request)
                finally:
                    _AUTH.reset(token)
            except BaseException:
                if listener is not None:
                    _tell(listener.left_downloader, request)
                raise
            if listener is not None:
                _tell_answer(listener, response, request)
            return response

    else:  # Scrapy 2.13

        def download_request(  # type: ignore[override]
            self, request: Request, spider: Spider
        ) -> Deferred[Response]:
            listener = self._listener()
            try:
                self._check_proxy(request)
                token = _AUTH.set(request.headers.get(b"Proxy-Authorization"))
                try:
                    dfd = super().download_request(request, spider)  # type: ignore[call-arg]
                finally:
                    _AUTH.reset(token)
            except BaseException:
                if listener is not None:
                    _tell(listener.left_downloader, request)
                raise
            if listener is not None:
                dfd.addCallbacks(_told_answer, _told_failure,
                                 callbackArgs=(listener, request), errbackArgs=(listener, request))
            return dfd

    def _check_proxy(self, request: Request) -> None:
        """Fail closed: a request of ours goes out through its exit or not at all."""
        expected = request.meta.get(EXPECTED_PROXY_KEY)
        if expected is None:
            return
        problem = proxy_problem(request, expected)
        if problem is None:
            return
        if self._stats is not None:
            self._stats.inc_value(PROXY_LOST_STAT)
        logger.error("scrapy_exitlimit: not sending %s: %s after ExitLimitMiddleware "
                     "(a downloader middleware ordered after it?)", request, problem)
        raise ProxyLost(f"not sent: {problem} after ExitLimitMiddleware")


def _tell(receiver: Any, *args: Any) -> None:
    """Call a feedback receiver as Scrapy calls a signal's: an error is logged, and the
    download goes on."""
    try:
        receiver(*args)
    except Exception:
        logger.error("scrapy_exitlimit: error in the feedback %r", receiver, exc_info=True)


def _tell_answer(listener: Any, response: Response, request: Request) -> None:
    """An answer, then the end of its download (as Scrapy's two signals: the lease goes
    back even if reading the answer failed)."""
    _tell(listener.response_downloaded, response, request)
    _tell(listener.left_downloader, request)


def _told_answer(response: Response, listener: Any, request: Request) -> Response:
    _tell_answer(listener, response, request)
    return response


def _told_failure(failure: Any, listener: Any, request: Request) -> Any:
    _tell(listener.left_downloader, request)
    return failure
