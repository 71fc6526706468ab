"""Prometheus metrics from the telemetry calls."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from scrapy.settings import Settings

from scrapy_exitlimit.core import Event

pytest.importorskip("prometheus_client")

from scrapy_exitlimit.prometheus import PrometheusMetrics  # noqa: E402


def value(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels)


def test_metrics_follow_the_calls():
    m = PrometheusMetrics()
    m.admission("https://a.com", "p1:8000", wait=0.2, rate=5.0, limit=4, in_flight=2)
    m.admission("https://a.com", "p1:8000", wait=0.0, rate=None, limit=None, in_flight=3)
    m.response("https://a.com", "p1:8000", status=429, signal="rate_limited", latency=0.1,
               rate=3.5, limit=4, in_flight=2)
    m.response("https://a.com", "p1:8000", status=None, signal="proxy_fault", latency=None,
               rate=None, limit=2, in_flight=1)
    # a proxy fault as the middleware reports it: no latency, no state to show
    m.response("https://a.com", "p1:8000", status=None, signal="proxy_fault")
    m.events([Event("rate_down", "https://a.com", "p1:8000", "5 -> 3.5")])
    m.close()
    assert value(m, "exitlimit_admitted_total", exit="p1:8000") == 2
    assert value(m, "exitlimit_responses_total", exit="p1:8000", signal="rate_limited") == 1
    assert value(m, "exitlimit_responses_total", exit="p1:8000", signal="proxy_fault") == 2
    assert value(m, "exitlimit_adjustments_total", kind="rate_down") == 1
    assert value(m, "exitlimit_wait_seconds_count") == 2
    assert value(m, "exitlimit_latency_seconds_count", exit="p1:8000") == 1
    assert value(m, "exitlimit_pair_rate", origin="https://a.com", exit="p1:8000") == 3.5
    assert value(m, "exitlimit_exit_limit", exit="p1:8000") == 2
    assert value(m, "exitlimit_in_flight", exit="p1:8000") == 1


def test_from_settings_serves_on_loopback():
    assert PrometheusMetrics.from_settings(Settings()) is None
    with pytest.raises(ValueError, match="EXITLIMIT_PROMETHEUS_PORT"):
        PrometheusMetrics.from_settings(Settings({"EXITLIMIT_PROMETHEUS_PORT": "x"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = PrometheusMetrics.from_settings(Settings({"EXITLIMIT_PROMETHEUS_PORT": port}))
    m.admission("https://a.com", "p1:8000", 0.0, 5.0, 4, 1)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    assert b'exitlimit_admitted_total{exit="p1:8000"} 1.0' in body
    m.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_origin_and_scope_rates_are_gauges_while_they_limit():
    m = PrometheusMetrics()
    m.origin_rate("https://a.com", 19.6)
    m.scope_rate("scope~3f2a9c0d1b7e", 3.9)  # per-scope series are opt-in
    assert value(m, "exitlimit_origin_rate", origin="https://a.com") == 19.6
    assert "exitlimit_scope_rate" not in {metric.name for metric in m.registry.collect()}
    m.origin_rate("https://a.com", None)  # no longer paced as a whole: its series goes
    assert value(m, "exitlimit_origin_rate", origin="https://a.com") is None
    scoped = PrometheusMetrics(per_scope=True)
    scoped.scope_rate("scope~3f2a9c0d1b7e", 3.9)
    assert value(scoped, "exitlimit_scope_rate", scope="scope~3f2a9c0d1b7e") == 3.9
    scoped.scope_rate("scope~3f2a9c0d1b7e", None)
    assert value(scoped, "exitlimit_scope_rate", scope="scope~3f2a9c0d1b7e") is None
