"""The generated v1model decision table (hysync/gen_p4.py) restates the decision table.

Whether the committed P4 sources are what it writes now is tests/test_codegen.py's.
"""

from __future__ import annotations

from hysync import gen_p4
from hysync.protocol_spec.decision import ROWS


def test_v1model_table_has_every_row_in_order():
    """One const entry per row but the last, which is the default action, in the spec's
    order (P4 const entries match in the order written, as the rows do)."""
    text = gen_p4.v1model_decide_p4()
    table = text[text.index("const entries = {"):]
    whys = [line.strip()[3:] for line in table.splitlines() if line.strip().startswith("// ")]
    assert whys == [row.why for row in ROWS]
    assert table.count(" :\n") == len(ROWS) - 1
    assert table.index(ROWS[-1].why) < table.index("const default_action")

