"""The lab forward proxy: one per exit, its outgoing connections bound to its own loopback IP.

Hand-written rather than built on ``twisted.web.proxy``: that module installs the default
reactor on import, closes the client connection after every response, and has no CONNECT.
Client side: HTTP/1.1 keep-alive with pipelining handled one request at a time. Upstream:
a persistent ``Agent`` pool whose connections are bound to ``bind_ip``, so the origin sees
one client IP per proxy. A body of known length is passed on as it arrives (the head
first), as tinyproxy does; other bodies are read whole, then sent.

``capacity=N`` forwards at most N requests at once; the rest wait FIFO, so latency grows
with concurrency past N, as on a proxy (or the link behind it) that is saturated.

Faults, each off by default: ``fail_status`` answers every request with that status,
``reset_every`` / ``reset_probability`` cut a forwarded response off mid-body with a TCP
reset, ``blackhole`` reads requests and never answers.

Network jitter, off by default: ``delay`` + U(0, ``jitter``) seconds (seeded) between
receiving a request and forwarding it upstream, as the path from a real exit to the origin
adds; the origin's limiter sees the request that much later.
"""

from __future__ import annotations

import base64
import logging
import random
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import (
    Deferred,
    DeferredSemaphore,
    gatherResults,
    maybeDeferred,
    succeed,
)
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import deferLater
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from ._net import ConnectionTracker, ListeningServer, is_loopback, reason_phrase

logger = logging.getLogger(__name__)

_MAX_HEAD = 64 * 1024
_CONNECT_TIMEOUT = 10
#: seconds between the part of a cut-off response and the reset
RESET_AFTER = 0.02
# Never forwarded either way: hop-by-hop headers (RFC 9110 7.6.1) and the framing we redo.
_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
    }
)

RawHeaders = list[tuple[bytes, bytes]]


def _parse_head(head: bytes) -> tuple[bytes, bytes, bytes, RawHeaders]:
    request_line, *lines = head.split(b"\r\n")
    method, target, version = request_line.split(b" ")
    if not version.startswith(b"HTTP/1.") or not method or not target:
        raise ValueError(request_line)
    headers = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise ValueError(line)
        headers.append((name, value.strip()))
    return method, target, version, headers


def _get(headers: RawHeaders, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _connection_tokens(headers: RawHeaders) -> set[bytes]:
    return {
        token.strip().lower()
        for key, value in headers
        if key.lower() in (b"connection", b"proxy-connection")
        for token in value.split(b",")
    }


@implementer(IBodyProducer)
class _Body:
    """The request body, already in memory."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> Deferred[None]:
        consumer.write(self.data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _Collect(Protocol):
    """The whole response body. Not ``readBody``: on Twisted 26 it warns for pooled
    connections, whose transport proxy has no ``abortConnection``."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done: Deferred[bytes] = Deferred(lambda _: self.transport.stopProducing())

    def dataReceived(self, data: bytes) -> None:
        self.chunks.append(data)

    def connectionLost(self, reason: Any) -> None:
        if self.done.called:  # cancelled
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self.chunks))
        else:
            self.done.errback(reason)


class _Stream(Protocol):
    """A body of known length, written to the client as it arrives."""

    def __init__(self, client: _ClientConnection) -> None:
        self.client = client
        self.done: Deferred[None] = Deferred(lambda _: self.transport.stopProducing())

    def dataReceived(self, data: bytes) -> None:
        if not self.client._lost:
            self.client.transport.write(data)

    def connectionLost(self, reason: Any) -> None:
        if self.done.called:  # cancelled
            return
        if reason.check(ResponseDone):
            self.done.callback(None)
        else:
            self.done.errback(reason)


@implementer(IAgentEndpointFactory)
class _BoundEndpoints:
    def __init__(self, reactor: Any, bind_ip: str) -> None:
        self.reactor = reactor
        self.bind_ip = bind_ip

    def endpointForURI(self, uri: Any) -> TCP4ClientEndpoint:
        return TCP4ClientEndpoint(
            self.reactor,
            uri.host.decode("ascii"),
            uri.port,
            timeout=_CONNECT_TIMEOUT,
            bindAddress=(self.bind_ip, 0),
        )


class _QuietPool(HTTPConnectionPool):
    # The stock factory logs "Starting factory" for every new upstream connection.
    _factory = type("_QuietFactory", (HTTPConnectionPool._factory,), {"noisy": False})
    maxPersistentPerHost = 32


