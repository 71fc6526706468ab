"""Prometheus metrics fed by the same calls as :class:`~scrapy_exitlimit.telemetry.Telemetry`.

``EXITLIMIT_PROMETHEUS_PORT = 9410`` serves them on ``EXITLIMIT_PROMETHEUS_ADDR``
(default ``127.0.0.1``). Needs ``pip install 'scrapy-exitlimit[prometheus]'``.

Labels are exit ids (never URLs), the origin for the pair rate (a crawl of many
origins makes that gauge as many series as pairs) and for the origin-wide rate (a
series only while an origin-wide rate paces the origin), and scope ids for a scope's
rate, only with ``EXITLIMIT_STATS_PER_SCOPE`` (names, and so ids, may be many).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .config import read_bool, read_setting
from .telemetry import EventLike

PORT_SETTING = "EXITLIMIT_PROMETHEUS_PORT"
ADDR_SETTING = "EXITLIMIT_PROMETHEUS_ADDR"
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise RuntimeError("Prometheus metrics need prometheus_client: "
                           "pip install 'scrapy-exitlimit[prometheus]'") from None
    return prometheus_client


class PrometheusMetrics:
    """Counters, gauges and histograms in ``registry`` (a new one unless given);
    ``per_scope``: a gauge of each named scope's rate as well."""

    def __init__(self, registry: Any = None, *, per_scope: bool = False) -> None:
        pc = _client()
        self._server: Any = None  # the HTTP server from_settings started
        self.registry = registry if registry is not None else pc.CollectorRegistry()
        r = self.registry
        self.admitted = pc.Counter("exitlimit_admitted", "Requests released to the downloader",
                                   ["exit"], registry=r)
        self.responses = pc.Counter("exitlimit_responses", "Answers, by what they meant",
                                    ["exit", "signal"], registry=r)
        self.adjustments = pc.Counter("exitlimit_adjustments", "Limiter adjustments by kind",
                                      ["kind"], registry=r)
        self.wait = pc.Histogram("exitlimit_wait_seconds", "Time requests were parked",
                                 buckets=_BUCKETS, registry=r)
        self.latency = pc.Histogram("exitlimit_latency_seconds", "Admission to answer",
                                    ["exit"], buckets=_BUCKETS, registry=r)
        self.pair_rate = pc.Gauge("exitlimit_pair_rate", "Pacing rate of a pair, r/s",
                                  ["origin", "exit"], registry=r)
        self.limit = pc.Gauge("exitlimit_exit_limit", "Concurrency limit of an exit",
                              ["exit"], registry=r)
        self.in_flight = pc.Gauge("exitlimit_in_flight", "Requests in flight on an exit",
                                  ["exit"], registry=r)
        self.origin_rates = pc.Gauge("exitlimit_origin_rate",
                                     "Rate an origin is paced at as a whole, r/s",
                                     ["origin"], registry=r)
        self.scope_rates = (pc.Gauge("exitlimit_scope_rate", "Rate a named scope is paced at, "
                                     "r/s", ["scope"], registry=r) if per_scope else None)

    @classmethod
    def serve(cls, port: int | None, addr: str, *, per_scope: bool = False
              ) -> PrometheusMetrics | None:
        """None for no port (``ExitLimitConfig.prometheus_port``); else serve the metrics
        there, on ``addr``."""
        if port is None:
            return None
        metrics = cls(per_scope=per_scope)
        try:
            started = _client().start_http_server(port, addr=addr, registry=metrics.registry)
        except OSError as exc:
            raise ValueError(f"{PORT_SETTING} ({port}) cannot be served on {addr}: "
                             f"{exc.strerror or exc}") from None
        # prometheus_client >= 0.20 returns (server, thread): close() can stop it
        metrics._server = started[0] if isinstance(started, tuple) else None
        return metrics

    @classmethod
    def from_settings(cls, settings: Any) -> PrometheusMetrics | None:
        """None unless ``EXITLIMIT_PROMETHEUS_PORT`` is set; then serve the metrics there."""
        return cls.serve(read_setting(settings, PORT_SETTING), read_setting(settings, ADDR_SETTING),
                         per_scope=read_bool(settings, "EXITLIMIT_STATS_PER_SCOPE", False))

    def admission(self, origin: str, exit_id: str, wait: float, rate: float | None,
                  limit: int | None, in_flight: int, scopes: list[str] | None = None) -> None:
        self.admitted.labels(exit_id).inc()
        self.wait.observe(wait)
        self._state(origin, exit_id, rate, limit, in_flight)

    def response(self, origin: str, exit_id: str, *, status: int | None, signal: str | None,
                 latency: float | None = None, rate: float | None = None,
                 limit: int | None = None, in_flight: int | None = None) -> None:
        self.responses.labels(exit_id, signal or "none").inc()
        if latency is not None:
            self.latency.labels(exit_id).observe(latency)
        self._state(origin, exit_id, rate, limit, in_flight)

    def adjustment(self, kind: str, origin: str, exit_id: str | None, detail: str) -> None:
        self.adjustments.labels(kind).inc()

    def events(self, events: Iterable[EventLike]) -> None:
        for ev in events:
            self.adjustment(ev.kind, ev.origin, ev.exit_id, ev.detail)

    def origin_rate(self, origin: str, rate: float | None) -> None:
        _set_or_drop(self.origin_rates, origin, rate)

    def scope_rate(self, scope_id: str, rate: float | None) -> None:
        if self.scope_rates is not None:
            _set_or_drop(self.scope_rates, scope_id, rate)

    def close(self) -> None:
        """Stop serving (if from_settings started the server); the values stay readable."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def _state(self, origin: str, exit_id: str, rate: float | None, limit: int | None,
               in_flight: int | None) -> None:
        if rate is not None:
            self.pair_rate.labels(origin, exit_id).set(rate)
        if limit is not None:
            self.limit.labels(exit_id).set(limit)
        if in_flight is not None:
            self.in_flight.labels(exit_id).set(in_flight)


def _set_or_drop(gauge: Any, label: str, rate: float | None) -> None:
    """A rate that no longer limits drops its series: the gauge holds the keys limited now."""
    if rate is None:
        gauge.remove(label)
    else:
        gauge.labels(label).set(rate)
