"""Two sessions on one gateway never share a keep-alive connection (plain HTTP and CONNECT)."""

from __future__ import annotations

import base64
import datetime
import logging
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.interfaces import IOpenSSLContextFactory, IProtocolFactory
from twisted.web.resource import Resource
from twisted.web.server import Site
from zope.interface import implementer, implementer_only

from scrapy_exitlimit.handlers import pool_key
from scrapy_exitlimit.lab import Lab, OriginConfig

from .crawling import crawl

STOCK = "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler"
SESSIONS = ["a", "b"]
PAGES = 8
#: one request at a time: every connection goes back to the pool before the next request,
#: so a pool keyed without the credentials hands one connection to both sessions
SEQUENTIAL = {"CONCURRENT_REQUESTS": 1, "EXITLIMIT_RATE": 100, "EXITLIMIT_SESSIONS": SESSIONS}


def basic(session: str) -> str:
    return "Basic " + base64.b64encode(f"sess-{session}:pw".encode()).decode()


def sessions_by_connection(proxy: Any) -> dict[int, set[str]]:
    """The proxy's record, credentials turned into session labels (failures print no
    credentials, not even the lab's)."""
    label = {basic(s): s for s in SESSIONS}
    return {conn: {label.get(auth or "", "?") for auth in auths}
            for conn, auths in proxy.auth_by_connection().items()}


def gateway(lab: Lab) -> str:
    return f"http://sess-{{session}}:pw@127.0.0.1:{lab.proxies[0].port}"


def test_pool_key_carries_an_hmac_of_the_header_never_the_header():
    secret = b"k" * 32
    plain = (b"http-proxy", b"127.0.0.1", 8000, None)
    tunnel = (b"https", b"site", 443, None, "127.0.0.1", 8000, b"Basic YTpi")
    assert pool_key(plain, None, secret) == plain
    a, b = pool_key(plain, b"Basic YTpi", secret), pool_key(plain, b"Basic YjpiCg==", secret)
    assert a != b and a == pool_key(plain, b"Basic YTpi", secret)
    assert a[:4] == plain and a[4][0] == "proxy-auth"
    keyed = pool_key(tunnel, b"Basic YTpi", secret)
    assert b"Basic YTpi" not in keyed and keyed[-1] == a[-1]
    assert pool_key(plain, b"Basic YTpi", b"other" * 8) != a  # per-handler key


# -- plain http:// targets: the proxy sees every request's credentials -------------------


async def crawl_plain(handler: str | None) -> Lab:
    lab = Lab(exits=1, origin=OriginConfig(rate=None))  # the proxy accepts any credentials
    await lab.start()
    settings: dict[str, Any] = {"EXITLIMIT_EXITS": [gateway(lab)], **SEQUENTIAL}
    if handler is not None:
        settings["DOWNLOAD_HANDLERS"] = {"http": handler}
    try:
        crawler = await crawl(settings, lab.origin_url, PAGES)
    finally:
        await lab.stop()
    assert len(crawler.spider.ok) == PAGES
    return lab


@pytest_twisted.ensureDeferred
async def test_stock_handler_lets_two_sessions_share_a_connection():
    """The bug this package's handler fixes, on Scrapy's own handler."""
    lab = await crawl_plain(STOCK)
    by_conn = sessions_by_connection(lab.proxies[0])
    assert any(len(sessions) > 1 for sessions in by_conn.values()), by_conn


@pytest_twisted.ensureDeferred
async def test_each_connection_carries_one_session(caplog, recwarn):
    """On every supported Scrapy the add-on's handler loads, silently, and is the one used."""
    lab = await crawl_plain(None)  # the add-on's handler
    warned = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and "handler" in r.getMessage().lower()]
    assert not warned, warned
    deprecated = [str(w.message) for w in recwarn if "download_request" in str(w.message)
                  or "DownloadHandler" in str(w.message)]
    assert not deprecated, deprecated
    proxy = lab.proxies[0]
    by_conn = sessions_by_connection(proxy)
    assert all(len(sessions) == 1 for sessions in by_conn.values()), by_conn
    assert set().union(*by_conn.values()) == set(SESSIONS)
    assert len(by_conn) < proxy.requests  # connections were reused, within a session


# -- CONNECT tunnels: the proxy sees the credentials once per connection -----------------


