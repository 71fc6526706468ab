"""Run the lab until SIGINT/SIGTERM; print one JSON line describing it to stdout.

Example: python -m scrapy_exitlimit.lab --exits 10 --rate 5 --ban 127.0.0.12 --slow 127.0.0.13=1

Capacity: --body-time 0.2 (each body takes 0.2 s to send) --proxy-capacity 127.0.0.10=24
(that exit forwards 24 requests at once, the rest queue)

A limit that moves: --rate 5 --rate-change 6=2 (5 r/s per IP, 2 r/s from 6 s after the
first request). Jitter between exits and origin: --delay 0.02 --jitter 0.06. A broad crawl:
--origins 30 (30 origins, one port each, each with its own limits and /_lab/ routes).

Signals: --status-at 10=503:3 (one 503 with Retry-After 3, 10 s after the first request);
--announce-policy '10;w=1' (every answer states that RateLimit-Policy, true or not);
--window-limit 15 --window 5 --window-reset epoch (15 per 5 s per IP, a fixed window stated
in X-RateLimit-Limit/-Remaining/-Reset, the reset as seconds or a Unix time).

Faults: --fail 127.0.0.14=407 --reset 127.0.0.15=3 --reset-probability 127.0.0.16=0.2
--blackhole 127.0.0.17 --stall /page/3 --stall-fraction 0.01 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from .lab import FIRST_EXIT_HOST, Lab
from .origin import IPRule, OriginConfig, ScheduledAnswer

logger = logging.getLogger("scrapy_exitlimit.lab")


def _slow(value: str) -> tuple[str, float]:
    ip, sep, rate = value.partition("=")
    try:
        if not sep or float(rate) <= 0:
            raise ValueError
        return ip, float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected IP=RATE with RATE > 0, got {value!r}") from None


def _rate_change(value: str) -> tuple[float, float]:
    at, sep, rate = value.partition("=")
    try:
        if not sep or float(at) < 0 or float(rate) <= 0:
            raise ValueError
        return float(at), float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected AT=RATE with AT >= 0 seconds and RATE > 0, got {value!r}") from None


def _status_at(value: str) -> ScheduledAnswer:
    at, sep, answer = value.partition("=")
    status, colon, retry_after = answer.partition(":")
    try:
        if not sep or not status.isdigit() or (colon and not retry_after):
            raise ValueError
        return ScheduledAnswer(float(at), int(status),
                               float(retry_after) if colon else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected AT=STATUS[:RETRY_AFTER] with AT >= 0 seconds, got {value!r}") from None


def _ip_value(kind: type, what: str, ok: Any) -> Any:
    def parse(value: str) -> tuple[str, Any]:
        ip, sep, raw = value.partition("=")
        try:
            if not sep:
                raise ValueError
            parsed = kind(raw)
            if not ok(parsed):
                raise ValueError
            return ip, parsed
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected IP={what}, got {value!r}") from None

    return parse


def _exit_index(ip: str, exits: int) -> int:
    """The live exit bound to ``ip`` (exit i leaves from 127.0.0.{10+i})."""
    prefix = "127.0.0."
    last = ip[len(prefix):]
    if ip.startswith(prefix) and last.isdigit() and 0 <= int(last) - FIRST_EXIT_HOST < exits:
        return int(last) - FIRST_EXIT_HOST
    raise ValueError(f"{ip} is not the address of a live exit (127.0.0.{FIRST_EXIT_HOST}.. with "
                     f"--exits {exits})")


def _credentials(value: str) -> tuple[str, str]:
    user, sep, password = value.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("expected USER:PASS")
    return user, password


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m scrapy_exitlimit.lab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--exits", type=int, default=10, help="live proxies (default 10)")
    p.add_argument("--rate", type=float, default=5.0, help="requests/s per client IP; 0: no limit")
    p.add_argument("--burst", type=int, default=1)
    p.add_argument("--retry-after", type=float, default=1.0, help="seconds advertised")
    p.add_argument(
        "--retry-after-mode", choices=("seconds", "http-date", "none"), default="seconds"
    )
    p.add_argument("--origin-rate", type=float, default=None, help="whole-origin requests/s")
    p.add_argument("--origin-burst", type=int, default=1)
    p.add_argument("--origin-status", type=int, default=503,
                   help="status answered over the whole-origin limit (default 503; nginx: 429)")
    p.add_argument("--rate-change", action="append", default=[], type=_rate_change,
                   metavar="AT=RATE", help="from AT seconds after the first request, RATE "
                   "r/s per IP (repeatable; IPs with their own --slow rate keep it)")
    p.add_argument("--origins", type=int, default=1,
                   help="origins, one port each, each with its own limiters and counts")
    p.add_argument("--delay", type=float, default=0.0,
                   help="seconds each exit waits before forwarding a request upstream")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="plus U(0, JITTER) seconds, per request (seeded by --seed, else 0)")
    p.add_argument("--ban", nargs="+", action="extend", default=[], metavar="IP")
    p.add_argument("--slow", nargs="+", action="extend", default=[], type=_slow, metavar="IP=RATE")
    p.add_argument("--latency", type=float, default=0.0, help="seconds before every answer")
    p.add_argument("--capacity", type=int, default=0,
                   help="answers in service at once per client IP, the rest queue; 0: unbounded")
    p.add_argument("--body-time", type=float, default=0.0,
                   help="seconds to send each body, in pieces, after the head")
    p.add_argument("--proxy-capacity", nargs="+", action="extend", default=[], metavar="IP=N",
                   type=_ip_value(int, "N with N >= 1", lambda n: n >= 1),
                   help="this exit forwards at most N requests at once, the rest queue")
    p.add_argument("--dead", type=int, default=0, help="exit URLs nobody listens on")
    p.add_argument("--ratelimit-headers", action="store_true",
                   help="state the per-IP rate in RateLimit, RateLimit-Policy and "
                   "X-RateLimit-* headers")
    sig = p.add_argument_group("signals")
    sig.add_argument("--status-at", action="append", default=[], type=_status_at,
                     metavar="AT=STATUS[:RETRY_AFTER]",
                     help="the first page request AT seconds or more after the first request "
                     "is answered STATUS (with Retry-After), once per reset (repeatable)")
    sig.add_argument("--announce-policy", default=None, metavar="POLICY",
                     help="send 'RateLimit-Policy: POLICY' (e.g. '10;w=1') on every answer, "
                     "whatever the limit really is")
    sig.add_argument("--window-limit", type=int, default=0, metavar="N",
                     help="also a fixed window per IP: N requests per --window seconds, "
                     "stated in X-RateLimit-Limit/-Remaining/-Reset; 0: none")
    sig.add_argument("--window", type=float, default=60.0, metavar="SECONDS")
    sig.add_argument("--window-reset", choices=("seconds", "epoch"), default="seconds",
                     help="X-RateLimit-Reset as seconds to the window's end, or its Unix time")
    p.add_argument("--proxy-auth", type=_credentials, default=None, metavar="USER:PASS")
    p.add_argument("--port", type=int, default=0, help="origin port (default: a free one)")
    f = p.add_argument_group("faults (exits named by the IP they leave from)")
    f.add_argument("--fail", nargs="+", action="extend", default=[], metavar="IP=STATUS",
                   type=_ip_value(int, "STATUS", lambda s: 100 <= s <= 599),
                   help="this exit answers every request with STATUS (e.g. 407, 502)")
    f.add_argument("--reset", nargs="+", action="extend", default=[], metavar="IP=N",
                   type=_ip_value(int, "N with N >= 1", lambda n: n >= 1),
                   help="this exit cuts off every Nth response mid-body with a TCP reset")
    f.add_argument("--reset-probability", nargs="+", action="extend", default=[],
                   metavar="IP=P", type=_ip_value(float, "P in [0, 1]", lambda x: 0 <= x <= 1),
                   help="this exit cuts off each response with probability P")
    f.add_argument("--blackhole", nargs="+", action="extend", default=[], metavar="IP",
                   help="this exit accepts connections and never answers")
    f.add_argument("--stall", nargs="+", action="extend", default=[], metavar="PATH",
                   help="the origin never answers this path (e.g. /page/3)")
    f.add_argument("--stall-times", type=int, default=None, metavar="N",
                   help="each --stall path stalls only its first N requests")
    f.add_argument("--stall-fraction", type=float, default=0.0, metavar="F",
                   help="the origin never answers this fraction of page requests")
    f.add_argument("--seed", type=int, default=None, help="seed of the random faults")
    return p.parse_args(argv)


def build_lab(args: argparse.Namespace) -> Lab:
    per_ip: dict[str, IPRule] = {}
    for ip, rate in args.slow:
        per_ip[ip] = IPRule(rate=rate)
    for ip in args.ban:
        per_ip.setdefault(ip, IPRule()).ban = True
    config = OriginConfig(
        rate=args.rate or None,
        burst=args.burst,
        retry_after=args.retry_after,
        retry_after_mode=args.retry_after_mode,
        origin_rate=args.origin_rate or None,
        origin_burst=args.origin_burst,
        origin_status=args.origin_status,
        rate_schedule=args.rate_change,
        latency=args.latency,
        body_time=args.body_time,
        per_ip=per_ip,
        ratelimit_headers=args.ratelimit_headers,
        capacity=args.capacity or None,
        stall_paths=args.stall,
        stall_times=args.stall_times,
        stall_fraction=args.stall_fraction,
        stall_seed=args.seed,
        status_at=args.status_at,
        announce_policy=args.announce_policy,
        window_limit=args.window_limit or None,
        window=args.window,
        window_reset=args.window_reset,
    )
    proxy_kwargs: dict[int, dict[str, Any]] = {}

    def fault(ip: str, **kwargs: Any) -> None:
        proxy_kwargs.setdefault(_exit_index(ip, args.exits), {}).update(kwargs)

    for ip, status in args.fail:
        fault(ip, fail_status=status)
    for ip, n in args.reset:
        fault(ip, reset_every=n)
    for ip, probability in args.reset_probability:
        # one stream per exit: the same seed must not make them all fail in step
        seed = None if args.seed is None else args.seed + _exit_index(ip, args.exits)
        fault(ip, reset_probability=probability, seed=seed)
    for ip in args.blackhole:
        fault(ip, blackhole=True)
    for ip, capacity in args.proxy_capacity:
        fault(ip, capacity=capacity)
    if args.delay < 0 or args.jitter < 0:
        raise ValueError("--delay and --jitter must be >= 0")
    if args.delay or args.jitter:
        for i in range(args.exits):  # one stream per exit, reproducible by default
            proxy_kwargs.setdefault(i, {}).update(
                delay=args.delay, jitter=args.jitter, delay_seed=(args.seed or 0) + i)
    return Lab(
        args.exits,
        config,
        dead_exits=args.dead,
        proxy_auth=args.proxy_auth,
        proxy_kwargs=proxy_kwargs,
        origin_port=args.port,
        origins=args.origins,
    )


def lab_faults(lab: Lab) -> dict[int, dict[str, Any]]:
    """The faults configured on each live exit, by index (healthy exits left out)."""
    out = {}
    for i, proxy in enumerate(lab.proxies):
        kw = {name: value for name, value in (
            ("fail_status", proxy.fail_status), ("reset_every", proxy.reset_every),
            ("reset_probability", proxy.reset_probability or None),
            ("blackhole", proxy.blackhole or None), ("capacity", proxy.capacity))
            if value is not None}
        if kw:
            out[i] = kw
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    try:
        lab = build_lab(args := parse_args(argv))
    except ValueError as exc:
        logger.error("%s", exc)
        return 2

    from twisted.internet import asyncioreactor
    from twisted.internet.error import ReactorAlreadyInstalledError

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        asyncioreactor.install(loop)
    except ReactorAlreadyInstalledError:
        logger.warning("a reactor is already installed; using it")
    from twisted.internet import reactor

    try:
        lab.start()
    except Exception as exc:  # e.g. CannotListenError for a busy --port
        logger.error("cannot start the lab: %s", exc)
        return 1
    info = {"origin_url": lab.origin_url, "origin_urls": lab.origin_urls,
            "exit_urls": lab.exit_urls, "exit_ips": lab.exit_ips}
    # Announce only once running: the SIGTERM handler is installed by then, so a caller
    # that terminates us right after reading the line still gets a clean shutdown.
    reactor.callWhenRunning(print, json.dumps(info), flush=True)
    cfg = lab.origin.config
    logger.info(
        "origin %s: %s r/s per IP (burst %d), origin limit %s, retry-after %s (%s), "
        "latency %.3fs, body %.3fs; %d exits, %d dead; banned %s; slow %s; %d origin(s); "
        "rate changes %s; forward delay %gs + U(0, %gs)",
        lab.origin_url,
        cfg.rate or "unlimited",
        cfg.burst,
        cfg.origin_rate or "none",
        cfg.retry_after,
        cfg.retry_after_mode,
        cfg.latency,
        cfg.body_time,
        len(lab.proxies),
        lab.dead_exits,
        args.ban or "none",
        dict(args.slow) or "none",
        len(lab.origins),
        cfg.rate_schedule or "none",
        args.delay,
        args.jitter,
    )
    if cfg.status_at or cfg.announce_policy or cfg.window_limit:
        logger.info("signals: answers %s; policy stated %s; fixed window %s",
                    [(a.at, a.status, a.retry_after) for a in cfg.status_at] or "none",
                    cfg.announce_policy or "none",
                    f"{cfg.window_limit} per {cfg.window:g}s (reset as {cfg.window_reset})"
                    if cfg.window_limit else "none")
    faults = {lab.proxies[i].bind_ip: kw for i, kw in sorted(lab_faults(lab).items())}
    if faults or cfg.stall_paths or cfg.stall_fraction:
        logger.info("faults: exits %s; origin stalls %s (times %s), fraction %g",
                    faults or "none", sorted(cfg.stall_paths) or "none",
                    cfg.stall_times or "always", cfg.stall_fraction)
    # The shutdown waits for the Deferred, so ports and connections close before exit.
    reactor.addSystemEventTrigger("before", "shutdown", lab.stop)
    reactor.run()
    logger.info("lab stopped after %d requests", sum(o.total() for o in lab.origins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