class _Tunnel(Protocol):
    """Upstream half of a CONNECT tunnel."""

    def __init__(self, client: _ClientConnection) -> None:
        self.client = client

    def connectionMade(self) -> None:
        proxy = self.client.proxy
        proxy._conns.opened(self)
        proxy.tunnel_ports[self.transport.getHost().port] = self.client.conn_id

    def dataReceived(self, data: bytes) -> None:
        self.client.transport.write(data)

    def connectionLost(self, reason: Any) -> None:
        self.client.transport.loseConnection()
        self.client.proxy._conns.closed(self)


class _ClientConnection(Protocol):
    """One accepted client connection: parse requests, answer them in order."""

    def __init__(self, proxy: ForwardProxy, conn_id: int) -> None:
        self.proxy = proxy
        self.conn_id = conn_id
        self._buf = b""
        self._busy = False  # a request is being answered; later ones wait in _buf
        self._close = False  # close after the current answer
        self._lost = False
        self._pending: Deferred[Any] | None = None
        self._tunnel: _Tunnel | None = None
        self._abort: Any = None  # the pending reset of a response cut off on purpose

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        self.proxy._conns.opened(self)

    def connectionLost(self, reason: Any) -> None:
        self._lost = True
        if self._abort is not None and self._abort.active():
            self._abort.cancel()
        if self._pending is not None:
            self._pending.cancel()
        if self._tunnel is not None:
            self._tunnel.transport.loseConnection()
        self.proxy._conns.closed(self)

    def dataReceived(self, data: bytes) -> None:
        if self._tunnel is not None:
            self._tunnel.transport.write(data)
            return
        self._buf += data
        if not self._busy:
            self._next()

    def _next(self) -> None:
        buf = self._buf.lstrip(b"\r\n")  # tolerate stray CRLFs between requests
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > _MAX_HEAD:
                self._error(431, b"request head too large", close=True)
            return
        try:
            method, target, version, headers = _parse_head(buf[:end])
            length = int(_get(headers, b"content-length") or 0)
            if length < 0:
                raise ValueError(length)
        except ValueError:
            self._error(400, b"malformed request", close=True)
            return
        if _get(headers, b"transfer-encoding") is not None:
            self._error(411, b"chunked request bodies are not supported", close=True)
            return
        start = end + 4
        if len(buf) < start + length:
            return
        body, self._buf = buf[start : start + length], buf[start + length :]
        self._busy = True
        self._close = version != b"HTTP/1.1" or b"close" in _connection_tokens(headers)
        self._handle(method, target, headers, body)

    def _handle(self, method: bytes, target: bytes, headers: RawHeaders, body: bytes) -> None:
        proxy = self.proxy
        proxy.requests += 1
        if proxy.blackhole:
            proxy.blackholed += 1
            return  # stays busy: neither this request nor any later one on it is answered
        auth = _get(headers, b"proxy-authorization")
        proxy.seen_auth.append((self.conn_id, None if auth is None else auth.decode("latin-1")))
        if not proxy._authorized(auth):
            self._error(
                407,
                b"proxy authentication required",
                headers=[(b"Proxy-Authenticate", b'Basic realm="lab"')],
            )
            return
        if proxy.fail_status is not None:
            extra = [(b"Proxy-Authenticate", b'Basic realm="lab"')] if proxy.fail_status == 407 \
                else []
            self._error(proxy.fail_status, b"lab proxy configured to fail", headers=extra)
            return
        if method == b"CONNECT":
            self._connect(target)
            return
        url = urlsplit(target.decode("latin-1"))
        if url.scheme != "http" or not url.hostname:
            self._error(400, b"absolute-form http:// request target required")
            return
        if not is_loopback(url.hostname):
            self._error(403, b"the lab proxy only reaches 127.0.0.0/8")
            return
        drop = _HOP | _connection_tokens(headers)
        forward = Headers()
        for name, value in headers:
            if name.lower() not in drop:
                forward.addRawHeader(name, value)
        reset = proxy._should_reset()
        producer = _Body(body) if body else None
        wait = proxy._forward_delay()

        def send() -> Deferred[None]:
            if wait > 0:  # cancelled with _pending if the client goes away meanwhile
                d = deferLater(proxy._reactor, wait, proxy._agent.request, method, target,
                               forward, producer)
            else:
                d = maybeDeferred(proxy._agent.request, method, target, forward, producer)
            return d.addCallback(self._relay, method, reset)

        # _pending first: a synchronous failure may already answer and start the next request.
        self._pending = d = send() if proxy._slots is None else proxy._slots.run(send)
        d.addErrback(self._upstream_failed)

    def _relay(self, response: IResponse, method: bytes, reset: bool) -> Deferred[None] | None:
        code = response.code
        if method == b"HEAD" or code in (204, 304):
            self._send_response(response, b"", method, reset)
            return None
        if not reset and isinstance(response.length, int):
            return self._stream(response)
        collect = _Collect()
        response.deliverBody(collect)
        d = collect.done
        d.addCallback(lambda body: self._send_response(response, body, method, reset))
        return d

    def _send_response(
        self, response: IResponse, body: bytes, method: bytes, reset: bool = False
    ) -> None:
        self._pending = None
        headers = self._headers(response)
        framed = not (method == b"HEAD" or response.code in (204, 304))
        if method == b"HEAD":  # keep the length the origin announced for the GET
            lengths = response.headers.getRawHeaders(b"content-length", [])
            headers += [(b"Content-Length", value) for value in lengths]
        if reset:
            self._reset(response.code, headers, body)
            return
        self._reply(response.code, headers, body, framed=framed)

    def _stream(self, response: IResponse) -> Deferred[None]:
        """The head now, with the length the origin announced; the body as it arrives."""
        if self._lost:
            return succeed(None)
        head = [b"HTTP/1.1 %d %s\r\n" % (response.code, reason_phrase(response.code))]
        head += [name + b": " + value + b"\r\n" for name, value in self._headers(response)]
        head.append(b"Content-Length: %d\r\n" % response.length)
        if self._close:
            head.append(b"Connection: close\r\n")
        self.transport.writeSequence([*head, b"\r\n"])
        stream = _Stream(self)
        response.deliverBody(stream)
        return stream.done.addCallbacks(self._streamed, self._stream_failed)

    def _streamed(self, _: None) -> None:
        self._pending = None
        self._busy = False
        if self._lost:
            return
        if self._close:
            self._buf = b""
            self.transport.loseConnection()
        elif self._buf:
            self._next()

    def _stream_failed(self, failure: Any) -> None:
        """The origin's body broke off after the head went out: nothing valid to send."""
        self._pending = None
        if not self._lost:
            logger.debug("proxy %s: upstream body failed: %s", self.proxy.bind_ip, failure.value)
            self.transport.abortConnection()

    def _headers(self, response: IResponse) -> RawHeaders:
        headers = [
            (name, value)
            for name, values in response.headers.getAllRawHeaders()
            if name.lower() not in _HOP
            for value in values
        ]
        if self.proxy.exit_ip_header:  # as providers do: which address the request left from
            headers.append((self.proxy.exit_ip_header.encode(), self.proxy.bind_ip.encode()))
        return headers

    def _reset(self, status: int, headers: RawHeaders, body: bytes) -> None:
        """The head announcing the whole body, half of the body, then a TCP RST."""
        if self._lost:
            return
        self.proxy.resets += 1
        out = [b"HTTP/1.1 %d %s\r\n" % (status, reason_phrase(status))]
        out += [name + b": " + value + b"\r\n" for name, value in headers]
        out += [b"Content-Length: %d\r\n\r\n" % len(body), body[: len(body) // 2]]
        self.transport.writeSequence(out)
        self._buf = b""
        # abortConnection drops what is still buffered: let the reactor flush the part first
        # (else the client sees no answer at all, and Twisted's client retries it silently)
        self._abort = self.proxy._reactor.callLater(RESET_AFTER, self.transport.abortConnection)

    def _upstream_failed(self, failure: Any) -> None:
        self._pending = None
        if self._lost:
            return  # cancelled because the client went away
        logger.debug("proxy %s: upstream failed: %s", self.proxy.bind_ip, failure.value)
        self._error(502, b"upstream request failed: " + str(failure.value).encode()[:200])

    def _connect(self, target: bytes) -> None:
        host, sep, port = target.decode("latin-1").rpartition(":")
        host = host.strip("[]")
        if not sep or not port.isdigit():
            self._error(400, b"CONNECT needs host:port")
            return
        if not is_loopback(host):
            self._error(403, b"the lab proxy only reaches 127.0.0.0/8")
            return
        endpoint = TCP4ClientEndpoint(
            self.proxy._reactor,
            host,
            int(port),
            timeout=_CONNECT_TIMEOUT,
            bindAddress=(self.proxy.bind_ip, 0),
        )
        self._pending = d = connectProtocol(endpoint, _Tunnel(self))
        d.addCallbacks(self._tunnel_up, self._upstream_failed)

    def _tunnel_up(self, tunnel: _Tunnel) -> None:
        self._pending = None
        if self._lost:
            tunnel.transport.loseConnection()
            return
        self._tunnel = tunnel
        self.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        # Splice with flow control both ways, as twisted.protocols.portforward does.
        self.transport.registerProducer(tunnel.transport, True)
        tunnel.transport.registerProducer(self.transport, True)
        if self._buf:
            tunnel.transport.write(self._buf)
            self._buf = b""

    def _error(
        self,
        status: int,
        message: bytes,
        *,
        headers: RawHeaders | None = None,
        close: bool = False,
    ) -> None:
        headers = [(b"Content-Type", b"text/plain; charset=utf-8"), *(headers or [])]
        self._reply(status, headers, message + b"\n", close=close)

    def _reply(
        self,
        status: int,
        headers: RawHeaders,
        body: bytes,
        *,
        framed: bool = True,
        close: bool = False,
    ) -> None:
        if self._lost:
            return
        close = close or self._close
        out = [b"HTTP/1.1 %d %s\r\n" % (status, reason_phrase(status))]
        out += [name + b": " + value + b"\r\n" for name, value in headers]
        if framed:
            out.append(b"Content-Length: %d\r\n" % len(body))
        if close:
            out.append(b"Connection: close\r\n")
        out += [b"\r\n", body if framed else b""]
        self.transport.writeSequence(out)
        self._busy = False
        if close:
            self._buf = b""
            self.transport.loseConnection()
        elif self._buf:
            self._next()


class _ProxyFactory(Factory):
    noisy = False

    def __init__(self, proxy: ForwardProxy) -> None:
        self.proxy = proxy

    def buildProtocol(self, addr: Any) -> _ClientConnection:
        self.proxy.connections += 1
        return _ClientConnection(self.proxy, self.proxy.connections)


class ForwardProxy(ListeningServer):
    """An HTTP forward proxy on ``127.0.0.1:<port>`` that connects out from ``bind_ip``.

    ``auth``: require ``Proxy-Authorization: Basic`` with these credentials (else 407);
    None accepts anything. ``fail_status``: answer every request with that status without
    forwarding. ``requests`` counts requests (CONNECT included), ``connections`` accepted
    client connections, and ``seen_auth`` holds ``(connection_id, Proxy-Authorization or
    None)`` per request, connection ids counting from 1; :meth:`auth_by_connection` groups
    it. ``tunnel_ports`` maps the local port of each CONNECT tunnel's upstream connection
    (the client port the origin sees) to the id of the client connection that opened it.

    Faults (all off by default; CONNECT tunnels are spliced as they are): ``reset_every=N``
    cuts off every Nth forwarded response (the 1st of them is the Nth), ``reset_probability``
    each one with that probability, drawn from ``random.Random(seed)``: the client gets the
    head (whose Content-Length announces the whole body) and half the body, then a TCP RST;
    ``resets`` counts them. ``blackhole=True`` accepts connections and reads requests but
    never answers (``blackholed`` counts them); a 407 ``fail_status`` carries a
    ``Proxy-Authenticate`` challenge.

    ``capacity=N``: at most N requests forwarded at once (from the request until its
    body is passed on), the rest wait FIFO; None: unbounded.

    Jitter: each forwarded request (not CONNECT) waits ``delay + U(0, jitter)`` seconds,
    drawn from ``random.Random(delay_seed)``, before it goes upstream; ``delays`` records
    every wait drawn. The client connection answers in order, so a later request on the same
    connection waits behind it.
    """

    kind = "proxy"

    def __init__(
        self,
        bind_ip: str = "127.0.0.1",
        *,
        auth: tuple[str, str] | None = None,
        fail_status: int | None = None,
        reset_every: int | None = None,
        reset_probability: float = 0.0,
        seed: int | None = None,
        blackhole: bool = False,
        exit_ip_header: str | None = None,
        capacity: int | None = None,
        delay: float = 0.0,
        jitter: float = 0.0,
        delay_seed: int | None = None,
    ) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 (None means unbounded), got {capacity}")
        self.capacity = capacity
        self._slots = DeferredSemaphore(capacity) if capacity is not None else None
        if delay < 0 or jitter < 0:
            raise ValueError(f"delay and jitter must be >= 0, got {delay}, {jitter}")
        self.delay = delay
        self.jitter = jitter
        self._delay_rng = random.Random(delay_seed)
        self.delays: list[float] = []
        self.bind_ip = bind_ip
        #: a response header naming the address requests leave from (None: not sent)
        self.exit_ip_header = exit_ip_header
        self.auth = auth
        self.fail_status = fail_status
        if fail_status is not None and not 100 <= fail_status <= 599:
            raise ValueError(f"fail_status must be an HTTP status, got {fail_status}")
        if reset_every is not None and reset_every < 1:
            raise ValueError(f"reset_every must be >= 1, got {reset_every}")
        if not 0.0 <= reset_probability <= 1.0:
            raise ValueError(f"reset_probability must be in [0, 1], got {reset_probability}")
        self.reset_every = reset_every
        self.reset_probability = reset_probability
        self.blackhole = blackhole
        self.resets = 0
        self.blackholed = 0
        self._forwarded = 0
        self._rng = random.Random(seed)
        self.requests = 0
        self.connections = 0
        self.seen_auth: list[tuple[int, str | None]] = []
        self.tunnel_ports: dict[int, int] = {}
        self._expected = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()) if auth else None
        self._conns = ConnectionTracker()
        super().__init__()
        self._reactor: Any = None
        self._pool: HTTPConnectionPool | None = None
        self._agent: Agent | None = None

    def auth_by_connection(self) -> dict[int, set[str | None]]:
        """``{connection_id: every Proxy-Authorization (or None) its requests carried}``."""
        out: dict[int, set[str | None]] = {}
        for conn, auth in self.seen_auth:
            out.setdefault(conn, set()).add(auth)
        return out

    def _should_reset(self) -> bool:
        """Whether the forwarded request just received gets its response cut off."""
        self._forwarded += 1
        if self.reset_every is not None and self._forwarded % self.reset_every == 0:
            return True
        return self.reset_probability > 0 and self._rng.random() < self.reset_probability

    def _forward_delay(self) -> float:
        if self.delay <= 0 and self.jitter <= 0:
            return 0.0
        wait = self.delay + self._delay_rng.uniform(0.0, self.jitter)
        self.delays.append(wait)
        return wait

    def _authorized(self, header: bytes | None) -> bool:
        if self._expected is None:
            return True
        if header is None:
            return False
        scheme, _, credentials = header.partition(b" ")
        return scheme.lower() == b"basic" and credentials.strip() == self._expected

    def listen(self, port: int = 0, interface: str = "127.0.0.1") -> int:
        from twisted.internet import reactor  # lazy: a module-level import installs a reactor

        self._reactor = reactor
        self._pool = _QuietPool(reactor, persistent=True)
        self._agent = Agent.usingEndpointFactory(
            reactor, _BoundEndpoints(reactor, self.bind_ip), self._pool
        )
        self._listening = reactor.listenTCP(port, _ProxyFactory(self), interface=interface)
        return self.port

    def rebind(self, bind_ip: str) -> None:
        """Leave from another address from now on, as a provider swapping the IP behind
        a session does (idle upstream connections from the old address are closed)."""
        old = self._pool
        self.bind_ip = bind_ip
        if self._reactor is not None:
            self._pool = _QuietPool(self._reactor, persistent=True)
            self._agent = Agent.usingEndpointFactory(
                self._reactor, _BoundEndpoints(self._reactor, bind_ip), self._pool
            )
        if old is not None:
            old.closeCachedConnections()

    def stop(self) -> Deferred[Any]:
        waits = []
        waits.extend(self._stop_listening())
        # Aborted clients cancel their in-flight upstream requests; then close the idle ones.
        closing = self._conns.abort_all()
        if self._pool is not None:
            pool = self._pool
            closing.addCallback(lambda _: pool.closeCachedConnections())
        waits.append(closing)
        return gatherResults(waits, consumeErrors=True)
