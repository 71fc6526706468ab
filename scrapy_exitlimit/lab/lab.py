"""Origins plus N exits, each exit a forward proxy with its own loopback source IP."""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import quote, urlsplit

from twisted.internet.defer import Deferred, gatherResults, succeed

from ._net import unused_ports
from .origin import Clock, Origin, OriginConfig
from .proxy import ForwardProxy

logger = logging.getLogger(__name__)

FIRST_EXIT_HOST = 10  # exit i binds to 127.0.0.{10 + i}


class Lab:
    """Local servers for tests, demo and benchmark.

    ``exits`` live proxies (exit i connects out from ``127.0.0.{10+i}``), then ``dead_exits``
    proxy URLs on which nobody listens. ``proxy_auth`` makes every proxy require those Basic
    credentials and puts them in ``exit_urls``; ``proxy_kwargs`` gives per-exit-index extra
    :class:`ForwardProxy` arguments, e.g. ``{2: {"fail_status": 502}}``. ``clock`` drives the
    origin's limiters (monotonic seconds; inject a fake one to test decisions without sleeping).

    ``origins`` > 1 serves that many origins for a broad crawl, each on its own port with its
    own limiters, counts and control routes (``/_lab/stats``, ``/_lab/reset``), all from the
    same config; ``origin`` is the first of ``self.origins``.
    """

    def __init__(
        self,
        exits: int = 10,
        origin: OriginConfig | None = None,
        dead_exits: int = 0,
        proxy_auth: tuple[str, str] | None = None,
        proxy_kwargs: dict[int, dict[str, Any]] | None = None,
        *,
        origin_port: int = 0,
        clock: Clock = time.monotonic,
        origins: int = 1,
    ) -> None:
        if not 0 <= exits <= 200 or not 0 <= dead_exits <= 200 - exits:
            raise ValueError("need 0 <= exits <= 200 and exits + dead_exits <= 200")
        if not 1 <= origins <= 1000:
            raise ValueError("need 1 <= origins <= 1000")
        # one config object for all: limits are the same everywhere, state is per origin
        self.origins = [Origin(origin, clock=clock) for _ in range(origins)]
        self.origin = self.origins[0]
        self.proxy_auth = proxy_auth
        kwargs = proxy_kwargs or {}
        self.proxies = [
            ForwardProxy(_exit_ip(i), **{"auth": proxy_auth, **kwargs.get(i, {})})
            for i in range(exits)
        ]
        self.dead_exits = dead_exits
        self._origin_port = origin_port
        self._dead_ports: list[int] = []
        self._started = False

    def start(self) -> Deferred[Lab]:
        """Listen on the running (or about to run) reactor; the Deferred has already fired."""
        if self._started:
            raise RuntimeError("lab already started")
        started: list[Origin | ForwardProxy] = []
        try:
            for server in [*self.origins, *self.proxies]:
                server.listen(self._origin_port if server is self.origin else 0)
                started.append(server)
        except Exception:
            for server in started:  # do not leak the ports already open
                server.stop()
            raise
        self._dead_ports = unused_ports(self.dead_exits)
        self._started = True
        logger.info(
            "lab: %d origin(s) from %s, %d exits (%s..), %d dead",
            len(self.origins),
            self.origin_url,
            len(self.proxies),
            _exit_ip(0),
            self.dead_exits,
        )
        return succeed(self)

    def stop(self) -> Deferred[Any]:
        """Close every port and connection; fires when they are closed."""
        if not self._started:
            return succeed(None)
        self._started = False
        stops = [p.stop() for p in self.proxies] + [o.stop() for o in self.origins]
        return gatherResults(stops, consumeErrors=True)

    async def __aenter__(self) -> Lab:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def origin_url(self) -> str:
        return self.origin.url

    @property
    def origin_urls(self) -> list[str]:
        return [o.url for o in self.origins]

    def page_url(self, n: int) -> str:
        return f"{self.origin.url}/page/{n}"

    @property
    def exit_urls(self) -> list[str]:
        """Proxy URLs, live exits first, then dead ones."""
        if not self._started:
            raise RuntimeError("lab is not started")
        userinfo = ""
        if self.proxy_auth is not None:
            user, password = self.proxy_auth
            userinfo = f"{quote(user, safe='')}:{quote(password, safe='')}@"
        ports = [p.port for p in self.proxies] + self._dead_ports
        return [f"http://{userinfo}127.0.0.1:{port}" for port in ports]

    @property
    def exit_ips(self) -> dict[str, str]:
        """``{exit_url: source IP the origin sees}``; dead exits get the IP they would have."""
        return {url: _exit_ip(i) for i, url in enumerate(self.exit_urls)}

    def exit_ip(self, url: str) -> str:
        """The source IP behind an exit URL (with or without credentials)."""
        port = urlsplit(url).port
        for i, p in enumerate([p.port for p in self.proxies] + self._dead_ports):
            if p == port:
                return _exit_ip(i)
        raise KeyError(url)


def _exit_ip(i: int) -> str:
    return f"127.0.0.{FIRST_EXIT_HOST + i}"
