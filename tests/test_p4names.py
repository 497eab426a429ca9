"""hysync/p4names.py is what `python -m hysync.gen_p4names` makes of the committed P4Info."""

from __future__ import annotations

import pytest

from hysync import gen_p4names, p4names


def test_generated_names_are_not_stale() -> None:
    expected = gen_p4names.generate(gen_p4names.load(),
                                    str(gen_p4names.P4INFO.relative_to(gen_p4names.REPO)))
    assert gen_p4names.OUTPUT.read_text() == expected, (
        "hysync/p4names.py is stale: run `python -m hysync.gen_p4names` and commit it")


def test_check_flag_reports_a_stale_file(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen_p4names.main(["--check"]) == 0
    p4info = gen_p4names.load()
    p4info.tables[0].size += 1
    monkeypatch.setattr(gen_p4names, "load", lambda: p4info)
    assert gen_p4names.main(["--check"]) == 1
    assert "hysync/p4names.py is stale" in capsys.readouterr().err


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
