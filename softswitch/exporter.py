"""`python -m hysync.softswitch --metrics-addr HOST:PORT`: the switch's own metrics, for a
softswitch run without `hysync serve` (or beside it): drops by reason, the data plane's
packets, and the P4Runtime writes it served with their latency. Names: hysync/prometheus.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from hysync import p4names
from hysync.prometheus import Endpoint, WriteMetrics
from hysync.softswitch.pipeline import Pipeline
from hysync.wire import DropReason


class DataPlane(Protocol):
    @property
    def packets_in(self) -> int: ...

    @property
    def packets_out(self) -> int: ...


class SoftswitchCollector(Collector):
    def __init__(self, pipeline: Pipeline, dataplane: DataPlane) -> None:
        self.pipeline, self.dataplane = pipeline, dataplane

    def collect(self) -> Iterator[Metric]:
        drops = CounterMetricFamily("hysync_switch_drops", "packets the switch dropped, by reason",
                                    labels=["reason"])
        cells = self.pipeline.counters[p4names.STATS_SWITCH_DROPS].packets
        for r in DropReason:
            drops.add_metric([r.name.lower()], cells[int(r)])
        packets = CounterMetricFamily("hysync_dataplane_packets", "packets the data plane "
                                      "received (in) and sent (out)", labels=["direction"])
        packets.add_metric(["in"], self.dataplane.packets_in)
        packets.add_metric(["out"], self.dataplane.packets_out)
        yield drops
        yield packets


def registry_for(pipeline: Pipeline, dataplane: DataPlane) -> tuple[CollectorRegistry,
                                                                    WriteMetrics]:
    """The softswitch's registry, and the write hook to give its P4Runtime server."""
    registry = CollectorRegistry()
    registry.register(SoftswitchCollector(pipeline, dataplane))
    return registry, WriteMetrics(registry, "switch")


def serve_metrics(registry: CollectorRegistry, addr: str) -> Endpoint:
    return Endpoint(registry, addr)
