"""Telemetry: one JSON object per line for every admission, answer, adjustment and rate
change.

``EXITLIMIT_TELEMETRY = "crawl.jsonl"`` turns it on. Every record has ``t`` (wall
time, unix seconds, ms precision) and ``ev`` (``admit`` / ``response`` / ``adjust`` /
``rates``); all but ``rates`` have ``origin`` and ``exit`` (the exit *id*: never a
proxy URL), plus their own fields::

    {"t":1718000000.123,"ev":"admit","origin":"https://a.com","exit":"p1:8000","wait":0.2,
     "rate":5,"limit":4,"in_flight":2}
    {"t":1718000000.456,"ev":"response","origin":"https://a.com","exit":"p1:8000",
     "status":429,"signal":"rate_limited","latency":0.333,"rate":5,"limit":4,"in_flight":1}
    {"t":1718000000.457,"ev":"adjust","origin":"https://a.com","exit":"p1:8000",
     "kind":"rate_down","detail":"5 -> 3.5 r/s"}
    {"t":1718000001.000,"ev":"rates","origin":"https://a.com","origin_rate":19.6}
    {"t":1718000001.000,"ev":"rates","scope":"scope~3f2a9c0d1b7e","scope_rate":3.9}

A ``rates`` record says an origin-wide rate (the origin paced as a whole) or a named
scope's rate changed (the middleware looks once a second, never per admission);
``null`` when it no longer limits. Scopes appear by id only: names may be secrets.

It sits on the hot path (hundreds of calls a second), so records are formatted
with ``%`` from pre-escaped strings rather than ``json.dumps``, and written
through a large buffer flushed at most every ``flush_interval`` seconds and at
close. ``python -m scrapy_exitlimit.report FILE`` reads it back.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Protocol

from .config import read_setting

SETTING = "EXITLIMIT_TELEMETRY"
#: the record kinds, as written in ``ev``
ADMIT, RESPONSE, ADJUST, RATES = "admit", "response", "adjust", "rates"
FLUSH_INTERVAL = 1.0
_BUFFER = 1 << 16
# pre-escaped strings: origins and exit ids are few, but bound the cache anyway
_QUOTE_CACHE_MAX = 4096

_ADMIT = ('{"t":%.3f,"ev":"admit","origin":%s,"exit":%s,"wait":%s,"rate":%s,"limit":%s,'
          '"in_flight":%s}\n')
_RESPONSE = ('{"t":%.3f,"ev":"response","origin":%s,"exit":%s,"status":%s,"signal":%s,'
             '"latency":%s,"rate":%s,"limit":%s,"in_flight":%s}\n')
_ADJUST = '{"t":%.3f,"ev":"adjust","origin":%s,"exit":%s,"kind":%s,"detail":%s}\n'
_ORIGIN_RATE = '{"t":%.3f,"ev":"rates","origin":%s,"origin_rate":%s}\n'
_SCOPE_RATE = '{"t":%.3f,"ev":"rates","scope":%s,"scope_rate":%s}\n'


class EventLike(Protocol):
    """What the limiter's ``Event`` offers."""

    kind: str
    origin: str
    exit_id: str | None
    detail: str


def _num(value: float | int | None) -> str:
    """A JSON number: ``null`` for None, NaN and infinities (JSON has none of them)."""
    if value is None:
        return "null"
    if isinstance(value, int):  # bool included: JSON would want true/false, we want 1/0
        return str(int(value))
    if not math.isfinite(value):
        return "null"
    return format(value, ".6g")


