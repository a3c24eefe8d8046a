"""Prometheus metrics for `GET /metrics`: one registry per app, fed by the core's Telemetry."""

from __future__ import annotations

import functools
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]

LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 45, 90)


class Metrics:
    """Implements core.telemetry.Telemetry, plus what the HTTP layer counts."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.inbound_total = Counter(
            "switchboard_inbound_messages_total",
            "Messages reaching the inbox, by channel and outcome (stored as pending,"
            " duplicate, overflow).",
            ["channel", "outcome"],
            registry=r,
        )
        self.http_total = Counter(
            "switchboard_http_responses_total",
            "HTTP responses by route and status (401/403: refused signatures).",
            ["route", "status"],
            registry=r,
        )
        self.runs_total = Counter(
            "switchboard_runs_total",
            "Runs by agent, channel and outcome.",
            ["agent", "channel", "status"],
            registry=r,
        )
        self.run_seconds = Histogram(
            "switchboard_run_seconds", "Run duration.", buckets=LATENCY, registry=r
        )
        self.model_seconds = Histogram(
            "switchboard_model_call_seconds", "Model call latency.", buckets=LATENCY, registry=r
        )
        self.tokens_total = Counter(
            "switchboard_tokens_total", "Model tokens, by direction.", ["direction"], registry=r
        )
        self.sends_total = Counter(
            "switchboard_sends_total",
            "Reply parts sent, retried or failed, by channel.",
            ["channel", "outcome"],
            registry=r,
        )
        self.rate_limited_total = Counter(
            "switchboard_rate_limited_total",
            "Reply sends the platform answered with 429 (slow down).",
            ["channel"],
            registry=r,
        )

        self.queue_depth = Gauge(
            "switchboard_queue_depth",
            "Messages stored and waiting for (or inside) a run, all replicas (sampled).",
            registry=r,
        )

        # the labelled children, looked up once each (labels() locks and checks every call);
        # the label values are few: channels, agents, outcomes
        self.http = functools.cache(self.http_total.labels)  # (route, status)
        self._inbound = functools.cache(self.inbound_total.labels)
        self._runs = functools.cache(self.runs_total.labels)
        self._tokens = functools.cache(self.tokens_total.labels)
        self._sends = functools.cache(self.sends_total.labels)

    def gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        Gauge(name, doc, registry=self.registry).set_function(read)

    # core.telemetry.Telemetry

    def inbound(self, channel: str, outcome: str) -> None:
        self._inbound(channel, outcome).inc()

    def run_done(
        self, agent: str, channel: str, status: str, seconds: float, tokens_in: int, tokens_out: int
    ) -> None:
        self._runs(agent, channel, status).inc()
        self.run_seconds.observe(seconds)
        self._tokens("input").inc(tokens_in)
        self._tokens("output").inc(tokens_out)

    def model_call(self, seconds: float) -> None:
        self.model_seconds.observe(seconds)

    def send(self, channel: str, outcome: str, *, rate_limited: bool = False) -> None:
        self._sends(channel, outcome).inc()
        if rate_limited:
            self.rate_limited_total.labels(channel).inc()
