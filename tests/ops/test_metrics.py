"""/metrics of `hysync serve` and of the softswitch, scraped while a real job runs: the
values move with the job, a swap shows, and every family is one hysync/prometheus.py names."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import pytest

from hysync import wire
from hysync.controlplane.serve.client import ServeClient
from hysync.controlplane.serve.prometheus_collector import serve_metrics
from hysync.prometheus import EXPORTED
from tests.controlplane.conftest import Softswitch

from .conftest import hysync, scrape, value


def wait_until(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def base(name: str) -> str:
    for suffix in ("_total", "_created", "_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name[: -len(suffix)] in EXPORTED:
            return name[: -len(suffix)]
    return name


def test_serve_metrics_follow_a_running_job_and_show_a_swap(
        deployed, serve, workers, softswitch: Softswitch) -> None:  # type: ignore[no-untyped-def]
    server = serve(policy="adaptive", policy_interval=0.2)
    endpoint = serve_metrics(server, "127.0.0.1:0")
    try:
        team = workers(3)
        client = ServeClient(server.address)
        job = client.request({"op": "admit", "members": team.members(), "name": "metrics"})
        job_id, base_slot = job["jobs"][0]["job_id"], job["jobs"][0]["slot_base"]
        slots = range(base_slot, base_slot + 8)
        first = scrape(endpoint.address)
        assert value(first, "hysync_jobs") == 1
        assert value(first, "hysync_job_slot_mode", job=str(job_id), mode="sync") == 1
        assert value(first, "hysync_p4runtime_writes_total", result="ok") >= 1  # the admission
        assert value(first, "hysync_p4runtime_write_duration_seconds_count") >= 1
        assert value(first, "hysync_events_total", event="admission") == 1

        team.start(job_id, slots, softswitch.udp_addr)
        wait_until(lambda: value(scrape(endpoint.address), "hysync_job_rounds_closed_total",
                                 job=str(job_id)) >= 20)
        then = scrape(endpoint.address)
        time.sleep(1.0)
        now = scrape(endpoint.address)
        for name in ("hysync_job_rounds_closed_total",):
            assert value(now, name, job=str(job_id)) > value(then, name, job=str(job_id))
        for w in range(3):
            labels = {"job": str(job_id), "worker": str(w)}
            assert (value(now, "hysync_worker_contributions_total", **labels)
                    > value(then, "hysync_worker_contributions_total", **labels))
            assert value(now, "hysync_member_state", state="excluded", **labels) == 0
            assert value(now, "hysync_worker_stale_total", **labels) >= 0
        assert value(now, "hysync_job_members", job=str(job_id), state="excluded") == 0

        # The operator swaps the job to partial(2) through serve: the mode, the swap count
        # and the event show it.
        swaps = ("hysync_job_mode_swaps_total", frozenset({("job", str(job_id)),
                                                           ("by", "operator")}))
        assert now.get(swaps, 0) == 0
        client.request({"op": "mode_set", "job": job_id, "mode": "partial", "quorum": 2})
        after = scrape(endpoint.address)
        assert value(after, "hysync_job_slot_mode", job=str(job_id), mode="partial") == 1
        assert value(after, "hysync_job_slot_mode", job=str(job_id), mode="sync") == 0
        assert value(after, "hysync_job_slot_mode_value", job=str(job_id)) == 1
        assert value(after, "hysync_job_slot_quorum", job=str(job_id)) == 2
        assert value(after, "hysync_job_mode_swaps_total", job=str(job_id), by="operator") == 1
        wait_until(lambda: value(scrape(endpoint.address), "hysync_job_rounds_closed_total",
                                 job=str(job_id)) > value(after, "hysync_job_rounds_closed_total",
                                                          job=str(job_id)) + 10)
        # The operator's mode holds until the operator hands the job back to the policy.
        # Every member is healthy: once its dwell is over the policy swaps back to sync, and
        # its decision shows with its reason.
        assert scrape(endpoint.address).get(("hysync_job_mode_swaps_total", frozenset(
            {("job", str(job_id)), ("by", "policy")})), 0) == 0
        client.request({"op": "policy_resume", "job": job_id})
        policy_swaps = ("hysync_job_mode_swaps_total", frozenset({("job", str(job_id)),
                                                                  ("by", "policy")}))
        wait_until(lambda: scrape(endpoint.address).get(policy_swaps, 0) >= 1)
        back = scrape(endpoint.address)
        assert value(back, "hysync_job_slot_mode", job=str(job_id), mode="sync") == 1
        assert value(back, "hysync_policy_decisions_total", job=str(job_id),
                     action="set_mode") >= 1
        (decision,) = [dict(labels) for (name, labels), v in back.items()
                       if name == "hysync_policy_last_decision_info" and v == 1]
        assert decision["action"] == "set_mode" and decision["mode"] == "sync"
        assert "healthy" in decision["reason"]
        assert value(back, "hysync_policy_last_decision_timestamp_seconds",
                     job=str(job_id)) == pytest.approx(time.time(), abs=60)
        for name, _ in after:
            assert base(name) in EXPORTED, f"{name} is exported but not in EXPORTED"
        client.close()
    finally:
        endpoint.close()


def test_the_softswitch_serves_its_own_metrics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Every port 0: the switch binds what is free and says where in its first line.
    proc = subprocess.Popen(
        [sys.executable, "-m", "hysync.softswitch", "--grpc-addr", "127.0.0.1:0",
         "--udp", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
         "--log-format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"data plane UDP 127\.0\.0\.1:(\d+) .*metrics on "
                          r"http://(127\.0\.0\.1:\d+)/metrics", line)
        assert found, line
        udp, metrics = int(found[1]), found[2]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"\x00" * 8, ("127.0.0.1", udp))  # malformed: dropped and counted
            s.sendto(wire.Packet(wire.Header(op=wire.Op.CONTRIB, job_id=9, worker_id=0, slot=0,
                                             round=0, chunk=0)).encode(), ("127.0.0.1", udp))
        wait_until(lambda: value(scrape(metrics), "hysync_dataplane_packets_total",
                                 direction="in") >= 2, timeout=15)
        samples = scrape(metrics)
        assert value(samples, "hysync_switch_drops_total") >= 1
        for name, _ in samples:
            assert base(name) in EXPORTED or name.startswith(("python_", "process_")), name
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    lines = [json.loads(line) for line in err.splitlines()]  # --log-format json
    assert lines and all({"time", "level", "component", "event", "fields"} <= set(line)
                         for line in lines)
    assert {line["component"] for line in lines} == {"softswitch", "metrics"}
    assert any(line["event"] == "metrics_listening" for line in lines)


def test_a_taken_metrics_address_is_one_line_and_lets_the_switch_go(deployed, serve) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        code, out, err = hysync("serve", str(deployed.path), "--metrics-addr", addr)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and f"cannot serve metrics on {addr}" in err
    assert "pick another --metrics-addr HOST:PORT" in err
    serve(policy=None)  # the failed serve let the switch go: another one is its primary
    code, out, err = hysync("serve", str(deployed.path), "--metrics-addr", "nowhere")
    assert (code, out) == (2, "") and "'nowhere' is not HOST:PORT" in err
