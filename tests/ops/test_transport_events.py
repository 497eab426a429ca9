"""The workers' transport logs a retransmission storm as an event with the stable keys:
the early member of a sync round whose other member comes late keeps retransmitting."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from hysync import logs
from hysync.worker import transport
from tests.worker.conftest import Job, switch  # noqa: F401
from tests.worker.test_failures import BASE, JOB, make_transport


def test_a_call_that_keeps_retransmitting_logs_a_storm(
        switch, caplog: pytest.LogCaptureFixture,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    # While the switch is silent the engine resends one packet per RTO (backing off to
    # rto_max), so a 2 s wait retransmits a few times per chunk, not 16: the event's
    # threshold is lowered so that the test checks the event itself.
    monkeypatch.setattr(transport, "STORM_RETRANSMITS", 5)
    early = make_transport(switch.address[1], worker=0, members=2)
    late = make_transport(switch.address[1], worker=1, members=2)
    try:
        switch.install(Job(JOB, BASE, 4, [(0, *early.address), (1, *late.address)]))
        values = np.ones(256, dtype=np.float32)  # 4 chunks
        with caplog.at_level(logging.INFO, logger="hysync.worker.transport"):
            thread = threading.Thread(target=early.allreduce, args=("g", values))
            thread.start()
            time.sleep(2.0)  # the round waits for the late member: the early one retransmits
            late.allreduce("g", values)
            thread.join(timeout=10)
        storms = [r for r in caplog.records
                  if getattr(r, "hysync_event", None) == "retransmission_storm"]
        assert storms, [r.getMessage() for r in caplog.records]
        line = logs.record_dict(storms[0])
        assert (line["component"], line["job"], line["level"]) == ("worker", JOB, "warning")
        assert line["fields"]["worker"] == 0 and line["fields"]["chunks"] == 4
        assert line["fields"]["retransmits"] >= 5
    finally:
        early.close()
        late.close()
