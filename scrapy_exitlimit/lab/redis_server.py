"""A throwaway redis-server on a free loopback port: for the tests, the demo and bench/."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import weakref


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
        # gone with the object, not at stop(): a stopped server may be started again
        weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
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


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    import random

    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 30000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisClusterServer:
    """A real Redis Cluster of ``masters`` redis-server processes on free loopback ports
    (no replicas), made with ``redis-cli --cluster create``: for the tests and bench/."""

    def __init__(self, binary: str | None = None, cli: str | None = None,
                 masters: int = 3) -> None:
        binary = binary or shutil.which("redis-server")
        cli = cli or shutil.which("redis-cli")
        if binary is None or cli is None:
            raise FileNotFoundError("redis-server and redis-cli are needed "
                                    "(apt install redis-server)")
        self.binary, self.cli = binary, cli
        self.ports: list[int] = []
        while len(self.ports) < masters:
            port = _free_cluster_port()
            if port not in self.ports:
                self.ports.append(port)
        self.dir = tempfile.mkdtemp(prefix="exitlimit-redis-cluster-")
        weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)  # (nodes.conf)
        self.procs: list[subprocess.Popen] = []

    @property
    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{port}/0" for port in self.ports]

    def start(self) -> None:
        import os

        for port in self.ports:
            node_dir = os.path.join(self.dir, str(port))
            os.makedirs(node_dir, exist_ok=True)
            self.procs.append(subprocess.Popen(
                [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", node_dir, "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            for port in self.ports:
                self._wait(port, "PING", b"+PONG")
            subprocess.run([self.cli, "--cluster", "create",
                            *(f"127.0.0.1:{port}" for port in self.ports),
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=30)
            for port in self.ports:  # every node agrees the cluster is up
                self._wait(port, "CLUSTER INFO", b"cluster_state:ok")
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _wait(port: int, command: str, expect: bytes, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(command.encode() + b"\r\n")
                    if expect in s.recv(4096):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis cluster node {port}: no {expect!r} to {command!r}")

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(10)
        self.procs = []

    def __enter__(self) -> RedisClusterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
