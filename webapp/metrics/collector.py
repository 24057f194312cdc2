"""What /metrics reads at scrape time: rows, Redis and the worker heartbeats."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from webapp import redis_clients
from webapp.metrics import rollup
from webapp.speech import heartbeat, operations
from webapp.speech.models import SynthesisJob
from webapp.speech.runtime import recycling

log = logging.getLogger(__name__)
MIB = 2**20
Metric = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def job_metrics() -> Iterator[Metric]:
    rollup.advance()
    counts = rollup.read()
    submitted = CounterMetricFamily("tts_jobs_submitted", "Synthesis jobs submitted.", labels=["engine"])
    finished = CounterMetricFamily(
        "tts_jobs_finished", "Synthesis jobs finished, by final status.", labels=["engine", "status"]
    )
    charged = CounterMetricFamily("tts_characters_charged", "Characters charged, by plan.", labels=["plan"])
    families = {"submitted": submitted, "finished": finished, "charged": charged}
    for key, value in sorted(counts.items()):
        kind, *labels = key.split(rollup.SEP)
        if kind in families:
            families[kind].add_metric(labels, value)
    yield from families.values()
    yield from _histograms(counts)
    states = GaugeMetricFamily("tts_jobs", "Synthesis job rows in each state.", labels=["status"])
    rows = dict(SynthesisJob.objects.order_by().values_list("status").annotate(Count("id")))
    for status in SynthesisJob.Status.values:
        states.add_metric([status], rows.get(status, 0))
    yield states


def _histograms(counts: dict[str, float]) -> Iterator[Metric]:
    helps = {
        "queue_wait": "Seconds a succeeded job waited from submit to its claim, by engine and device.",
        "synthesis": "Seconds of synthesis of a succeeded job, by engine and device.",
    }
    for name, bounds in rollup.HISTOGRAMS.items():
        family = HistogramMetricFamily(f"tts_job_{name}_seconds", helps[name], labels=["engine", "device"])
        series: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
        for key, value in counts.items():
            kind, *rest = key.split(rollup.SEP)
            if kind == name and len(rest) == 3:
                series[(rest[0], rest[1])][rest[2]] = value
        for (engine, device), per_bucket in sorted(series.items()):
            cumulative, buckets = 0.0, []
            for bound in [*(str(b) for b in bounds), "+Inf"]:
                cumulative += per_bucket.get(bound, 0.0)
                buckets.append((bound, cumulative))
            total = counts.get(rollup.field(name + "_sum", engine, device), 0.0)
            family.add_metric([engine, device], buckets, total)
        yield family


def worker_metrics() -> Iterator[Metric]:
    client = redis_clients.heartbeats()
    beats = [b for b in heartbeat.live_workers() if isinstance(b, dict)]
    depth = GaugeMetricFamily(
        "tts_queue_depth", "Messages waiting in the broker, by queue.", labels=["queue"]
    )
    for queue, n in operations.queue_depths(client, operations.queue_names(beats)).items():
        depth.add_metric([queue], n)
    yield depth
    labels = ["node", "host", "pid"]
    alive = GaugeMetricFamily(
        "tts_worker_children", "Live worker children (heartbeat within its TTL).", labels=["node", "state"]
    )
    rss = GaugeMetricFamily("tts_worker_child_rss_bytes", "Resident memory of a worker child.", labels=labels)
    gpu = GaugeMetricFamily(
        "tts_worker_child_gpu_memory_bytes", "GPU memory a worker child holds.", labels=labels
    )
    load = GaugeMetricFamily(
        "tts_worker_model_load_seconds", "How long the child's model load and warm-up took.", labels=labels
    )
    per_state: dict[tuple[str, str], int] = defaultdict(int)
    for beat in beats:
        node, ids = (
            str(beat.get("node", "")),
            [str(beat.get("node", "")), str(beat.get("host", "")), str(beat.get("pid", ""))],
        )
        per_state[(node, str(beat.get("state", "unknown")))] += 1
        for family, value, scale in (
            (rss, beat.get("rss_mb"), MIB),
            (gpu, beat.get("gpu_mb"), MIB),
            (load, beat.get("load_seconds"), 1),
        ):
            if (number := _num(value)) is not None:
                family.add_metric(ids, number * scale)
    for (node, state), n in sorted(per_state.items()):
        alive.add_metric([node, state], n)
    yield from (alive, rss, gpu, load)
    recycles = CounterMetricFamily(
        "tts_worker_recycles", "Worker child recycles, by node and reason.", labels=["node", "reason"]
    )
    for node in operations.event_nodes(client):
        for reason, n in sorted(recycling.node_stats(client, node)["recycle_reasons"].items()):
            recycles.add_metric([node, reason], n)
    yield recycles


class ServiceCollector(Collector):
    """Reads rows and Redis on every scrape; a part that fails is left out and logged, never a 500."""

    def collect(self) -> Iterator[Metric]:
        for part in (job_metrics, worker_metrics):
            try:
                yield from list(part())
            except Exception as exc:
                log.warning("/metrics: %s failed: %s", part.__name__, exc)
