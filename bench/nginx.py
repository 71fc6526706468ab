"""Issue 16's signals, and issue 11's limits that move, against servers this project did
not write: nginx as the origin, tinyproxy as the exits.

nginx limits each client IP with ``limit_req`` per ``$binary_remote_addr`` (no burst,
429 for a request over it; nginx sends no Retry-After), states a ``RateLimit-Policy``
with ``add_header ... always``, and answers 503 with ``Retry-After`` while a flag file
exists (an ``if (-f ...)`` in the page location, before ``limit_req``: a 503 consumes no
token). Each exit is a tinyproxy whose outgoing connections are bound to its own
127.0.0.x (``Bind``), so nginx sees one client IP per exit.

    python bench/nginx.py --case overstated --repeat 3   # says 10;w=1, allows 3 r/s per IP
    python bench/nginx.py --case honest --repeat 3       # says 3;w=1, allows 3 r/s per IP
    python bench/nginx.py --case overload-503 --repeat 3 # one 503 + Retry-After: 3 10 s in
    python bench/nginx.py --case silent --repeat 3       # no header, 3 r/s per IP, learned
    python bench/nginx.py --case tighten --repeat 3      # 5 -> 2 r/s per IP 6 s in, 10 exits
    python bench/nginx.py --case loosen --repeat 3       # 2 -> 5 r/s per IP 6 s in, 10 exits

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

HERE = Path(__file__).resolve().parent
FIRST_EXIT_HOST = 10  # exit i leaves from 127.0.0.{10 + i}, as in the lab


@dataclass(frozen=True)
class Case:
    rate: float  # nginx limit_req, r/s per client IP
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
}

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format bench '$msec $remote_addr $status $request_uri';
    access_log {tmp}/access.log bench;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 100000;
    limit_req_zone $binary_remote_addr zone=perip:10m rate={rate}r/s;
    {changed_zone}
    limit_req_status 429;
    server {{
        {limited}
        listen 127.0.0.1:{port};
        root {tmp}/www;
        location /page/ {{
            {policy}
            {changed}
            if (-f {tmp}/overloaded) {{
                {policy}
                add_header Retry-After {retry_after} always;
                return 503;
            }}
            limit_req zone=perip;
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
        self.port = free_port()
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
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=self.port, rate=f"{case.rate:g}",
                                          policy=policy, retry_after=case.retry_after,
                                          limited=limited, changed=changed,
                                          changed_zone=changed_zone,
                                          changed_location=changed_location))
        nginx = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(tmp),
                                  "-c", str(conf), "-e", str(tmp / "error.log")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.append(nginx)
        wait_listening(self.port, nginx, "nginx")
        for i in range(case.exits):
            port = free_port()
            path = tmp / f"tinyproxy-{i}.conf"
            path.write_text(TINYPROXY_CONF.format(port=port, bind=f"127.0.0.{FIRST_EXIT_HOST + i}",
                                                  tmp=tmp, i=i))
            proc = subprocess.Popen([shutil.which("tinyproxy") or "/usr/bin/tinyproxy", "-d",
                                     "-c", str(path)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            wait_listening(port, proc, f"tinyproxy {i}")
            self.exit_urls.append(f"http://127.0.0.1:{port}")

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def access_log(self) -> list[tuple[float, str, int, str]]:
        """``(unix time, client IP, status, URI)`` of every request nginx logged."""
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


def run_once(case: Case, timeout: float, settings: list[str], log_to: Path | None = None
             ) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="exitlimit-nginx-"))
    servers = Servers(case, tmp)
    overload = change = None
    try:
        servers.start()
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
        log = [e for e in servers.access_log() if e[3].startswith("/page/")]
    finally:
        servers.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    status = Counter(e[2] for e in log)
    capacity = case.rate * case.exits
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
        "utilization": ideal / result["wall"] if result["wall"] > 0 else 0.0,
        "exitlimit": result["exitlimit"],
        # every page request nginx logged: [seconds since the first, client IP, status]
        "events": [[round(e[0] - start, 3), e[1], e[2]] for e in log],
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
    ap.add_argument("--json", help="also write every run to this file")
    ap.add_argument("--retry-after-429", type=int, metavar="N",
                    help="limit_req's 429 carries Retry-After: N (nginx sends none by default)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a Scrapy setting for the crawl, e.g. EXITLIMIT_COOLDOWN_DEFAULT=1")
    ap.add_argument("--logs", metavar="DIR", help="save each crawl's log as CASE.RUN.log "
                    "(BENCH_LOG sets its level, WARNING by default)")
    args = ap.parse_args()
    for tool in ("nginx", "tinyproxy"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            raise SystemExit(f"{tool} is not installed (Debian: apt-get install nginx tinyproxy)")
    case = CASES[args.case]
    if args.retry_after_429 is not None:
        case = dataclasses.replace(case, retry_after_429=args.retry_after_429)
    runs = []
    for k in range(args.repeat):
        r = run_once(case, args.timeout, args.set,
                     Path(args.logs) / f"{args.case}.{k}.log" if args.logs else None)
        runs.append(r)
        extra = f", after the 503: {r['after_503']}" if "after_503" in r else ""
        if "share_429_after_change" in r:
            extra += f", 429 share after the change {r['share_429_after_change']:.2%}"
        print(f"  run {k}: {r['ok']}/{case.pages} pages, {r['wall']:.1f}s, statuses "
              f"{r['status']}, 429 share {r['share_429']:.2%} ({r['first_second_429']} in the "
              f"first second), utilization {r['utilization']:.3f}{extra}", file=sys.stderr)
    median = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]
    print(f"\nnginx {args.case}: {case.exits} tinyproxy exits, limit_req {case.rate:g} r/s per "
          f"IP" + (f", RateLimit-Policy {case.policy}" if case.policy else "")
          + (f", one 503 + Retry-After {case.retry_after} at {case.overload_at:g} s"
             if case.overload_at is not None else "")
          + (f", Retry-After {case.retry_after_429} on 429" if case.retry_after_429 else "")
          + (f", {case.changed_rate:g} r/s per IP from {case.change_at:g} s"
             if case.change_at is not None else "")
          + "".join(f", {s}" for s in args.set)
          + f", {case.strategy}, median of {len(runs)}\n")
    print(f"{'pages':>6} {'lost':>5} {'429 share':>10} {'wall s':>7} {'utilization':>12}")
    print(f"{case.pages:>6} {median['lost']:>5} {median['share_429']:>10.2%} "
          f"{median['wall']:>7.1f} {median['utilization']:>12.3f}")
    if args.json:
        for r in runs:
            r["name"], r["settings"] = args.case, args.set
        Path(args.json).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
