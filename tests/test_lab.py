"""The lab: GCRA arithmetic, the origin's decisions and bookkeeping, the proxies, the CLI."""

from __future__ import annotations

import base64
import json
import select
import socket
import subprocess
import sys
import time
import urllib.request
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import pytest_twisted
from twisted.internet import threads
from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.web.client import Agent, HTTPConnectionPool, ProxyAgent, readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IBodyProducer
from twisted.web.resource import Resource
from twisted.web.server import Site
from zope.interface import implementer

from scrapy_exitlimit.lab import GCRA, ForwardProxy, IPRule, Lab, OriginConfig
from scrapy_exitlimit.lab.origin import max_in_window
from scrapy_exitlimit.lab.spider import PagesSpider

ROOT = Path(__file__).resolve().parent.parent
# Twisted's own wart: readBody on a pooled connection warns that its transport cannot abort.
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody:DeprecationWarning")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- GCRA and window arithmetic (no sockets) ----------------------------------------


def test_gcra_is_strict_at_burst_one():
    clock = Clock()
    gcra = GCRA(5, 1, clock)
    assert gcra.try_acquire()  # t=0
    clock.now = 0.199
    assert not gcra.try_acquire()
    assert gcra.wait_time() == pytest.approx(0.001)
    clock.now = 0.2
    assert gcra.try_acquire()
    # exactly on time keeps working although 0.2 + 0.2 + 0.2 != 0.6 in floats
    for step in range(3, 10):
        clock.now = step * 0.2
        assert gcra.try_acquire(), step


