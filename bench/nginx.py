"""Issue 16's signals, and issue 11's limits that move, against servers this project did
not write: nginx as the origin, tinyproxy as the exits.

nginx limits each client IP with ``limit_req`` per ``$binary_remote_addr`` (no burst,
429 for a request over it; nginx sends no Retry-After), states a ``RateLimit-Policy``
with ``add_header ... always``, and answers 503 with ``Retry-After`` while a flag file
exists (an ``if (-f ...)`` in the page location, before ``limit_req``: a 503 consumes no
token). Each exit is a tinyproxy whose outgoing connections are bound to its own
127.0.0.x (``Bind``), so nginx sees one client IP per exit. For the jittery paths
(``jitter-small``, ``jitter-large``) each tinyproxy forwards to a relay of its own
(``Upstream``): a lab proxy, bound to the same 127.0.0.x, that waits delay + U(0, jitter)
s before it forwards a request. The limiter that counts is still nginx's.

    python bench/nginx.py --case overstated --repeat 3   # says 10;w=1, allows 3 r/s per IP
    python bench/nginx.py --case honest --repeat 3       # says 3;w=1, allows 3 r/s per IP
    python bench/nginx.py --case overload-503 --repeat 3 # one 503 + Retry-After: 3 10 s in
    python bench/nginx.py --case silent --repeat 3       # no header, 3 r/s per IP, learned
    python bench/nginx.py --case tighten --repeat 3      # 5 -> 2 r/s per IP 6 s in, 10 exits
    python bench/nginx.py --case loosen --repeat 3       # 2 -> 5 r/s per IP 6 s in, 10 exits
    python bench/nginx.py --case site-wide --repeat 3    # 20 r/s for the site, 5 per IP
    python bench/nginx.py --case per-ip --warm --repeat 3  # cold, then warm from its state
    python bench/nginx.py --case site-wide --warm --strategy exitlimit-redis-learned
    python bench/nginx.py --case burst --repeat 3        # 5 r/s per IP, burst=5 nodelay
    python bench/nginx.py --case jitter-small --repeat 3 # 20 ms + U(0, 60 ms) exit -> nginx
    python bench/nginx.py --case jitter-large --strategy exitlimit   # 50 + U(0, 300), rate given
    python bench/nginx.py --case mixed --repeat 3        # 2 exits at 1 r/s, 1 banned, 1 dead
    python bench/nginx.py --case broad --repeat 3        # 30 origins x 10 exits x 1 r/s per IP
    python bench/nginx.py --case unlimited --baseline random-proxy --repeat 3  # no limit

A site-wide limit is a second ``limit_req`` zone keyed on ``$server_port`` (one key for
every client). A mixed pool's slow exits get a third zone keyed through a ``map`` that
gives only their IPs a key, its banned exits a ``return 403``. A broad crawl's origins are
one nginx listening on 30 ports, its per-IP zone keyed on the client IP and the port.
``--warm`` crawls twice against the same nginx and exits (the origin and the
exits keep their addresses, so the state file names them alike): cold with a new
``EXITLIMIT_STATE_FILE``, then warm from it, each measured on its own requests.
``--strategy`` crawls with another of bench/crawl_once.py's strategies; a Redis one
(``exitlimit-redis-*``) gets its own redis-server for the run, which the warm crawl (a
new process) finds as the cold one left it.

A limit that moves: from ``change_at`` seconds after nginx logs its first request, a flag
file sends the page location to a second ``limit_req`` zone at the new rate (an ``if``
and an internal ``rewrite``); that zone counts anew, as a limit changed by a reload does.

Needs ``nginx`` and ``tinyproxy`` (Debian: ``apt-get install nginx tinyproxy``); not part
of the test suite. Every run starts its own nginx and tinyproxies from a temporary
directory on free ports (nothing system-wide is configured or started) and crawls once in
a fresh process (bench/crawl_once.py); the numbers are read from nginx's access log. For
overload-503 the flag file appears 10 s after nginx logs the first request and goes as
soon as nginx has logged a 503 (at 20 r/s, one answer, sometimes two).

utilization = (pages fetched / capacity + the pause the origin asked for) / crawl time
(first request to last outcome), as in bench/run.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from scrapy_exitlimit.lab.process import start_lab_process
from scrapy_exitlimit.lab.redis_server import RedisServer

HERE = Path(__file__).resolve().parent
FIRST_EXIT_HOST = 10  # exit i leaves from 127.0.0.{10 + i}, as in the lab


@dataclass(frozen=True)
class Case:
    rate: float  # nginx limit_req, r/s per client IP (0: no limit at all)
    exits: int
    pages: int
    strategy: str  # bench/crawl_once.py's
    policy: str | None = None  # RateLimit-Policy stated on every answer
    overload_at: float | None = None  # one 503 this many seconds after the first request
    retry_after: int = 3
    retry_after_429: int | None = None  # nginx sends no Retry-After with limit_req's 429
    #: the per-IP limit becomes ``changed_rate`` this many seconds after the first request
    #: (a second zone, counting anew, behind a flag file)
    change_at: float | None = None
    changed_rate: float | None = None
    site_rate: float | None = None  # a limit_req zone for the whole site, r/s
    burst: int = 0  # limit_req's burst (nodelay): a token bucket that holds this many more
    #: network jitter between each exit and nginx: tinyproxy forwards to its own relay
    #: (a lab proxy, bound to the exit's IP) that waits ``delay`` + U(0, ``jitter``) s
    delay: float = 0.0
    jitter: float = 0.0
    #: a mixed pool: exits (by index) limited to ``slow_rate`` per IP, exits answered 403
    #: to everything, and exit URLs nobody listens on (after the live ones)
    slow: tuple[int, ...] = ()
    slow_rate: float = 1.0
    banned: tuple[int, ...] = ()
    dead: int = 0
    #: a broad crawl: this many origins (one nginx port each, each limited per IP on its
    #: own), the pages interleaved over them
    origins: int = 1

    @property
    def capacity(self) -> float:
        if not self.rate:
            return float("inf")
        fast = self.exits - len(self.slow) - len(self.banned)
        per_ip = self.origins * (self.rate * fast + min(self.rate, self.slow_rate) * len(self.slow))
        return per_ip if self.site_rate is None else min(per_ip, self.site_rate)


CASES = {
    "overstated": Case(rate=3, exits=4, pages=300, strategy="exitlimit-learned",
                       policy="10;w=1"),
    "honest": Case(rate=3, exits=4, pages=300, strategy="exitlimit-learned", policy="3;w=1"),
    "overload-503": Case(rate=5, exits=4, pages=600, strategy="exitlimit", overload_at=10.0),
    # the same origin stating nothing: what learning alone costs through these exits
    "silent": Case(rate=3, exits=4, pages=300, strategy="exitlimit-learned"),
    # issue 11's limits that move, as it measured them: 10 exits, Retry-After: 1 on 429
    "tighten": Case(rate=5, exits=10, pages=1000, strategy="exitlimit-learned",
                    retry_after_429=1, change_at=6.0, changed_rate=2),
    "loosen": Case(rate=2, exits=10, pages=1000, strategy="exitlimit-learned",
                   retry_after_429=1, change_at=6.0, changed_rate=5),
    # issue 11's site-wide limit and its equal exits (learned, and the rate given)
    "site-wide": Case(rate=5, exits=10, pages=600, strategy="exitlimit-learned",
                      retry_after_429=1, site_rate=20),
    "per-ip": Case(rate=5, exits=10, pages=1000, strategy="exitlimit-learned",
                   retry_after_429=1),
    # a bucket with a burst (nginx limit_req burst=5 nodelay): slow start climbs on the
    # burst and meets its wall
    "burst": Case(rate=5, exits=10, pages=1000, strategy="exitlimit-learned",
                  retry_after_429=1, burst=5),
    "per-ip-known": Case(rate=5, exits=10, pages=1000, strategy="exitlimit",
                         retry_after_429=1),
    # issue 11's jittery paths, as it measured them (through a relay): learned; the rate
    # given with --strategy exitlimit
    "jitter-small": Case(rate=5, exits=10, pages=1000, strategy="exitlimit-learned",
                         retry_after_429=1, delay=0.02, jitter=0.06),
    "jitter-large": Case(rate=5, exits=10, pages=1000, strategy="exitlimit-learned",
                         retry_after_429=1, delay=0.05, jitter=0.3),
    # issue 11's mixed pool: 2 exits at 1 r/s, 1 banned, 1 dead proxy (capacity 37 r/s); a
    # slow exit is the first of EXITLIMIT_EXITS, so it scouts first
    "mixed": Case(rate=5, exits=10, pages=600, strategy="exitlimit-learned",
                  retry_after_429=1, slow=(0, 9), banned=(7,), dead=1),
    # issue 11's broad crawl: 30 origins x 10 exits, 1 r/s per IP at each
    "broad": Case(rate=1, exits=10, pages=3000, strategy="exitlimit-learned",
                  retry_after_429=1, origins=30),
    # issue 11's no limit at all: judged against a bare crawl (--baseline random-proxy)
    "unlimited": Case(rate=0, exits=10, pages=3000, strategy="exitlimit-learned"),
}

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format bench '$msec $remote_addr $status $request_uri $server_port';
    access_log {tmp}/access.log bench;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 100000;
    {perip_zone}
    {mixed_zones}
    {changed_zone}
    {site_zone}
    limit_req_status 429;
    server {{
        {limited}
        {listen}
        root {tmp}/www;
        location /page/ {{
            {policy}
            {changed}
            if (-f {tmp}/overloaded) {{
                {policy}
                add_header Retry-After {retry_after} always;
                return 503;
            }}
            {banned}
            {perip_limit}
            {slow_limit}
            {site_limit}
            try_files /page.html =404;
        }}
        {changed_location}
    }}
}}
"""

