"""The runner reads each worker's output line by line: progress records (JSON) and text.
Under Mininet a worker's stderr shares the pipe, so a warning can land inside a record's
line; the record still counts and the warning is still shown."""

from __future__ import annotations

from hysync.topologies.runner import _split_record

WARNING = "worker 0: key 'model-average' retransmitted 670 times for 57 chunks"


def test_a_record_with_a_warning_glued_to_it_keeps_both() -> None:
    line = '{"worker": 0, "step": 157, "progress": 17.3, "mode": "sync"}' + WARNING + "\n"
    rec, text = _split_record(line)
    assert rec == {"worker": 0, "step": 157, "progress": 17.3, "mode": "sync"}
    assert text == WARNING


def test_text_and_broken_records_are_text() -> None:
    assert _split_record(WARNING + "\n") == (None, WARNING)
    assert _split_record('{"worker": 0, "step"\n') == (None, '{"worker": 0, "step"')
    assert _split_record('{"not": "a record"}\n') == (None, '{"not": "a record"}')
    assert _split_record("\n") == (None, "")


def test_a_done_record_alone() -> None:
    assert _split_record('{"worker": 2, "done": true}\n') == ({"worker": 2, "done": True}, "")