def test_gcra_burst_and_rejections_do_not_consume():
    clock = Clock()
    gcra = GCRA(5, 3, clock)
    assert gcra.remaining() == 3
    assert [gcra.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert gcra.remaining() == 0
    assert gcra.wait_time() == pytest.approx(0.2)
    tat = gcra.tat
    for i in range(19):  # hammering does not push the next slot out
        clock.now = i * 0.01
        assert not gcra.try_acquire()
    assert gcra.tat == tat
    clock.now = 0.2
    assert gcra.try_acquire()
    assert not gcra.try_acquire()
    clock.now = 1.0  # idle long enough: the whole burst is back
    assert gcra.remaining() == 3
    assert GCRA(5, 1).policy() == (5, 1)
    assert GCRA(5, 10).policy() == (10, 2)
    assert GCRA(0.5, 1).policy() == (1, 2)
    with pytest.raises(ValueError):
        GCRA(0, 1)


def test_max_in_window_is_a_sliding_half_open_window():
    assert max_in_window([], 1.0) == 0
    assert max_in_window([0.0, 1.0], 1.0) == 1  # [t, t + window)
    assert max_in_window([0.0, 0.1, 0.2, 1.0, 1.05, 1.1, 1.15], 1.0) == 5
    assert max_in_window([1.15, 0.0, 1.0, 0.2], 0.5) == 2  # order does not matter
    paced = [i * 0.2 for i in range(20)]
    assert max_in_window(paced, 1.0) == 5
    assert max_in_window(paced, 0.199) == 1


def test_config_validation():
    with pytest.raises(ValueError):
        OriginConfig(retry_after_mode="sometimes")
    with pytest.raises(ValueError):
        OriginConfig(rate=0)
    with pytest.raises(ValueError):
        OriginConfig(per_ip={"127.0.0.10": IPRule(rate=-1)})
    cfg = OriginConfig(rate=5, per_ip={"a": IPRule(rate=1), "b": IPRule(ban=True)})
    assert (cfg.rate_for("a"), cfg.rate_for("b"), cfg.rate_for("c")) == (1, 5, 5)
    with pytest.raises(ValueError):
        Lab(exits=201)


# -- in-process servers ---------------------------------------------------------------


@implementer(IBodyProducer)
class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.length = data, len(data)

    def startProducing(self, consumer: Any):
        consumer.write(self.data)
        return succeed(None)

    def pauseProducing(self) -> None: ...
    def resumeProducing(self) -> None: ...
    def stopProducing(self) -> None: ...


class Resp:
    def __init__(self, code: int, headers: Headers, body: bytes) -> None:
        self.code, self.headers, self.body = code, headers, body

    def header(self, name: str) -> str | None:
        values = self.headers.getRawHeaders(name.encode())
        return values[0].decode() if values else None


class Client:
    """Twisted's ProxyAgent over a persistent pool, as Scrapy talks to a proxy."""

    def __init__(self, proxy_url: str | None) -> None:
        from twisted.internet import reactor

        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.auth = None
        if proxy_url is None:
            self.agent = Agent(reactor, pool=self.pool)
            return
        url = urlsplit(proxy_url)
        endpoint = TCP4ClientEndpoint(reactor, url.hostname, url.port)
        self.agent = ProxyAgent(endpoint, reactor, self.pool)
        if url.username is not None:
            userinfo = f"{unquote(url.username)}:{unquote(url.password or '')}"
            self.auth = b"Basic " + base64.b64encode(userinfo.encode())

    async def request(
        self, url: str, method: bytes = b"GET", body: bytes | None = None, **headers: str
    ) -> Resp:
        h = Headers()
        for name, value in headers.items():
            h.addRawHeader(name.replace("_", "-"), value)
        if self.auth is not None and not h.hasHeader(b"proxy-authorization"):
            h.addRawHeader(b"Proxy-Authorization", self.auth)
        response = await self.agent.request(
            method, url.encode(), h, None if body is None else _Bytes(body)
        )
        return Resp(response.code, response.headers, await readBody(response))

    async def codes(self, url: str, n: int) -> list[int]:
        return [(await self.request(url)).code for _ in range(n)]


class Env:
    """Starts labs, servers and clients for one test and tears them all down after it."""

    def __init__(self) -> None:
        self._stops: list[Any] = []
        self._clients: list[Client] = []

    def lab(self, **kwargs: Any) -> Lab:
        lab = Lab(**kwargs)
        lab.start()
        self._stops.append(lab.stop)
        return lab

    def client(self, proxy_url: str | None = None) -> Client:
        self._clients.append(Client(proxy_url))
        return self._clients[-1]

    def on_close(self, stop: Any) -> None:
        self._stops.append(stop)

    async def close(self) -> None:
        await gatherResults([c.pool.closeCachedConnections() for c in self._clients])
        await gatherResults([stop() for stop in self._stops])


@pytest_twisted.async_yield_fixture()
async def env():
    e = Env()
    yield e
    await e.close()


def _raw_exchange(port: int, *steps: bytes) -> list[bytes]:
    """Blocking: send each step; read a response head after each, then to EOF after the last."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        data = b""
        for i, step in enumerate(steps):
            sock.sendall(step)
            last = i == len(steps) - 1
            while (chunk := sock.recv(65536)) and (last or b"\r\n\r\n" not in data + chunk):
                data += chunk
            out.append(data + chunk)
            data = b""
    return out


@pytest_twisted.ensureDeferred
async def test_each_exit_reaches_the_origin_from_its_own_ip(env):
    lab = env.lab(exits=3, origin=OriginConfig(rate=5))
    assert len(lab.exit_urls) == 3 and len(set(lab.exit_urls)) == 3
    for i, url in enumerate(lab.exit_urls):
        resp = await env.client(url).request(lab.page_url(i))
        assert resp.code == 200
        assert lab.exit_ip(url) == f"127.0.0.1{i}"
        assert f'<span class="ip">127.0.0.1{i}</span>'.encode() in resp.body
        assert f'href="/page/{2 * i + 1}"'.encode() in resp.body
    ips = ["127.0.0.10", "127.0.0.11", "127.0.0.12"]
    assert lab.origin.ips() == ips
    # the control route answers directly and is neither limited nor counted
    stats = json.loads((await env.client().request(lab.origin_url + "/_lab/stats")).body)
    assert stats == lab.origin.stats()
    assert sorted(stats["ips"]) == ips
    assert stats["totals"] == {
        "status": {"200": 3, "429": 0, "403": 0, "503": 0, "404": 0},
        "arrivals": 3,
        "accepted": 3,
    }


@pytest_twisted.ensureDeferred
async def test_a_burst_through_one_exit_gets_429_over_one_kept_alive_connection(env):
    clock = Clock()
    lab = env.lab(exits=1, origin=OriginConfig(rate=5, retry_after=1.5), clock=clock)
    client = env.client(lab.exit_urls[0])
    url = lab.page_url(1)
    assert await client.codes(url, 4) == [200, 429, 429, 429]
    limited = await client.request(url)
    assert limited.code == 429 and limited.header("Retry-After") == "2"  # whole seconds, up
    clock.advance(0.2)
    assert await client.codes(url, 2) == [200, 429]
    proxy = lab.proxies[0]
    assert proxy.requests == 7 and proxy.connections == 1  # keep-alive to the proxy
    origin, ip = lab.origin, "127.0.0.10"
    assert origin.total() == 7 and origin.total(429) == 5 and origin.total("200") == 2
    assert origin.accepted_times(ip) == [0.0, 0.2]
    assert origin.events(ip)[:2] == [(0.0, 200), (0.0, 429)]
    assert origin.max_in_window(ip, 1.0) == 7
    assert origin.max_in_window(ip, 1.0, accepted_only=True) == 2
    assert origin.max_in_window(ip, 0.2, accepted_only=True) == 1


@pytest_twisted.ensureDeferred
async def test_a_real_time_concurrent_burst_is_rejected(env):
    lab = env.lab(exits=1, origin=OriginConfig(rate=5))
    client = env.client(lab.exit_urls[0])
    burst = [Deferred.fromCoroutine(client.request(lab.page_url(n))) for n in range(8)]
    resps = await gatherResults(burst)
    codes = [r.code for r in resps]
    assert 1 <= codes.count(200) <= 2 and codes.count(429) == 8 - codes.count(200)
    assert all(r.header("Retry-After") == "1" for r in resps if r.code == 429)


@pytest_twisted.ensureDeferred
async def test_http_date_retry_after_and_ratelimit_headers(env):
    cfg = OriginConfig(
        rate=5, burst=2, retry_after=1, retry_after_mode="http-date", ratelimit_headers=True
    )
    clock = Clock()
    lab = env.lab(exits=1, origin=cfg, clock=clock)
    client = env.client(lab.exit_urls[0])
    first, second, third = [await client.request(lab.page_url(0)) for _ in range(3)]
    assert (first.code, second.code, third.code) == (200, 200, 429)
    assert first.header("X-RateLimit-Remaining") == "1" and first.header("X-RateLimit-Reset") == "0"
    assert second.header("RateLimit") == "limit=5, remaining=0, reset=1"
    assert third.header("RateLimit-Policy") == "5;w=1" and third.header("X-RateLimit-Limit") == "5"
    date = parsedate_to_datetime(third.header("Date"))
    retry_at = parsedate_to_datetime(third.header("Retry-After"))
    assert 1 <= (retry_at - date).total_seconds() <= 2
    assert abs(date.timestamp() - time.time()) < 5
    none_mode = env.lab(exits=1, origin=OriginConfig(retry_after_mode="none"), clock=clock)
    client = env.client(none_mode.exit_urls[0])
    await client.request(none_mode.page_url(0))
    limited = await client.request(none_mode.page_url(0))
    assert limited.code == 429 and limited.header("Retry-After") is None


@pytest_twisted.ensureDeferred
async def test_origin_limit_banned_and_slow_ips(env):
    clock = Clock()
    cfg = OriginConfig(
        rate=5,
        origin_rate=1,
        per_ip={"127.0.0.11": IPRule(ban=True), "127.0.0.12": IPRule(rate=1, latency=0.05)},
    )
    lab = env.lab(exits=3, origin=cfg, clock=clock)
    a, banned, slow = (env.client(url) for url in lab.exit_urls)
    assert (await a.request(lab.page_url(0))).code == 200
    blocked = await banned.request(lab.page_url(0))
    assert blocked.code == 403 and b"Access denied" in blocked.body and b"captcha" in blocked.body
    started = time.monotonic()
    over_origin = await slow.request(lab.page_url(0))
    assert time.monotonic() - started >= 0.05  # its extra latency
    assert over_origin.code == 503 and over_origin.header("Retry-After") == "1"
    clock.advance(1.0)  # the 503 consumed nothing: the slow IP's own slot is still free
    assert (await slow.request(lab.page_url(1))).code == 200
    clock.advance(0.5)
    assert (await slow.request(lab.page_url(2))).code == 429  # 1 r/s for that IP
    status = {ip: s["status"] for ip, s in lab.origin.stats()["ips"].items()}
    assert status["127.0.0.11"]["403"] == 1 and status["127.0.0.12"]["503"] == 1


@pytest_twisted.ensureDeferred
async def test_404s_are_counted_but_not_limited_and_reset_forgets(env):
    clock = Clock()
    lab = env.lab(exits=1, origin=OriginConfig(rate=5), clock=clock)
    client = env.client(lab.exit_urls[0])
    base = lab.origin_url
    assert await client.codes(base + "/nope", 2) == [404, 404]
    assert (await client.request(base + "/page/x")).code == 404
    assert (await client.request(base + "/")).code == 200  # the 404s did not consume
    assert (await client.request(base + "/page/0")).code == 429
    assert lab.origin.stats()["ips"]["127.0.0.10"] == {
        "status": {"200": 1, "429": 1, "403": 0, "503": 0, "404": 3},
        "arrivals": 5,
        "accepted": 1,
        "accepted_span": [0.0, 0.0],
    }
    direct = env.client()
    assert (await direct.request(base + "/_lab/reset")).code == 405
    reset = await direct.request(base + "/_lab/reset", method=b"POST")
    assert reset.code == 200 and lab.origin.total() == 0
    assert (await client.request(base + "/page/0")).code == 200  # limiter state forgotten too


@pytest_twisted.ensureDeferred
async def test_dead_exits_refuse_and_failing_exits_fail(env):
    lab = env.lab(exits=2, dead_exits=2, proxy_kwargs={1: {"fail_status": 502}})
    live, failing, dead, _ = lab.exit_urls
    assert [lab.exit_ip(u) for u in lab.exit_urls] == [f"127.0.0.1{i}" for i in range(4)]
    with pytest.raises(ConnectionRefusedError):
        await env.client(dead).request(lab.page_url(0))
    assert (await env.client(failing).request(lab.page_url(0))).code == 502
    assert (await env.client(live).request(lab.page_url(0))).code == 200
    assert lab.origin.ips() == ["127.0.0.10"]  # the failing exit forwarded nothing


@pytest_twisted.ensureDeferred
async def test_proxy_auth(env):
    lab = env.lab(exits=1, proxy_auth=("user", "p@ss"))
    url = lab.exit_urls[0]
    assert "//user:p%40ss@127.0.0.1:" in url
    bare = url.replace("user:p%40ss@", "")
    refused = await env.client(bare).request(lab.page_url(0))
    assert refused.code == 407 and refused.header("Proxy-Authenticate") == 'Basic realm="lab"'
    foo_bar = "Basic Zm9vOmJhcg=="
    wrong = await env.client(bare).request(lab.page_url(0), proxy_authorization=foo_bar)
    assert wrong.code == 407
    assert (await env.client(url.replace("user", "u%73er")).request(lab.page_url(0))).code == 200
    assert lab.origin.total() == 1
    good = "Basic " + base64.b64encode(b"user:p@ss").decode()
    assert [auth for _, auth in lab.proxies[0].seen_auth] == [None, foo_bar, good]


@pytest_twisted.ensureDeferred
async def test_seen_auth_tells_connections_apart(env):
    lab = env.lab(exits=1, origin=OriginConfig(rate=None))  # any credentials accepted
    port = lab.proxies[0].port
    alice = env.client(f"http://alice:a@127.0.0.1:{port}")
    bob = env.client(f"http://bob:b@127.0.0.1:{port}")
    for _ in range(2):
        assert (await alice.request(lab.page_url(0))).code == 200
        assert (await bob.request(lab.page_url(0))).code == 200
    seen = lab.proxies[0].seen_auth
    assert len(seen) == 4
    by_conn: dict[int, set[str | None]] = {}
    for conn, auth in seen:
        by_conn.setdefault(conn, set()).add(auth)
    assert len(by_conn) == 2 and all(len(auths) == 1 for auths in by_conn.values())


@pytest_twisted.ensureDeferred
async def test_connect_tunnel_and_pipelining(env):
    lab = env.lab(exits=1, origin=OriginConfig(rate=None))
    proxy, authority = lab.proxies[0], f"127.0.0.1:{lab.origin.port}"
    head, answer = await threads.deferToThread(
        _raw_exchange,
        proxy.port,
        f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode(),
        b"GET /page/5 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert head.startswith(b"HTTP/1.1 200 Connection established\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"127.0.0.10" in answer
    assert lab.origin.ips() == ["127.0.0.10"]
    outside = b"CONNECT 10.1.2.3:443 HTTP/1.1\r\nProxy-Connection: close\r\n\r\n"
    (refused,) = await threads.deferToThread(_raw_exchange, proxy.port, outside)
    assert refused.startswith(b"HTTP/1.1 403 ")
    # two requests in one write: answered in order on one connection
    target = lab.page_url(7)
    (both,) = await threads.deferToThread(
        _raw_exchange,
        proxy.port,
        f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n"
        f"GET {target}0 HTTP/1.1\r\nHost: x\r\nProxy-Connection: close\r\n\r\n".encode(),
    )
    assert both.count(b"HTTP/1.1 200 OK") == 2
    assert both.index(b"page 7<") < both.index(b"page 70<")


class _Echo(Resource):
    isLeaf = True

    def render(self, request: Any) -> bytes:
        headers = {k.decode().lower() for k, _ in request.requestHeaders.getAllRawHeaders()}
        return json.dumps(
            {
                "method": request.method.decode(),
                "body": request.content.read().decode(),
                "ip": request.getClientAddress().host,
                "headers": sorted(headers),
            }
        ).encode()


@pytest_twisted.ensureDeferred
async def test_proxy_forwards_method_and_body_and_strips_hop_by_hop_headers(env):
    from twisted.internet import reactor

    echo = reactor.listenTCP(0, Site(_Echo()), interface="127.0.0.1")
    env.on_close(echo.stopListening)
    proxy = ForwardProxy("127.0.0.42")
    proxy.listen()
    env.on_close(proxy.stop)
    client = env.client(f"http://u:p@127.0.0.1:{proxy.port}")
    resp = await client.request(
        f"http://127.0.0.1:{echo.getHost().port}/x",
        method=b"PUT",
        body=b"hello",
        proxy_connection="keep-alive",
        x_custom="1",
    )
    seen = json.loads(resp.body)
    assert resp.code == 200 and seen["ip"] == "127.0.0.42"
    assert (seen["method"], seen["body"]) == ("PUT", "hello")
    assert "x-custom" in seen["headers"] and "host" in seen["headers"]
    assert "proxy-authorization" not in seen["headers"]
    assert "proxy-connection" not in seen["headers"]
    assert proxy.seen_auth == [(1, "Basic dTpw")]


def test_cli_serves_until_terminated(monkeypatch):
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy_exitlimit.lab", "--exits", "2", "--rate", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert select.select([proc.stdout], [], [], 20)[0], "the lab printed nothing"
        info = json.loads(proc.stdout.readline())
        assert len(info["exit_urls"]) == 2
        assert info["origin_urls"] == [info["origin_url"]]
        url = info["exit_urls"][1]
        assert info["exit_ips"][url] == "127.0.0.11"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": url}))
        with opener.open(info["origin_url"] + "/page/1", timeout=5) as resp:
            assert resp.status == 200
            assert b'<span class="ip">127.0.0.11</span>' in resp.read()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "lab stopped after 1 requests" in err


async def _timed(client: Client, url: str) -> tuple[float, float, bytes]:
    """(seconds to the head, seconds to the whole body, body) of one GET through a proxy."""
    h = Headers()
    if client.auth is not None:
        h.addRawHeader(b"Proxy-Authorization", client.auth)
    start = time.monotonic()
    response = await client.agent.request(b"GET", url.encode(), h, None)
    head = time.monotonic() - start
    body = await readBody(response)
    return head, time.monotonic() - start, body


@pytest.mark.filterwarnings("ignore:Using readBody:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_a_slow_body_passes_the_proxy_as_it_arrives(env):
    # the head at once, the body over 0.2 s: a client timing the head sees none of it
    lab = env.lab(exits=1, origin=OriginConfig(rate=None, body_time=0.2))
    head, whole, body = await _timed(env.client(lab.exit_urls[0]), lab.page_url(3))
    assert head < 0.1 and 0.19 < whole < 0.5, (head, whole)
    assert b"<h1>page 3</h1>" in body and body.endswith(b"</html>\n")
    with pytest.raises(ValueError, match="body_time"):
        OriginConfig(body_time=-1)


@pytest.mark.filterwarnings("ignore:Using readBody:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_a_proxy_with_a_capacity_queues_what_is_over_it(env):
    # 2 forwarded at once, each answered after 0.1 s: 4 at once take 0.1 s and 0.2 s
    lab = env.lab(exits=1, origin=OriginConfig(rate=None, latency=0.1),
                  proxy_kwargs={0: {"capacity": 2}})
    client = env.client(lab.exit_urls[0])
    times = sorted(t for _, t, _ in await gatherResults(
        [Deferred.fromCoroutine(_timed(client, lab.page_url(n))) for n in range(4)]))
    assert times[3] > 0.18, times
    # read at the origin, as it saw them (a loaded test process had answered three
    # at once to the client, 0.1 s late: 0.205, 0.218, 0.218, 0.320): two at once,
    # the other two only when those were answered
    (ip,) = lab.origin.ips()
    arrived = sorted(t for t, _ in lab.origin.events(ip))
    assert arrived[1] - arrived[0] < 0.05 and arrived[2] - arrived[0] >= 0.095, arrived
    with pytest.raises(ValueError, match="capacity"):
        ForwardProxy(capacity=0)


# -- issue 11: limits that move, jitter on the way, many origins ----------------------


def test_gcra_set_rate_keeps_the_booked_slot():
    clock = Clock()
    gcra = GCRA(5, 1, clock)
    assert gcra.try_acquire()  # tat 0.2
    gcra.set_rate(2)
    assert gcra.wait_time() == pytest.approx(0.2)  # the slot booked at 5 r/s stays
    clock.now = 0.2
    assert gcra.try_acquire()  # tat 0.2 + 0.5
    clock.now = 0.6
    assert not gcra.try_acquire()
    clock.now = 0.7
    assert gcra.try_acquire()
    with pytest.raises(ValueError):
        gcra.set_rate(0)


def test_rate_schedule_config():
    cfg = OriginConfig(rate=5, rate_schedule=[(10, 1), (6, 2)])
    assert cfg.rate_schedule == [(6.0, 2.0), (10.0, 1.0)]  # sorted
    assert [cfg.scheduled_rate(t) for t in (0, 5.99, 6, 9, 10, 100)] == [5, 5, 2, 2, 1, 1]
    assert OriginConfig(rate=2, rate_schedule=[(0, 5)]).scheduled_rate(0) == 5
    for bad in ([(6, 0)], [(-1, 2)]):
        with pytest.raises(ValueError):
            OriginConfig(rate_schedule=bad)


@pytest_twisted.ensureDeferred
async def test_the_per_ip_rate_changes_at_the_scheduled_time_after_the_first_request(env):
    clock = Clock()
    clock.now = 100.0
    cfg = OriginConfig(rate=5, rate_schedule=[(6.0, 2.0)],
                       per_ip={"127.0.0.11": IPRule(rate=1)})
    lab = env.lab(exits=3, origin=cfg, clock=clock)
    a, slow, late = (env.client(url) for url in lab.exit_urls)
    assert lab.origin.stats()["schedule_start"] is None
    clock.advance(3.0)  # the schedule starts with the first request, not with the server
    assert (await a.request(lab.page_url(0))).code == 200
    assert lab.origin.stats()["schedule_start"] == 3.0
    clock.advance(0.2)
    assert await a.codes(lab.page_url(1), 2) == [200, 429]  # 5 r/s
    clock.advance(5.8)  # 6 s after the first request: 2 r/s from now on
    assert (await a.request(lab.page_url(2))).code == 200
    clock.advance(0.2)
    assert (await a.request(lab.page_url(3))).code == 429  # was fine at 5 r/s
    clock.advance(0.3)
    assert (await a.request(lab.page_url(3))).code == 200
    stats = lab.origin.stats()
    assert stats["rate"] == 2.0 and stats["ips"]["127.0.0.10"]["status"]["429"] == 2
    # an IP with its own rate keeps it; an IP seen first after the change gets the new rate
    assert await slow.codes(lab.page_url(0), 2) == [200, 429]
    clock.advance(0.5)
    assert (await slow.request(lab.page_url(0))).code == 429
    assert await late.codes(lab.page_url(0), 2) == [200, 429]
    clock.advance(0.3)
    assert (await late.request(lab.page_url(0))).code == 429  # 2 r/s from the start
    # a reset starts the schedule again from the next request
    lab.origin.reset()
    clock.advance(10.0)
    assert await a.codes(lab.page_url(0), 2) == [200, 429]
    clock.advance(0.2)
    assert (await a.request(lab.page_url(0))).code == 200  # 5 r/s again
    assert lab.origin.stats()["schedule_start"] == pytest.approx(20.3)


def test_forward_delay_is_seeded_and_bounded():
    def draws(seed: int) -> list[float]:
        proxy = ForwardProxy(delay=0.02, jitter=0.06, delay_seed=seed)
        return [proxy._forward_delay() for _ in range(50)]

    first = draws(1)
    assert first == draws(1) and first != draws(2)
    assert all(0.02 <= d <= 0.08 for d in first) and max(first) - min(first) > 0.03
    assert ForwardProxy()._forward_delay() == 0.0
    with pytest.raises(ValueError):
        ForwardProxy(jitter=-1)


@pytest_twisted.ensureDeferred
async def test_a_proxy_delays_each_request_before_it_goes_upstream(env):
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    lab = env.lab(exits=1, origin=OriginConfig(rate=None),
                  proxy_kwargs={0: {"delay": 0.05, "jitter": 0.05, "delay_seed": 3}})
    client = env.client(lab.exit_urls[0])
    started = time.monotonic()
    assert await client.codes(lab.page_url(0), 2) == [200, 200]
    proxy = lab.proxies[0]
    assert len(proxy.delays) == 2 and time.monotonic() - started >= sum(proxy.delays) - 0.005
    # a client that hangs up while its request waits: the request never reaches the origin
    hung = client.agent.request(b"GET", lab.page_url(1).encode())
    hung.addErrback(lambda _: None)
    await deferLater(reactor, 0.01, lambda: None)
    hung.cancel()
    await deferLater(reactor, 0.12, lambda: None)
    assert lab.origin.total() == 2 and len(proxy.delays) == 3


@pytest_twisted.ensureDeferred
async def test_many_origins_each_with_its_own_limits_counts_and_control_routes(env):
    clock = Clock()
    lab = env.lab(exits=1, origins=3, origin=OriginConfig(rate=5), clock=clock)
    urls = lab.origin_urls
    assert len(set(urls)) == 3 and urls[0] == lab.origin_url and lab.origins[0] is lab.origin
    client = env.client(lab.exit_urls[0])
    for url in urls:  # the same exit, one slot per origin
        assert (await client.request(url + "/page/0")).code == 200
    assert (await client.request(urls[1] + "/page/1")).code == 429
    direct = env.client()
    stats = [json.loads((await direct.request(u + "/_lab/stats")).body) for u in urls]
    assert [s["totals"]["arrivals"] for s in stats] == [1, 2, 1]
    assert (await direct.request(urls[1] + "/_lab/reset", method=b"POST")).code == 200
    assert [o.total() for o in lab.origins] == [1, 0, 1]
    assert (await client.request(urls[1] + "/page/1")).code == 200
    with pytest.raises(ValueError):
        Lab(origins=0)


def test_cli_builds_moving_limits_jitter_and_many_origins():
    from scrapy_exitlimit.lab.__main__ import build_lab, parse_args

    lab = build_lab(parse_args([
        "--exits", "2", "--origins", "3", "--rate", "5", "--rate-change", "6=2",
        "--rate-change", "12=4", "--delay", "0.02", "--jitter", "0.06",
        "--origin-rate", "20", "--origin-status", "429",
    ]))
    cfg = lab.origin.config
    assert len(lab.origins) == 3 and all(o.config is cfg for o in lab.origins)
    assert cfg.rate_schedule == [(6.0, 2.0), (12.0, 4.0)]
    assert (cfg.origin_rate, cfg.origin_status) == (20, 429)
    assert [(p.delay, p.jitter) for p in lab.proxies] == [(0.02, 0.06)] * 2
    # each exit its own stream, the same on every run
    draws = [[p._forward_delay() for _ in range(3)] for p in lab.proxies]
    assert draws[0] != draws[1]
    again = build_lab(parse_args(["--exits", "2", "--delay", "0.02", "--jitter", "0.06"]))
    assert [[p._forward_delay() for _ in range(3)] for p in again.proxies] == draws
    with pytest.raises(SystemExit):
        parse_args(["--rate-change", "6"])


async def _start_urls(spider: PagesSpider) -> list[str]:
    return [request.url async for request in spider.start()]


@pytest_twisted.ensureDeferred
async def test_pages_spider_interleaves_several_bases():
    spider = PagesSpider(bases="http://a:1,http://b:2/", pages=5, first=3)
    assert await _start_urls(spider) == [
        "http://a:1/page/3", "http://b:2/page/3", "http://a:1/page/4", "http://b:2/page/4",
        "http://a:1/page/5",
    ]
    one = PagesSpider(base="http://a:1", pages=2)
    assert await _start_urls(one) == ["http://a:1/page/0", "http://a:1/page/1"]
    with pytest.raises(ValueError):
        PagesSpider(pages=1)


# -- signals: a scheduled answer, a stated policy, a fixed window -----------------------


def test_signal_config_validation():
    from scrapy_exitlimit.lab import ScheduledAnswer

    for bad in ({"at": -1, "status": 503}, {"at": 1, "status": 99},
                {"at": 1, "status": 503, "retry_after": -1}):
        with pytest.raises(ValueError):
            ScheduledAnswer(**bad)
    cfg = OriginConfig(status_at=[ScheduledAnswer(9, 502), ScheduledAnswer(3, 503)])
    assert [a.at for a in cfg.status_at] == [3, 9]  # sorted
    for bad in ({"window_limit": 0}, {"window_limit": 3, "window": 0},
                {"window_reset": "minutes"}, {"announce_policy": "10;w=1\r\nX: y"},
                {"window_limit": 3, "ratelimit_headers": True}):
        with pytest.raises(ValueError):
            OriginConfig(**bad)


def test_a_fixed_window_opens_with_the_first_request_after_the_last_one_closed():
    from scrapy_exitlimit.lab import FixedWindow

    window = FixedWindow(3, 10.0)
    assert window.reset_in(0.0) == 0.0 and window.remaining(5.0) == 3
    assert [window.try_acquire(t) for t in (5.0, 5.1, 6.0, 14.9)] == [True, True, True, False]
    assert window.remaining(14.9) == 0 and window.reset_in(14.9) == pytest.approx(0.1)
    assert window.try_acquire(15.0) and window.reset_in(15.0) == 10.0  # 15 + 10, not 20
    assert window.remaining(16.0) == 2


@pytest_twisted.ensureDeferred
async def test_one_scheduled_answer_at_its_time_after_the_first_request(env):
    from scrapy_exitlimit.lab import ScheduledAnswer

    clock = Clock()
    clock.now = 50.0
    cfg = OriginConfig(rate=5, status_at=[ScheduledAnswer(10.0, 503, retry_after=3)])
    lab = env.lab(exits=2, origin=cfg, clock=clock)
    a, b = (env.client(url) for url in lab.exit_urls)
    assert (await a.request(lab.page_url(0))).code == 200  # the schedule starts here
    clock.advance(9.99)
    assert (await b.request(lab.page_url(1))).code == 200
    clock.advance(0.01)
    assert (await a.request(lab.origin_url + "/nope")).code == 404  # pages only
    over = await b.request(lab.page_url(2))
    assert over.code == 503 and over.header("Retry-After") == "3"
    clock.advance(0.19)  # b's next slot after 9.99 at 5 r/s: the 503 took none
    assert [(await c.request(lab.page_url(3))).code for c in (a, b)] == [200, 200]  # once
    # times since the origin started (at 50); the 503 counts as an arrival
    assert lab.origin.events("127.0.0.11")[-2:] == [(pytest.approx(10.0), 503),
                                                    (pytest.approx(10.19), 200)]
    assert lab.origin.stats()["scheduled_answers_left"] == 0
    lab.origin.reset()  # given again after a reset, counted from the next first request
    clock.advance(5.0)
    assert (await a.request(lab.page_url(0))).code == 200
    clock.advance(10.0)
    assert (await a.request(lab.page_url(0))).code == 503


@pytest_twisted.ensureDeferred
async def test_a_stated_policy_is_sent_as_is_whatever_the_limit(env):
    clock = Clock()
    cfg = OriginConfig(rate=3, announce_policy="10;w=1", ratelimit_headers=True)
    lab = env.lab(exits=1, origin=cfg, clock=clock)
    client = env.client(lab.exit_urls[0])
    ok, limited = [await client.request(lab.page_url(0)) for _ in range(2)]
    missing = await client.request(lab.origin_url + "/nope")
    assert (ok.code, limited.code, missing.code) == (200, 429, 404)
    assert {r.header("RateLimit-Policy") for r in (ok, limited, missing)} == {"10;w=1"}
    assert ok.header("X-RateLimit-Limit") == "3"  # the other fields stay honest


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("form", ["seconds", "epoch"])
async def test_a_fixed_window_states_limit_remaining_and_reset(env, form):
    clock = Clock()
    cfg = OriginConfig(rate=None, window_limit=2, window=5.0, window_reset=form)
    lab = env.lab(exits=1, origin=cfg, clock=clock)
    lab.origin.wallclock = lambda: 1_700_000_000.25 + clock.now
    client = env.client(lab.exit_urls[0])

    async def get(n: int) -> tuple[Resp, float]:
        wall = lab.origin.wallclock()  # a fake clock: the same when the answer comes
        return await client.request(lab.page_url(n)), wall

    def reset(answer: tuple[Resp, float]) -> float:  # seconds to the window's end, as read
        value = int(answer[0].header("X-RateLimit-Reset"))
        return value - answer[1] if form == "epoch" else value

    first = await get(0)
    clock.advance(1.5)
    second, third = [await get(1) for _ in range(2)]
    assert reset(first) == (5.75 if form == "epoch" else 5)  # the epoch form rounds up
    assert reset(second) == (4.25 if form == "epoch" else 4)
    first, second, third = first[0], second[0], third[0]
    assert (first.code, second.code, third.code) == (200, 200, 429)
    assert [r.header("X-RateLimit-Remaining") for r in (first, second, third)] == ["1", "0", "0"]
    assert {r.header("X-RateLimit-Limit") for r in (first, second, third)} == {"2"}
    assert third.header("Retry-After") == "4"  # ceil(3.5): the window's end, not retry_after
    clock.advance(3.5)  # the window closes 5 s after its first request
    fourth = await get(2)
    assert fourth[0].code == 200 and fourth[0].header("X-RateLimit-Remaining") == "1"
    assert reset(fourth) == (5.75 if form == "epoch" else 5)
    assert lab.origin.stats()["ips"]["127.0.0.10"]["status"]["429"] == 1


def test_cli_builds_signals():
    from scrapy_exitlimit.lab.__main__ import build_lab, parse_args

    cfg = build_lab(parse_args([
        "--exits", "1", "--status-at", "10=503:3", "--status-at", "20.5=502",
        "--announce-policy", "10;w=1", "--window-limit", "15", "--window", "5",
        "--window-reset", "epoch",
    ])).origin.config
    assert [(a.at, a.status, a.retry_after) for a in cfg.status_at] == [
        (10.0, 503, 3.0), (20.5, 502, None)]
    assert (cfg.announce_policy, cfg.window_limit, cfg.window, cfg.window_reset) == (
        "10;w=1", 15, 5.0, "epoch")
    assert build_lab(parse_args(["--exits", "1"])).origin.config.window_limit is None
    for bad in ("10", "10=abc", "10=503:", "-1=503"):
        with pytest.raises(SystemExit):
            parse_args(["--status-at", bad])
