"""The Prometheus metrics HySync exports, and the `/metrics` endpoint that serves them.

`hysync serve --metrics-addr HOST:PORT` (controlplane/serve/prometheus_collector.py) and `python -m
hysync.softswitch --metrics-addr HOST:PORT` (softswitch/exporter.py) each serve one
registry in the Prometheus text exposition format. Off unless asked for; the address is
the operator's choice (127.0.0.1:PORT keeps it on the host).

`EXPORTED` names every metric family either process can export, with its type: the
Grafana dashboard (docs/grafana/hysync.json) may query only these. Counters are read
from the switch's own counters at scrape time, so a restarted serve continues them.
"""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from hysync import logs

# name (as in the exposition, counters without their _total) -> type
EXPORTED: dict[str, str] = {
    # per job, from the switch's counters (hysync serve)
    "hysync_job_rounds_closed": "counter",
    "hysync_job_members": "gauge",
    "hysync_job_slot_mode": "gauge",
    "hysync_job_slot_mode_value": "gauge",
    "hysync_job_slot_quorum": "gauge",
    "hysync_job_drops": "counter",
    "hysync_worker_contributions": "counter",
    "hysync_worker_late": "counter",
    "hysync_worker_duplicates": "counter",
    "hysync_worker_stale": "counter",
    "hysync_worker_results": "counter",
    "hysync_worker_closes": "counter",
    # per job, from its policy (hysync serve)
    "hysync_member_state": "gauge",
    "hysync_member_host_info": "gauge",
    "hysync_member_slowdown_ratio": "gauge",
    "hysync_policy_decisions": "counter",
    "hysync_policy_skipped_reads": "counter",
    "hysync_policy_last_decision_info": "gauge",
    "hysync_policy_last_decision_timestamp_seconds": "gauge",
    # events logged (hysync serve: swaps, admissions, exclusions, readmissions, resyncs)
    "hysync_events": "counter",
    "hysync_job_mode_swaps": "counter",
    # per switch
    "hysync_switch_drops": "counter",
    "hysync_p4runtime_writes": "counter",
    "hysync_p4runtime_updates": "counter",
    "hysync_p4runtime_write_duration_seconds": "histogram",
    "hysync_dataplane_packets": "counter",
    "hysync_jobs": "gauge",
}

MEMBER_STATES = ("healthy", "slow", "gone", "probation", "excluded")
# Write latencies: a table entry takes well under a millisecond on the softswitch, a big
# batch (a job's install) tens of milliseconds; a Tofino's driver is slower.
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0)


def parse_addr(text: str) -> tuple[str, int]:
    """'HOST:PORT' of --metrics-addr (port 0: any free port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--metrics-addr {text!r} is not HOST:PORT (e.g. 127.0.0.1:9650)")
    return host.strip("[]"), int(port)


class WriteMetrics:
    """P4Runtime writes, their updates and latency; `observe` is the Switch's (client)
    or the softswitch's (server) write hook."""

    def __init__(self, registry: CollectorRegistry, side: str) -> None:
        self.side = side
        self.writes = Counter("hysync_p4runtime_writes", "P4Runtime Write RPCs by result",
                              ["side", "result"], registry=registry)
        self.updates = Counter("hysync_p4runtime_updates", "updates carried by P4Runtime Writes",
                               ["side"], registry=registry)
        self.latency = Histogram("hysync_p4runtime_write_duration_seconds",
                                 "time a P4Runtime Write RPC took", ["side"],
                                 buckets=WRITE_BUCKETS, registry=registry)

    def observe(self, updates: int, seconds: float, ok: bool) -> None:
        self.writes.labels(self.side, "ok" if ok else "error").inc()
        self.updates.labels(self.side).inc(updates)
        self.latency.labels(self.side).observe(seconds)


class EventCounter(logging.Handler):
    """Counts the events logged through hysync.logs.event (every component's): the same
    swaps, exclusions and resyncs the logs show, as counters."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(logging.INFO)
        self.events = Counter("hysync_events", "operator-visible events logged, by name",
                              ["job", "event"], registry=registry)
        self.swaps = Counter("hysync_job_mode_swaps", "mode changes of a job's slots, by who "
                             "made them (policy or operator)", ["job", "by"], registry=registry)

    def emit(self, record: logging.LogRecord) -> None:
        name = getattr(record, "hysync_event", None)
        if name is None:
            return
        job = getattr(record, "hysync_job", None)
        label = "" if job is None else str(job)
        self.events.labels(label, name).inc()
        if name == "mode_swap":
            fields = getattr(record, "hysync_fields", {}) or {}
            self.swaps.labels(label, str(fields.get("by", "policy"))).inc()


class Endpoint:
    """A registry served on /metrics until close()."""

    def __init__(self, registry: CollectorRegistry, addr: str) -> None:
        host, port = parse_addr(addr)
        self.registry = registry
        self._counter = EventCounter(registry)
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except OSError as err:
            raise OSError(f"cannot serve metrics on {addr}: {err.strerror or err}; pick another "
                          "--metrics-addr HOST:PORT") from None
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        hysync_logger = logging.getLogger("hysync")
        self._level = hysync_logger.level
        if hysync_logger.getEffectiveLevel() > logging.INFO:
            hysync_logger.setLevel(logging.INFO)  # the events are INFO: count them
        hysync_logger.addHandler(self._counter)
        bound = self._server.server_address
        self.address = f"{host}:{bound[1]}"
        logs.event(logging.getLogger("hysync.prometheus"), "metrics_listening",
                   f"metrics on http://{self.address}/metrics", address=self.address)

    def close(self) -> None:
        hysync_logger = logging.getLogger("hysync")
        hysync_logger.removeHandler(self._counter)
        hysync_logger.setLevel(self._level)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
