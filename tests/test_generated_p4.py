"""The generated P4 sources are what their generator writes now (hysync/gen_p4.py).

p4c reads only P4, so wire.p4, decision.p4 and the v1model program's decide.p4 are
committed; a change to hysync/wire.py or hysync/spec/decision.py without
`python -m hysync.gen_p4` fails here.
"""

from __future__ import annotations

import shutil

from hysync import gen_p4
from hysync.spec.decision import ROWS


def test_committed_generated_p4_is_up_to_date():
    assert gen_p4.stale() == [], "run `python -m hysync.gen_p4` and commit what it writes"


def test_a_hand_edit_of_a_generated_file_is_found(tmp_path):
    for path in gen_p4.OUTPUTS:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(gen_p4.ROOT / path, tmp_path / path)
    assert gen_p4.stale(tmp_path) == []
    decide = tmp_path / "p4src/v1model/include/control/decide.p4"
    decide.write_text(decide.read_text().replace("emit_t.CLOSE_AS_IS", "emit_t.NONE"))
    (tmp_path / "p4src/shared/wire.p4").unlink()
    assert gen_p4.stale(tmp_path) == ["p4src/shared/wire.p4",
                                      "p4src/v1model/include/control/decide.p4"]


def test_v1model_table_has_every_row_in_order():
    """One const entry per row but the last, which is the default action, in the spec's
    order (P4 const entries match in the order written, as the rows do)."""
    text = gen_p4.v1model_decide_p4()
    table = text[text.index("const entries = {"):]
    whys = [line.strip()[3:] for line in table.splitlines() if line.strip().startswith("// ")]
    assert whys == [row.why for row in ROWS]
    assert table.count(" :\n") == len(ROWS) - 1
    assert table.index(ROWS[-1].why) < table.index("const default_action")


def test_check_mode_exits_nonzero_and_names_the_stale_file(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gen_p4, "ROOT", tmp_path)
    assert gen_p4.main(["--check"]) == 1
    assert "p4src/shared/wire.p4 is stale" in capsys.readouterr().err
    assert gen_p4.main(["--bogus"]) == 2
