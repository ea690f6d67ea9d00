"""Prometheus metrics in the text exposition format, kept by hand (a few counters, a gauge and
histograms need no client library). Each worker process keeps its own; see README."""

from __future__ import annotations

import bisect
from collections import defaultdict

PREFIX = "tformer_serve"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class Counter:
    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = f"{PREFIX}_{name}", help
        self.values: dict[tuple, float] = defaultdict(float)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] += amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        values = self.values or {(): 0.0}
        lines += [f"{self.name}{_labels(dict(k))} {v:g}" for k, v in sorted(values.items())]
        return lines


class Gauge:
    def __init__(self, name: str, help: str) -> None:
        self.name, self.help, self.value = f"{PREFIX}_{name}", help, 0.0

    def set(self, value: float) -> None:
        self.value = value

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge", f"{self.name} {self.value:g}"]


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = f"{PREFIX}_{name}", help, buckets
        self.series: dict[tuple, list] = {}  # labels -> [counts per bucket (+Inf last), sum]

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        counts, total = self.series.get(key, ([0] * (len(self.buckets) + 1), 0.0))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self.series[key] = (counts, total + value)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for key, (counts, total) in sorted(self.series.items()):
            labels, cumulative = dict(key), 0
            bounds = [f"{b:g}" for b in self.buckets] + ["+Inf"]
            for bound, count in zip(bounds, counts, strict=True):
                cumulative += count
                lines.append(f"{self.name}_bucket{_labels({**labels, 'le': bound})} {cumulative}")
            lines.append(f"{self.name}_sum{_labels(labels)} {total:g}")
            lines.append(f"{self.name}_count{_labels(labels)} {cumulative}")
        return lines


class Metrics:
    """Everything /metrics shows."""

    def __init__(self) -> None:
        self.requests = Counter("requests_total", "HTTP requests answered, by endpoint and status code")
        self.inputs = Counter("inputs_total", "input texts answered, by endpoint")
        self.truncated = Counter("truncated_inputs_total", "input texts cut to the token limit")
        self.rejected = Counter("queue_rejections_total", "requests refused with 503: the queue was full")
        self.disconnected = Counter("client_disconnects_total", "requests whose client went away first")
        self.latency = Histogram("request_duration_seconds", "time from request to answer, by endpoint",
                                 LATENCY_BUCKETS)
        self.batch_size = Histogram("batch_size", "input texts per model batch", SIZE_BUCKETS)
        self.batch_tokens = Histogram("batch_tokens", "real tokens per model batch", TOKEN_BUCKETS)
        self.batch_seconds = Histogram("batch_duration_seconds", "model time per batch", LATENCY_BUCKETS)
        self.queue_depth = Gauge("queue_depth", "input texts waiting or running")

    def observe_batch(self, size: int, tokens: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)

    def render(self) -> str:
        parts = (self.requests, self.inputs, self.truncated, self.rejected, self.disconnected, self.latency,
                 self.batch_size, self.batch_tokens, self.batch_seconds, self.queue_depth)
        return "\n".join(line for metric in parts for line in metric.render()) + "\n"
