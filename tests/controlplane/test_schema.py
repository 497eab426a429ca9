"""The P4Info-backed schema, against the recorded P4Info, with no switch."""

from __future__ import annotations

import pytest

from hysync import p4names
from hysync.controlplane.errors import SchemaError
from hysync.p4schema import Schema

from .conftest import P4INFO


def test_every_name_of_the_protocol_contract_resolves(schema: Schema) -> None:
    members = schema.table(p4names.ADMISSION_MEMBERS)
    assert [(f.name, f.bitwidth, f.kind) for f in members.match_fields] == [
        ("job_id", 16, "exact"), ("worker_id", 8, "exact"), ("src_addr", 32, "exact"),
        ("src_port", 16, "exact")]
    modes = schema.table(p4names.SYNC_MODE_MODES)
    assert modes.needs_priority and modes.match_field("slot").kind == "range"
    set_job = schema.action(p4names.ADMISSION_SET_JOB)
    assert [(p.name, p.bitwidth) for p in set_job.params] == [
        ("slot_base", 16), ("slot_count", 16), ("members", 8), ("mcast_grp", 16),
        ("epoch", 32)]
    assert schema.action(p4names.FORWARDING_SET_EGRESS_PORT).param("port").bitwidth == 9
    for name in ("contributions", "late", "duplicates", "stale"):
        assert schema.counter(f"HySyncIngress.stats.{name}").size == 8192
    assert schema.counter(p4names.STATS_DROPS).size == 4096
    assert schema.counter(p4names.REPLICATION_RESULTS).unit == "BOTH"


def test_ids_map_back_to_the_same_entities(schema: Schema) -> None:
    for table in schema.tables:
        assert schema.table_by_id(table.id) is table
        for field in table.match_fields:
            assert table.match_field_by_id(field.id) is field
    for counter in schema.counters:
        assert schema.counter_by_id(counter.id) is counter


def test_an_unambiguous_alias_finds_the_full_name(schema: Schema) -> None:
    assert schema.table("members").name == p4names.ADMISSION_MEMBERS
    assert schema.counter("drops").name == p4names.STATS_DROPS


@pytest.mark.parametrize(("lookup", "name", "suggestion"), [
    ("table", "HySyncIngress.admission.member", p4names.ADMISSION_MEMBERS),
    ("table", "Ingress.sync_mode.modes", p4names.SYNC_MODE_MODES),
    ("action", "HySyncIngress.admission.set_jobs", p4names.ADMISSION_SET_JOB),
    ("counter", "HySyncIngress.stats.contribution", p4names.STATS_CONTRIBUTIONS),
])
def test_an_unknown_name_fails_listing_close_names(schema: Schema, lookup: str, name: str,
                                                   suggestion: str) -> None:
    with pytest.raises(SchemaError) as err:
        getattr(schema, lookup)(name)
    assert name in str(err.value) and suggestion in str(err.value)


def test_an_unknown_match_field_or_param_names_the_table_or_action(schema: Schema) -> None:
    with pytest.raises(SchemaError, match="match field of table HySyncIngress.admission.jobs.*"
                                          "job_id"):
        schema.table(p4names.ADMISSION_JOBS).match_field("job")
    with pytest.raises(SchemaError, match="did you mean 'quorum'"):
        schema.action(p4names.SYNC_MODE_SET_MODE).param("quorom")


def test_a_missing_p4info_file_says_what_to_pass(tmp_path) -> None:
    with pytest.raises(SchemaError, match="cannot read the P4Info file .*hysync.p4info.txtpb"):
        Schema.from_file(tmp_path / "nope.txtpb")


def test_a_file_that_is_not_p4info_is_refused(tmp_path) -> None:
    bad = tmp_path / "bad.txtpb"
    bad.write_text("this is { not a P4Info")
    with pytest.raises(SchemaError, match="not a text-format P4Info"):
        Schema.from_file(bad)
    empty = tmp_path / "empty.txtpb"
    empty.write_text("")
    with pytest.raises(SchemaError, match="defines no tables"):
        Schema.from_file(empty)


def test_loading_is_repeatable() -> None:
    a, b = Schema.from_file(P4INFO), Schema.from_file(P4INFO)
    assert a.p4info == b.p4info