class _Seen(Resource):
    """Records (client port, exit id) per request: the client port names the tunnel."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[int, str]] = []

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - Twisted's name
        exit_id = (request.getHeader(b"x-exit") or b"").decode()
        self.requests.append((request.getClientAddress().port, exit_id))
        return b"<html><body>ok</body></html>"


# no ALPN offered: Twisted < 26 sets its callbacks on the context after a connection was
# made from it, which pyOpenSSL >= 25 refuses (the client side, Scrapy's, offers none)
@implementer_only(IProtocolFactory)
class _QuietSite(Site):
    def log(self, request: Any) -> None:
        pass


class TagExit:
    """Tells the TLS origin which exit a request was admitted through."""

    def process_request(self, request: Any, spider: Any = None) -> None:  # spider: Scrapy 2.13
        if exit_id := request.meta.get("exitlimit_exit"):
            request.headers[b"X-Exit"] = exit_id


@implementer(IOpenSSLContextFactory)
class _TLSContext:
    """A throwaway self-signed certificate for 127.0.0.1 (Scrapy does not verify it)."""

    def __init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        from OpenSSL import SSL

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .sign(key, hashes.SHA256()))
        self._context = SSL.Context(SSL.TLS_SERVER_METHOD)
        self._context.use_certificate(cert)
        self._context.use_privatekey(key)

    def getContext(self) -> Any:  # noqa: N802 - Twisted's name
        return self._context


@pytest.mark.parametrize("handler", [None, STOCK], ids=["addon-handler", "stock-handler"])
@pytest_twisted.ensureDeferred
async def test_each_tunnel_carries_one_session(handler):
    """Inside a tunnel the proxy sees nothing: join the origin's view (which tunnel, by its
    client port, carried which exit's request) with the proxy's (which credentials opened
    that tunnel). Scrapy 2.19 already keys tunnels by the raw header; ours by its HMAC."""
    from twisted.internet import reactor

    seen = _Seen()
    port = reactor.listenSSL(0, _QuietSite(seen), _TLSContext(), interface="127.0.0.1")
    lab = Lab(exits=1, origin=OriginConfig(rate=None))
    await lab.start()
    settings: dict[str, Any] = {
        "EXITLIMIT_EXITS": [gateway(lab)], **SEQUENTIAL,
        "DOWNLOADER_MIDDLEWARES": {f"{__name__}.TagExit": 600},
    }
    if handler is not None:
        settings["DOWNLOAD_HANDLERS"] = {"https": handler}
    try:
        crawler = await crawl(settings, f"https://127.0.0.1:{port.getHost().port}", PAGES)
    finally:
        await lab.stop()
        await port.stopListening()
    assert len(crawler.spider.ok) == PAGES
    proxy = lab.proxies[0]
    opened_by = sessions_by_connection(proxy)  # one CONNECT per connection
    tunnels: dict[int, set[str]] = {}
    for client_port, exit_id in seen.requests:
        conn = proxy.tunnel_ports[client_port]
        tunnels.setdefault(conn, set()).add(exit_id.rpartition("~s=")[2])
    # every request rode a tunnel its own session's credentials opened
    assert tunnels == {conn: opened_by[conn] for conn in tunnels}, (tunnels, opened_by)
    assert all(len(sessions) == 1 for sessions in tunnels.values())
    assert set().union(*tunnels.values()) == set(SESSIONS)
    assert len(tunnels) < len(seen.requests) == PAGES  # tunnels were reused


# -- answers reach the middleware from the handler, or from Scrapy's signals -------------


def test_the_handler_delivers_answers_only_when_it_serves_http_and_https():
    from scrapy.settings import Settings

    from scrapy_exitlimit.addon import DOWNLOAD_HANDLER
    from scrapy_exitlimit.handlers import delivers_feedback

    ours = {"http": DOWNLOAD_HANDLER, "https": DOWNLOAD_HANDLER}
    assert delivers_feedback(Settings({"DOWNLOAD_HANDLERS": ours}))
    assert not delivers_feedback(Settings({"DOWNLOAD_HANDLERS": {**ours, "https": STOCK}}))
    assert not delivers_feedback(Settings({"DOWNLOAD_HANDLERS": {**ours, "http": None}}))
    assert not delivers_feedback(Settings({"DOWNLOAD_HANDLERS": {"http": DOWNLOAD_HANDLER}}))
    assert not delivers_feedback(Settings({"DOWNLOAD_HANDLERS": {**ours, "https": "no.such"}}))


@pytest.mark.parametrize("handler", [None, STOCK])
@pytest_twisted.ensureDeferred
async def test_every_answer_is_read_once_through_the_handler_or_the_signals(handler):
    """With the add-on's handler on http and https the middleware takes its answers from
    it and listens to no signal; with Scrapy's own handler on http, from the signals.
    Either way each 429 the origin sent is counted once and every lease goes back."""
    from scrapy_exitlimit.lab import Lab, OriginConfig

    from .crawling import crawl_lab

    lab = Lab(exits=2, origin=OriginConfig(rate=4, retry_after=0))
    settings: dict[str, Any] = {"EXITLIMIT_RATE": 12, "EXITLIMIT_COOLDOWN_MIN": 0.05,
                                "EXITLIMIT_BREAKER_THRESHOLD": 100}
    if handler is not None:
        settings["DOWNLOAD_HANDLERS"] = {"http": handler}
    crawler = await crawl_lab(lab, settings, 12)
    middleware = crawler.exitlimit
    assert middleware.feedback_from_handler is (handler is None)
    stats = crawler.stats.get_stats()
    assert len(crawler.spider.ok) == 12
    assert lab.origin.total(429) > 0
    assert stats.get("exitlimit/response_429") == lab.origin.total(429)
    assert len(middleware.backend.limiter.leases) == 0


def test_a_failing_feedback_is_logged_and_the_lease_still_goes_back(caplog):
    """As Scrapy does with a signal receiver that raises: logged, and the download (and
    the end-of-download call that releases the lease) goes on."""
    from scrapy_exitlimit.handlers import _tell_answer

    calls: list[str] = []

    class Listener:
        def response_downloaded(self, response, request):
            calls.append("answer")
            raise RuntimeError("boom")

        def left_downloader(self, request):
            calls.append("left")

    with caplog.at_level(logging.ERROR, logger="scrapy_exitlimit.handlers"):
        _tell_answer(Listener(), object(), object())
    assert calls == ["answer", "left"]
    assert any("boom" in (r.exc_text or "") or r.exc_info for r in caplog.records)
