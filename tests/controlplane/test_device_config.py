"""`hysync pipeline push --target tofino` packs p4c-barefoot's output as Stratum expects.

The expected bytes are checked with a protobuf wire-format reader written here, against
the field numbers and types of Stratum's stratum/hal/lib/barefoot/bf.proto, so the test
does not trust the packer's own message class. The compiler output is a small stand-in
laid out as p4c-barefoot lays it out (`<name>.conf` naming bfrt.json and each pipeline's
context.json and tofino.bin, relative to where the compiler ran).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import grpc
import pytest
from p4.v1 import p4runtime_pb2 as p4r
from p4.v1 import p4runtime_pb2_grpc as p4r_grpc

from hysync.controlplane.cli.main import main
from hysync.controlplane.errors import DeviceConfigError
from hysync.controlplane.p4rt.device_config import pack_tofino, read_device_config
from hysync.controlplane.p4rt.switch import Switch
from tests.controlplane.conftest import P4INFO

BFRT = b'{"schema_version": "1.0.0", "tables": []}'
CONTEXT = b'{"program_name": "hysync", "tables": []}'
BINARY = bytes(range(256)) * 4


def compiler_output(root: Path, *, pipes: list[int] | None = None) -> Path:
    """A p4c-barefoot output directory `root/out` with its .conf; returns the .conf."""
    out = root / "out"
    (out / "pipe").mkdir(parents=True)
    (out / "bfrt.json").write_bytes(BFRT)
    (out / "pipe" / "context.json").write_bytes(CONTEXT)
    (out / "pipe" / "tofino.bin").write_bytes(BINARY)
    conf = {"chip_list": [{"chip_family": "tofino", "instance": 0, "pcie_sysfs_prefix":
                           "/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0"}],
            "p4_devices": [{"device-id": 0, "p4_programs": [{
                "program-name": "hysync", "bfrt-config": "out/bfrt.json",
                "p4_pipelines": [{"p4_pipeline_name": "pipe",
                                  "context": "out/pipe/context.json",
                                  "config": "out/pipe/tofino.bin",
                                  "pipe_scope": pipes if pipes is not None else [0, 1, 2, 3],
                                  "path": "out"}]}]}]}
    path = out / "hysync.conf"
    path.write_text(json.dumps(conf))
    return path


# A protobuf wire-format reader: field number -> list of (wire type, value).
def read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        shift += 7
        if not byte & 0x80:
            return value, i


def fields(data: bytes) -> dict[int, list[tuple[int, object]]]:
    out: dict[int, list[tuple[int, object]]] = {}
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = read_varint(data, i)
            out.setdefault(number, []).append((0, value))
        elif wire_type == 2:
            length, i = read_varint(data, i)
            out.setdefault(number, []).append((2, data[i:i + length]))
            i += length
        else:
            raise AssertionError(f"unexpected wire type {wire_type} for field {number}")
    return out


def packed_uint32(data: bytes) -> list[int]:
    values, i = [], 0
    while i < len(data):
        value, i = read_varint(data, i)
        values.append(value)
    return values


def assert_bf_pipeline_config(data: bytes, pipes: list[int]) -> None:
    """bf.proto: BfPipelineConfig {1 p4_name, 2 bfruntime_info, 3 repeated Profile
    {1 profile_name, 2 context, 3 binary, 4 repeated uint32 pipe_scope}}."""
    top = fields(data)
    assert top[1] == [(2, b"hysync")]
    assert top[2] == [(2, BFRT)]
    assert len(top[3]) == 1 and top[3][0][0] == 2
    profile = fields(top[3][0][1])  # type: ignore[arg-type]
    assert profile[1] == [(2, b"pipe")]
    assert profile[2] == [(2, CONTEXT)]
    assert profile[3] == [(2, BINARY)]
    assert packed_uint32(profile[4][0][1]) == pipes  # type: ignore[arg-type]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)   # the .conf's paths are relative to where the compiler ran
    return tmp_path


def test_tofino_output_packs_into_stratums_bf_pipeline_config(in_tmp):
    assert_bf_pipeline_config(pack_tofino(compiler_output(in_tmp)), [0, 1, 2, 3])


def test_conf_paths_resolve_from_the_conf_directory_too(tmp_path, monkeypatch):
    conf = compiler_output(tmp_path, pipes=[1])
    monkeypatch.chdir(conf.parent)   # "out/bfrt.json" is then found next to the .conf's dir
    data = json.loads(conf.read_text())
    program = data["p4_devices"][0]["p4_programs"][0]
    program["bfrt-config"] = "bfrt.json"
    program["p4_pipelines"][0].update(context="pipe/context.json", config="pipe/tofino.bin")
    conf.write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    assert_bf_pipeline_config(pack_tofino(conf), [1])


def test_bmv2_device_config_is_sent_as_it_is(tmp_path):
    path = tmp_path / "hysync.json"
    path.write_bytes(b'{"program": "hysync.p4"}')
    assert read_device_config(path, "bmv2") == b'{"program": "hysync.p4"}'


@pytest.mark.parametrize("breakage, message", [
    (lambda conf: conf.write_text("not json"), "is not JSON"),
    (lambda conf: (conf.parent / "pipe" / "tofino.bin").unlink(), "cannot read tofino.bin"),
    (lambda conf: conf.write_text(json.dumps({"p4_devices": [{"p4_programs": []}]})),
     "Stratum takes one device with one program"),
    (lambda conf: conf.write_text(json.dumps({"chip_list": []})), "not a p4c-barefoot .conf"),
])
def test_unusable_compiler_output_is_one_line_naming_the_problem(in_tmp, breakage, message):
    conf = compiler_output(in_tmp)
    breakage(conf)
    with pytest.raises(DeviceConfigError, match=message) as err:
        pack_tofino(conf)
    assert "\n" not in str(err.value)


def test_pipeline_push_target_tofino_delivers_the_packed_config(in_tmp, softswitch):
    conf = compiler_output(in_tmp)
    out, errors = io.StringIO(), io.StringIO()
    status = main(["pipeline", "push", "--grpc-addr", softswitch.grpc_addr, "--target",
                   "tofino", "--p4info", str(P4INFO), "--device-config", str(conf)],
                  stdout=out, stderr=errors)
    assert status == 0, errors.getvalue()
    with grpc.insecure_channel(softswitch.grpc_addr) as channel:
        reply = p4r_grpc.P4RuntimeStub(channel).GetForwardingPipelineConfig(
            p4r.GetForwardingPipelineConfigRequest(
                device_id=1, response_type=p4r.GetForwardingPipelineConfigRequest.ALL),
            timeout=5)
    assert_bf_pipeline_config(reply.config.p4_device_config, [0, 1, 2, 3])


def test_pipeline_push_with_a_missing_conf_changes_nothing(in_tmp, softswitch):
    errors = io.StringIO()
    status = main(["pipeline", "push", "--grpc-addr", softswitch.grpc_addr, "--target",
                   "tofino", "--p4info", str(P4INFO), "--device-config",
                   str(in_tmp / "missing.conf")], stdout=io.StringIO(), stderr=errors)
    assert status != 0
    assert "cannot read the p4c-barefoot .conf file" in errors.getvalue()
    assert errors.getvalue().count("\n") == 1
    with Switch(softswitch.grpc_addr, arbitrate=False) as switch:
        assert switch.fetch_schema() is None   # no pipeline was installed
