"""hysync/p4names.py's constants follow the committed P4Info (its staleness: test_codegen.py)."""

from __future__ import annotations

import pytest

from hysync import gen_p4names, p4names


def test_constants_follow_the_p4info() -> None:
    p4info = gen_p4names.load()
    for table in p4info.tables:
        const = gen_p4names.constant(table.preamble.name)
        assert getattr(p4names, const) == table.preamble.name
        assert getattr(p4names, f"{const}_ID") == table.preamble.id
        assert [k[0] for k in p4names.TABLE_KEYS[table.preamble.name]] == [
            f.name for f in table.match_fields]
    assert p4names.ADMISSION_MEMBERS == "HySyncIngress.admission.members"
    assert p4names.NO_ACTION == "NoAction"


def test_two_names_making_one_constant_are_refused() -> None:
    p4info = gen_p4names.load()
    p4info.counters[0].preamble.name = "HySyncEgress.admission.members"
    with pytest.raises(ValueError, match="both make the constant ADMISSION_MEMBERS"):
        gen_p4names.generate(p4info, "test")