class Telemetry:
    """Writes telemetry records to ``path`` (truncated when opened).

    ``clock`` gives wall time in unix seconds (inject a fake one in tests).
    Call :meth:`close` when the crawl ends; records not yet flushed are lost
    only if the process dies first.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time,
                 flush_interval: float = FLUSH_INTERVAL) -> None:
        self.path = Path(path)
        self.clock = clock
        self.flush_interval = flush_interval
        self._file: IO[str] | None = open(  # noqa: SIM115 - closed in close()
            self.path, "w", encoding="utf-8", buffering=_BUFFER)
        self._flushed_at = clock()
        self._quoted: dict[str | None, str] = {None: "null"}
        self.records = 0

    @classmethod
    def open(cls, path: Path | None, **kwargs: Any) -> Telemetry | None:
        """A telemetry file at ``path`` (``ExitLimitConfig.telemetry``), None for None;
        ValueError naming the setting when it cannot be written."""
        if path is None:
            return None
        try:
            return cls(path, **kwargs)
        except OSError as exc:
            raise ValueError(f"{SETTING} ({str(path)!r}) cannot be written: "
                             f"{exc.strerror or exc}") from None

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> Telemetry | None:
        """None when ``EXITLIMIT_TELEMETRY`` is unset or empty; ValueError for a bad path."""
        return cls.open(read_setting(settings, SETTING), **kwargs)

    def __repr__(self) -> str:
        state = "closed" if self._file is None else f"{self.records} records"
        return f"<Telemetry {str(self.path)!r} {state}>"

    @property
    def closed(self) -> bool:
        return self._file is None

    # -- records -----------------------------------------------------------
    def admission(self, origin: str, exit_id: str, wait: float, rate: float | None,
                  limit: int | None, in_flight: int, scopes: list[str] | None = None) -> None:
        """A request was released to the downloader through ``exit_id``.

        ``wait``: seconds it was parked; ``rate``: the pair's pacing rate (r/s,
        None = unlimited); ``limit``: the exit's concurrency limit; ``in_flight``:
        requests on the exit counting this one; ``scopes``: ids of the named scopes
        whose tokens it took.
        """
        t = self.clock()
        q = self._quote
        line = _ADMIT % (t, q(origin), q(exit_id), _num(wait), _num(rate), _num(limit),
                         _num(in_flight))
        if scopes:
            line = f'{line[:-2]},"scopes":[{",".join(q(s) for s in scopes)}]}}\n'
        self._write(line, t)

    def response(self, origin: str, exit_id: str, *, status: int | None, signal: str | None,
                 latency: float | None = None, rate: float | None = None,
                 limit: int | None = None, in_flight: int | None = None) -> None:
        """An answer came back (``status`` None for a download error), and what it meant
        (``signal``, e.g. ``"ok"``, ``"rate_limited"``); ``latency`` in seconds since
        admission; ``rate``/``limit``/``in_flight`` as after the answer was taken in."""
        t = self.clock()
        q = self._quote
        self._write(_RESPONSE % (t, q(origin), q(exit_id), _num(status), q(signal),
                                 _num(latency), _num(rate), _num(limit), _num(in_flight)), t)

    def adjustment(self, kind: str, origin: str, exit_id: str | None, detail: str) -> None:
        """The limiter changed something (``kind`` as in its Event: ``rate_down``,
        ``breaker_open``, ``evicted`` ...); ``exit_id`` None for an origin-wide change."""
        t = self.clock()
        q = self._quote
        self._write(_ADJUST % (t, q(origin), q(exit_id), q(kind), json.dumps(detail)), t)

    def events(self, events: Iterable[EventLike]) -> None:
        """:meth:`adjustment` for each of the limiter's ``Event`` objects."""
        for ev in events:
            self.adjustment(ev.kind, ev.origin, ev.exit_id, ev.detail)

    def origin_rate(self, origin: str, rate: float | None) -> None:
        """The rate ``origin`` is paced at as a whole changed (None: no longer paced)."""
        t = self.clock()
        self._write(_ORIGIN_RATE % (t, self._quote(origin), _num(rate)), t)

    def scope_rate(self, scope_id: str, rate: float | None) -> None:
        """The rate of the named scope ``scope_id`` changed (None: no longer limited)."""
        t = self.clock()
        self._write(_SCOPE_RATE % (t, self._quote(scope_id), _num(rate)), t)

    # -- file --------------------------------------------------------------
    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._flushed_at = self.clock()

    def close(self) -> None:
        """Flush and close; later records are dropped silently (the crawl is over)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, line: str, t: float) -> None:
        f = self._file
        if f is None:
            return
        f.write(line)
        self.records += 1
        if t - self._flushed_at >= self.flush_interval:
            f.flush()
            self._flushed_at = t

    def _quote(self, value: str | None) -> str:
        quoted = self._quoted.get(value)
        if quoted is None:
            quoted = json.dumps(value)
            if len(self._quoted) >= _QUOTE_CACHE_MAX:
                self._quoted = {None: "null"}
            self._quoted[value] = quoted
        return quoted
