"""The compiled core speaks hysync/wire.py's format: its header is generated from wire.py at
build time; these tests catch a stale build (wire.py changed, `pip install -e .` not rerun)."""

from hysync import _core, gen_wire_header, wire


def test_the_compiled_constants_are_wire_py_s():
    for name, value in _core.wire.constants.items():
        assert getattr(wire, name) == value, f"{name}: core {value}, wire.py {getattr(wire, name)}"


def test_the_compiled_header_offsets_are_wire_py_s():
    expected = [(name, offset) for name, offset, _ in gen_wire_header.field_offsets()]
    assert list(map(tuple, _core.wire.header_offsets)) == expected


def test_the_generated_header_has_every_enum_member_and_field():
    text = gen_wire_header.render()
    for enum_type in (wire.Op, wire.Mode, wire.Flag, wire.DropReason, wire.ResyncReason):
        for name, member in enum_type.__members__.items():
            assert f"  {name} = {int(member.value)}," in text
    for name, _ in wire.HEADER_FIELDS:
        assert f"OFF_{name.upper()} =" in text
