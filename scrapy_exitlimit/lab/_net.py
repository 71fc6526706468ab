"""Small networking helpers shared by the lab servers."""

from __future__ import annotations

import ipaddress
import socket
from http import HTTPStatus
from typing import Any

from twisted.internet.defer import Deferred, gatherResults, maybeDeferred

_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and 127.0.0.0/8 literals: the lab never talks to anything else."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host) in _LOOPBACK
    except ValueError:
        return False


def reason_phrase(status: int) -> bytes:
    """Reason phrase; Twisted's own table lacks some codes (429 comes out "Unknown Status")."""
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Status"


def unused_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that were free a moment ago and on which nobody now listens."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        # Bound together, closed together: the ports are distinct.
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ConnectionTracker:
    """The open connections of a server, so ``stop()`` can abort them and wait for the close."""

    def __init__(self) -> None:
        self._open: dict[Any, Deferred[None]] = {}

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, proto: Any) -> None:
        self._open[proto] = Deferred()

    def closed(self, proto: Any) -> None:
        d = self._open.pop(proto, None)
        if d is not None:
            d.callback(None)

    def abort_all(self) -> Deferred[Any]:
        waits = list(self._open.values())
        for proto in list(self._open):
            proto.transport.abortConnection()
        return gatherResults(waits)


class ListeningServer:
    """A lab server on 127.0.0.1: its port and URL, and how it stops listening."""

    kind = "server"

    def __init__(self) -> None:
        self._listening: Any = None

    @property
    def port(self) -> int:
        if self._listening is None:
            raise RuntimeError(f"{self.kind} is not listening")
        return self._listening.getHost().port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _stop_listening(self) -> list[Deferred[Any]]:
        if self._listening is None:
            return []
        listening, self._listening = self._listening, None
        return [maybeDeferred(listening.stopListening)]