TINYPROXY_CONF = """\
Port {port}
Listen 127.0.0.1
Bind {bind}
Timeout 30
MaxClients 200
LogFile "{tmp}/tinyproxy-{i}.log"
LogLevel Error
PidFile "{tmp}/tinyproxy-{i}.pid"
DisableViaHeader Yes
Allow 127.0.0.1
"""

PAGE = b"<!DOCTYPE html>\n<html><head><title>nginx page</title></head><body>ok</body></html>\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port}")


class Servers:
    """nginx and one tinyproxy per exit, from ``tmp``; ``stop()`` ends them all."""

    def __init__(self, case: Case, tmp: Path) -> None:
        self.case, self.tmp = case, tmp
        self.procs: list[subprocess.Popen] = []
        self.ports = [free_port() for _ in range(case.origins)]
        self.port = self.ports[0]
        self.exit_urls: list[str] = []

    def start(self) -> None:
        case, tmp = self.case, self.tmp
        tmp.chmod(0o755)  # nginx's worker may run as another user: it reads www/ and the flag
        (tmp / "www").mkdir()
        (tmp / "www" / "page.html").write_bytes(PAGE)
        policy = f'add_header RateLimit-Policy "{case.policy}" always;' if case.policy else ""
        limited = ""
        if case.retry_after_429 is not None:  # limit_req's 429 answered by a named location
            limited = ("error_page 429 @limited; location @limited { "
                       f"{policy} add_header Retry-After {case.retry_after_429} always; "
                       "return 429; }")
        changed = changed_zone = changed_location = ""
        if case.change_at is not None:  # the flag file sends /page/ to the other zone
            changed_zone = ("limit_req_zone $binary_remote_addr zone=changed:10m "
                            f"rate={case.changed_rate:g}r/s;")
            changed = f"if (-f {tmp}/changed) {{ rewrite ^ /changed$uri last; }}"
            changed_location = ("location /changed/ { internal; limit_req zone=changed; "
                                "try_files /page.html =404; }")
        site_zone = site_limit = ""
        if case.site_rate is not None:
            site_zone = f"limit_req_zone $server_port zone=site:1m rate={case.site_rate:g}r/s;"
            site_limit = "limit_req zone=site;"
        conf = tmp / "nginx.conf"
        perip_zone = perip_limit = ""
        if case.rate:  # per origin (the port it listens on) and client IP
            key = "$binary_remote_addr$server_port" if case.origins > 1 else "$binary_remote_addr"
            perip_zone = f"limit_req_zone {key} zone=perip:10m rate={case.rate:g}r/s;"
            perip_limit = f"limit_req zone=perip burst={case.burst} nodelay;" if case.burst \
                else "limit_req zone=perip;"
        mixed_zones = banned = slow_limit = ""
        if case.slow:  # an empty key is not limited: only the slow exits' IPs get one
            ips = " ".join(f"127.0.0.{FIRST_EXIT_HOST + i} $binary_remote_addr;"
                           for i in case.slow)
            mixed_zones += (f"map $remote_addr $slow_key {{ {ips} default \"\"; }} "
                            f"limit_req_zone $slow_key zone=slow:1m rate={case.slow_rate:g}r/s;")
            slow_limit = "limit_req zone=slow;"
        if case.banned:
            ips = " ".join(f"127.0.0.{FIRST_EXIT_HOST + i} 1;" for i in case.banned)
            mixed_zones += f" map $remote_addr $banned {{ {ips} default 0; }}"
            banned = "if ($banned) { return 403; }"
        listen = " ".join(f"listen 127.0.0.1:{port};" for port in self.ports)
        conf.write_text(NGINX_CONF.format(tmp=tmp, listen=listen, perip_zone=perip_zone,
                                          perip_limit=perip_limit, mixed_zones=mixed_zones,
                                          banned=banned, slow_limit=slow_limit,
                                          policy=policy, retry_after=case.retry_after,
                                          limited=limited, changed=changed,
                                          changed_zone=changed_zone,
                                          changed_location=changed_location,
                                          site_zone=site_zone, site_limit=site_limit))
        nginx = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(tmp),
                                  "-c", str(conf), "-e", str(tmp / "error.log")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(nginx)
        wait_listening(self.port, nginx, "nginx")
        relays = self._start_relays() if case.delay or case.jitter else []
        for i in range(case.exits):
            port = free_port()
            path = tmp / f"tinyproxy-{i}.conf"
            upstream = f"Upstream http {relays[i].removeprefix('http://')}\n" if relays else ""
            path.write_text(TINYPROXY_CONF.format(port=port, bind=f"127.0.0.{FIRST_EXIT_HOST + i}",
                                                  tmp=tmp, i=i) + upstream)
            proc = subprocess.Popen([shutil.which("tinyproxy") or "/usr/bin/tinyproxy", "-d",
                                     "-c", str(path)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            wait_listening(port, proc, f"tinyproxy {i}")
            self.exit_urls.append(f"http://127.0.0.1:{port}")
        self.exit_urls += [f"http://127.0.0.1:{free_port()}" for _ in range(case.dead)]

    def _start_relays(self) -> list[str]:
        """One lab proxy per exit, its outgoing connections bound to the exit's IP (so
        nginx still sees one client IP per exit), waiting delay + U(0, jitter) s before
        it forwards each request: the path from a real exit to the origin. The lab's own
        origin (no limit) is started too, and unused."""
        case = self.case
        lab, info = start_lab_process("--exits", str(case.exits), "--rate", "0",
                                      "--delay", f"{case.delay:g}", "--jitter",
                                      f"{case.jitter:g}", "--seed", "1")
        self.procs.append(lab)
        ips = info["exit_ips"]  # relay URL -> the IP it leaves from
        relays = [url for ip in (f"127.0.0.{FIRST_EXIT_HOST + i}" for i in range(case.exits))
                  for url, bound in ips.items() if bound == ip]
        if len(relays) != case.exits:
            raise SystemExit(f"the relays leave from {sorted(ips.values())}, not from "
                             f"127.0.0.{FIRST_EXIT_HOST}.. as the exits do")
        return relays

    @property
    def origin(self) -> str:
        """The origin's URL; comma-separated, one per port, for a broad crawl."""
        return ",".join(f"http://127.0.0.1:{port}" for port in self.ports)

    def access_log(self) -> list[tuple[float, str, int, str]]:
        """``(unix time, client IP, status, "URI port")`` of every request nginx logged."""
        path = self.tmp / "access.log"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4 and parts[2].isdigit():
                out.append((float(parts[0]), parts[1], int(parts[2]), parts[3]))
        return out

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Flag(threading.Thread):
    """Puts the flag file ``name`` in place ``at`` seconds after nginx logs its first
    request."""

    def __init__(self, servers: Servers, name: str, at: float) -> None:
        super().__init__(daemon=True)
        self.servers, self.at = servers, at
        self.flag = servers.tmp / name
        self.done = threading.Event()
        self.raised_at: float | None = None  # unix time the flag appeared

    def run(self) -> None:
        self.raise_flag()

    def raise_flag(self) -> bool:
        """Wait for the moment and put the flag in place; False: stopped before that."""
        first = None
        while not self.done.is_set() and first is None:
            entries = self.servers.access_log()
            first = entries[0][0] if entries else None
            time.sleep(0.01)
        while not self.done.is_set() and time.time() < first + self.at:
            time.sleep(0.001)
        if self.done.is_set():
            return False
        self.flag.touch()
        self.raised_at = time.time()
        return True


class Overload(Flag):
    """Puts the flag file in place ``at`` seconds after nginx logs its first request, and
    removes it as soon as nginx has logged a 503."""

    def __init__(self, servers: Servers, at: float) -> None:
        super().__init__(servers, "overloaded", at)

    def run(self) -> None:
        if not self.raise_flag():
            return
        log = self.servers.tmp / "access.log"
        size = log.stat().st_size
        while not self.done.is_set():
            with log.open("rb") as f:  # only what was logged since the flag appeared
                f.seek(size)
                if any(line.split(b" ")[2:3] == [b"503"] for line in f.read().splitlines()):
                    break
            time.sleep(0.001)
        self.flag.unlink(missing_ok=True)


def start_servers(case: Case, tries: int = 3) -> tuple[Servers, Path]:
    """nginx and the exits on free ports, started anew (on other ports) when one fails:
    a port found free may be taken before nginx binds it (a broad case asks for 30)."""
    for attempt in range(1, tries + 1):
        tmp = Path(tempfile.mkdtemp(prefix="exitlimit-nginx-"))
        servers = Servers(case, tmp)
        try:
            servers.start()
            return servers, tmp
        except SystemExit as exc:
            servers.stop()
            log = tmp / "error.log"
            detail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
            shutil.rmtree(tmp, ignore_errors=True)
            if attempt == tries:
                raise
            print(f"  the servers did not start ({exc}{': ' + detail[0] if detail else ''}); "
                  "again on other ports", file=sys.stderr)
    raise AssertionError("unreachable")


def run_once(case: Case, timeout: float, settings: list[str], log_to: Path | None = None,
             warm: bool = False) -> list[dict]:
    """One crawl (two with ``warm``: cold, then from the cold one's state file) against
    one nginx and its exits; a result per crawl."""
    servers, tmp = start_servers(case)
    redis = RedisServer() if "redis" in case.strategy else None
    results = []
    try:
        if redis is not None:
            redis.start()
            settings = [*settings, f"EXITLIMIT_REDIS_URL={redis.url}"]
        # warm: both crawls keep the state in one file (the cold one starts without it)
        state = [f"EXITLIMIT_STATE_FILE={tmp / 'state.json'}"] if warm else []
        for phase in ("cold", "warm") if warm else ("",):
            log_file = None if log_to is None else \
                log_to.parent / f"{log_to.name}{'.' + phase if phase else ''}.log"
            results.append(_crawl(servers, case, timeout, [*settings, *state], log_file))
            results[-1]["phase"] = phase
    finally:
        servers.stop()
        if redis is not None:
            redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _crawl(servers: Servers, case: Case, timeout: float, settings: list[str],
           log_to: Path | None) -> dict:
    """Crawl once in a fresh process and measure it on the requests nginx logged for it."""
    overload = change = None
    logged_before = len(servers.access_log())
    if case.overload_at is not None:
        overload = Overload(servers, case.overload_at)
        overload.start()
    if case.change_at is not None:
        change = Flag(servers, "changed", case.change_at)
        change.start()
    crawl = subprocess.run(
        [sys.executable, str(HERE / "crawl_once.py"), "--strategy", case.strategy,
         "--origin", servers.origin, "--exits", ",".join(servers.exit_urls),
         "--rate", f"{case.rate:g}", "--pages", str(case.pages), "--timeout", str(timeout),
         *(f"--set={s}" for s in settings)],
        capture_output=True, text=True)
    if log_to is not None:
        log_to.parent.mkdir(parents=True, exist_ok=True)
        log_to.write_text(crawl.stderr)
    if crawl.returncode != 0:
        sys.stderr.write(crawl.stderr[-3000:])
        raise SystemExit("the crawl failed")
    result = json.loads(crawl.stdout.strip().splitlines()[-1])
    for thread in (overload, change):
        if thread is not None:
            thread.done.set()
            thread.join()
    log = [e for e in servers.access_log()[logged_before:] if e[3].startswith("/page/")]
    status = Counter(e[2] for e in log)
    capacity = case.capacity
    pause = case.retry_after if case.overload_at is not None and status[503] else 0.0
    ideal = result["ok"] / capacity + pause
    if change is not None and change.raised_at is not None and log:
        # what the origin allowed: the old limit until the change, then the new one
        at = change.raised_at - log[0][0]
        ideal = result["ok"] / capacity if result["ok"] <= capacity * at else \
            at + (result["ok"] - capacity * at) / (case.changed_rate * case.exits)
    start = log[0][0] if log else 0.0
    per_second: Counter[int] = Counter(int(e[0] - start) for e in log if e[2] == 429)
    out = {
        "case": dataclasses.asdict(case),
        "ok": result["ok"],
        "lost": case.pages - result["ok"],
        "wall": result["wall"],
        "requests": len(log),
        "status": dict(sorted(status.items())),
        "share_429": status[429] / len(log) if log else 0.0,
        "first_second_429": per_second[0],
        # clean answers in the first second, over what the origin allows in one
        "first_second_of_capacity": sum(1 for e in log if e[2] == 200 and e[0] < start + 1)
        / capacity,
        "utilization": ideal / result["wall"] if result["wall"] > 0 else 0.0,
        "exitlimit": result["exitlimit"],
        # every page request nginx logged: [seconds since the first, client IP, status]
        "events": [[round(e[0] - start, 3), e[1], e[2]] for e in log],
        # and the port it came to (a broad crawl's origin)
        "ports": [int(e[3].rsplit(" ", 1)[-1]) for e in log],
    }
    if change is not None and change.raised_at is not None:
        after = [e for e in log if e[0] >= change.raised_at]
        out["share_429_after_change"] = \
            sum(e[2] == 429 for e in after) / len(after) if after else 0.0
    if overload is not None and status[503]:
        t503 = next(e[0] for e in log if e[2] == 503)
        # nothing but what was already on its way until Retry-After is over
        out["after_503"] = {
            "at": t503 - start,
            "arrivals_in_pause": sum(1 for e in log if t503 + 0.1 < e[0] < t503 + case.retry_after
                                     - 0.05),
            "first_200_after": min((e[0] - t503 for e in log if e[0] > t503 + 0.1
                                    and e[2] == 200), default=None),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES), default="overstated")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="CLOSESPIDER_TIMEOUT")
    ap.add_argument("--pages", type=int, help="start requests instead of the case's (a long "
                    "start list: with a short --timeout, the first seconds)")
    ap.add_argument("--json", help="also write every run to this file")
    ap.add_argument("--retry-after-429", type=int, metavar="N",
                    help="limit_req's 429 carries Retry-After: N (nginx sends none by default)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a Scrapy setting for the crawl, e.g. EXITLIMIT_COOLDOWN_DEFAULT=1")
    ap.add_argument("--logs", metavar="DIR", help="save each crawl's log as CASE.RUN.log "
                    "(BENCH_LOG sets its level, WARNING by default)")
    ap.add_argument("--warm", action="store_true", help="crawl twice on the same servers: "
                    "cold, then warm from the cold crawl's EXITLIMIT_STATE_FILE")
    ap.add_argument("--strategy", help="bench/crawl_once.py's strategy instead of the case's "
                    "(exitlimit-redis-*: with a redis-server of its own for the run)")
    ap.add_argument("--baseline", metavar="STRATEGY", help="before each run, crawl the same "
                    "case with this strategy (e.g. random-proxy) and report pages/s against it")
    args = ap.parse_args()
    for tool in ("nginx", "tinyproxy"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            raise SystemExit(f"{tool} is not installed (Debian: apt-get install nginx tinyproxy)")
    case = CASES[args.case]
    if args.retry_after_429 is not None:
        case = dataclasses.replace(case, retry_after_429=args.retry_after_429)
    if args.strategy:
        case = dataclasses.replace(case, strategy=args.strategy)
    if args.pages:
        case = dataclasses.replace(case, pages=args.pages)
    if args.warm and (case.change_at is not None or case.overload_at is not None):
        raise SystemExit("--warm: a case whose limit stays as it is")
    if args.baseline and args.warm:
        raise SystemExit("--baseline: not with --warm")
    runs, ratios = [], []
    for k in range(args.repeat):
        if args.baseline:  # alternated with the strategy's runs: the machine's drift hits both
            base = run_once(dataclasses.replace(case, strategy=args.baseline), args.timeout,
                            [], None)[0]
        got = run_once(case, args.timeout, args.set,
                       Path(args.logs) / f"{args.case}.{k}" if args.logs else None, args.warm)
        runs += got
        if args.baseline:
            ratio = (got[0]["ok"] / got[0]["wall"]) / (base["ok"] / base["wall"])
            ratios.append(ratio)
            print(f"  run {k} {args.baseline}: {base['ok']}/{case.pages} pages, "
                  f"{base['wall']:.2f}s, statuses {base['status']}; {case.strategy} / "
                  f"{args.baseline} pages/s {ratio:.3f}", file=sys.stderr)
        for r in got:
            extra = f", after the 503: {r['after_503']}" if "after_503" in r else ""
            if "share_429_after_change" in r:
                extra += f", 429 share after the change {r['share_429_after_change']:.2%}"
            print(f"  run {k}{' ' + r['phase'] if r['phase'] else ''}: {r['ok']}/{case.pages} "
                  f"pages, {r['wall']:.1f}s, statuses {r['status']}, 429 share "
                  f"{r['share_429']:.2%} (first second: {r['first_second_429']} 429s, "
                  f"{r['first_second_of_capacity']:.2f} of capacity), utilization "
                  f"{r['utilization']:.3f}{extra}", file=sys.stderr)
    print(f"\nnginx {args.case}: {case.exits} tinyproxy exits, "
          + (f"limit_req {case.rate:g} r/s per IP" if case.rate else "no limit")
          + (f", {case.site_rate:g} r/s for the site" if case.site_rate else "")
          + (f", RateLimit-Policy {case.policy}" if case.policy else "")
          + (f", one 503 + Retry-After {case.retry_after} at {case.overload_at:g} s"
             if case.overload_at is not None else "")
          + (f", Retry-After {case.retry_after_429} on 429" if case.retry_after_429 else "")
          + (f", {case.changed_rate:g} r/s per IP from {case.change_at:g} s"
             if case.change_at is not None else "")
          + "".join(f", {s}" for s in args.set)
          + f", {case.strategy}, median of {args.repeat}\n")
    print(f"{'run':5} {'pages':>6} {'lost':>5} {'429 share':>10} {'wall s':>7} "
          f"{'utilization':>12} {'1st s':>6}")
    for phase in ("cold", "warm") if args.warm else ("",):
        of_phase = [r for r in runs if r["phase"] == phase]
        median = sorted(of_phase, key=lambda r: r["wall"])[len(of_phase) // 2]
        print(f"{phase or '-':5} {case.pages:>6} {median['lost']:>5} "
              f"{median['share_429']:>10.2%} {median['wall']:>7.1f} "
              f"{median['utilization']:>12.3f} {median['first_second_of_capacity']:>6.2f}")
    if ratios:
        print(f"\n{case.strategy} / {args.baseline}, pages/s, median of {len(ratios)}: "
              f"{sorted(ratios)[len(ratios) // 2]:.3f} (runs: "
              + ", ".join(f"{r:.3f}" for r in ratios) + ")")
    if args.json:
        for r in runs:
            r["name"], r["settings"] = args.case, args.set
        Path(args.json).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
