"""A throwaway redis-server on a free loopback port: for the tests, the demo and bench/."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """``start()``/``stop()`` can be called again: a restart keeps the port, loses the data."""

    def __init__(self, binary: str | None = None, *extra: str) -> None:
        """``extra``: more redis-server arguments (``--unixsocket PATH``, say)."""
        binary = binary or shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (apt install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="exitlimit-redis-")
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
