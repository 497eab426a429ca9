"""`--log-format json`: one JSON object per line with the stable keys, from a real `hysync
serve` process (an admission, a swap, an exclusion, a readmission, the policy's resync)
and from the formatter itself."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hysync import logs
from hysync.controlplane.serve.client import ServeClient
from hysync.controlplane.testbed.inventory import Inventory
from tests.controlplane.conftest import ROOT, free_udp_socket

KEYS = {"time", "level", "component", "job", "event", "fields"}


def test_a_json_line_has_the_stable_keys_and_text_has_a_timestamp() -> None:
    stream = io.StringIO()
    handler = logs.setup("json", stream=stream)
    try:
        logs.event(logging.getLogger("hysync.controlplane.serve.server"), "mode_swap",
                   "job 3: sync -> async", job=3, mode="async", by="operator")
        logging.getLogger("hysync.softswitch.server").warning("plain %s", "text")
        handler.setFormatter(logs.formatter("text"))
        logs.event(logging.getLogger("hysync.worker.transport"), "resync", "worker 1 resynced",
                   job=2, worker=1)
    finally:
        logging.getLogger().removeHandler(handler)
    first, second, text = stream.getvalue().splitlines()
    swap, plain = json.loads(first), json.loads(second)
    assert set(swap) >= KEYS and set(plain) >= KEYS
    assert (swap["component"], swap["job"], swap["event"], swap["level"]) == (
        "serve", 3, "mode_swap", "info")
    assert swap["fields"] == {"mode": "async", "by": "operator"}
    assert swap["time"].endswith("Z") and swap["time"][4] == "-"
    assert (plain["component"], plain["job"], plain["event"], plain["fields"]) == (
        "softswitch", None, "message", {})
    assert text[:4].isdigit() and " info worker: worker 1 resynced [resync]" in text


def test_serve_logs_its_events_as_json_lines(deployed: Inventory) -> None:
    socks = [free_udp_socket() for _ in range(3)]
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "hysync"), "serve", str(deployed.path),
         "--log-format", "json", "--policy-interval", "0.2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("serving "), (line, proc.stderr.read())  # type: ignore[union-attr]
        bound = re.search(r"requests on (127\.0\.0\.1:\d+)", line)  # serve.listen's port 0
        assert bound, line
        with ServeClient(bound[1]) as client:
            members = [{"worker": w, "host": f"h{w + 1}", "udp_port": s.getsockname()[1]}
                       for w, s in enumerate(socks)]
            job = client.request({"op": "admit", "members": members})["jobs"][0]["job_id"]
            client.request({"op": "mode_set", "job": job, "mode": "async"})
            client.request({"op": "exclude", "job": job, "worker": 2})
            client.request({"op": "readmit", "job": job, "worker": 2})
            client.request({"op": "policy_resume", "job": job})  # the policy finds async
            client.request({"op": "release"})
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
        for s in socks:
            s.close()
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert lines and all(set(line) >= KEYS for line in lines), err
    events = {(line["component"], line["event"]) for line in lines}
    assert {("serve", "admission"), ("serve", "mode_swap"), ("serve", "exclusion"),
            ("serve", "readmission"), ("serve", "job_removed"),
            ("serve", "policy_resumed"), ("policy", "policy_resync")} <= events, events
    swap = next(line for line in lines if line["event"] == "mode_swap")
    assert swap["job"] == job and swap["fields"]["mode"] == "async"
    assert swap["fields"]["by"] == "operator"


def test_a_training_process_logs_as_hysync_log_format_asks(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("HYSYNC_LOG_FORMAT", raising=False)
    assert logs.from_environment() is None  # a script's own logging is left alone
    monkeypatch.setenv("HYSYNC_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="HYSYNC_LOG_FORMAT='yaml'.* one of text, json"):
        logs.from_environment()
    monkeypatch.setenv("HYSYNC_LOG_FORMAT", "json")
    monkeypatch.setenv("HYSYNC_LOG_LEVEL", "warning")
    handler = logs.from_environment()
    assert handler is not None
    try:
        stream = io.StringIO()
        handler.setStream(stream)  # type: ignore[attr-defined]
        log = logging.getLogger("hysync.worker.transport")
        logs.event(log, "resync", "ignored at info", job=1)
        logs.event(log, "retransmission_storm", "storm", job=1, level=logging.WARNING)
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(logging.WARNING)
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line)["event"] == "retransmission_storm"
