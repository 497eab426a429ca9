"""The `p4_device_config` of a SetForwardingPipelineConfig request, per target.

* `bmv2`: the JSON that `make p4` writes (build/p4/hysync.json), sent as it is.
* `tofino`: Stratum's `BfPipelineConfig` (stratum/hal/lib/barefoot/bf.proto), the format
  that stratum-bf and stratum-bfrt take over P4Runtime (Stratum's
  stratum/hal/bin/barefoot/README.pipeline.md). It is assembled here from the `.conf` file
  that p4c-barefoot writes next to its output, the way Stratum's own
  stratum/hal/bin/barefoot/bf_pipeline_builder.cc does: `p4_name` is the program name,
  `bfruntime_info` the bfrt.json, and one profile per compiled pipeline with its name,
  context.json, tofino.bin and pipe scope.

The message class is built from a descriptor written out below, with the field numbers of
bf.proto; nothing of Stratum is vendored.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from hysync import files
from hysync.controlplane.errors import DeviceConfigError

TARGETS = ("bmv2", "tofino")
_PACKAGE = "stratum.hal.barefoot"
_FIELD = descriptor_pb2.FieldDescriptorProto


def read_device_config(path: str | Path, target: str) -> bytes:
    """The device config bytes for `target` from the compiler output at `path`: the BMv2
    JSON itself, or for Tofino the p4c-barefoot `.conf` file to pack."""
    if target == "tofino":
        return pack_tofino(Path(path))
    if target != "bmv2":
        raise DeviceConfigError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    return _read(Path(path), "the device config",
                 "pass the BMv2 JSON that `make p4` writes (build/p4/hysync.json), or leave "
                 "it out for the softswitch")


def pack_tofino(conf_path: Path) -> bytes:
    """Serialized BfPipelineConfig for the program described by a p4c-barefoot `.conf`."""
    conf = _load_conf(conf_path)
    try:
        devices = conf["p4_devices"]
        programs = sum(len(device["p4_programs"]) for device in devices)
        if len(devices) != 1 or programs != 1:
            raise DeviceConfigError(
                f"{conf_path} has {len(devices)} device(s) with {programs} program(s); Stratum "
                "takes one device with one program: compile p4src/tna/hysync.p4 alone "
                "(`make p4-tofino`)")
        program = devices[0]["p4_programs"][0]
        config = bf_pipeline_config_class()()
        config.p4_name = program["program-name"]
        config.bfruntime_info = _read(_resolve(conf_path, program["bfrt-config"]), "bfrt.json")
        for pipeline in program["p4_pipelines"]:
            profile = config.profiles.add()
            profile.profile_name = pipeline["p4_pipeline_name"]
            profile.context = _read(_resolve(conf_path, pipeline["context"]), "context.json")
            profile.binary = _read(_resolve(conf_path, pipeline["config"]), "tofino.bin")
            profile.pipe_scope.extend(int(pipe) for pipe in pipeline["pipe_scope"])
    except DeviceConfigError:
        raise
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise DeviceConfigError(
            f"{conf_path} is not a p4c-barefoot .conf file (missing or bad {err}): pass the "
            ".conf that `make p4-tofino` writes, e.g. build/tna/tofino2/hysync.conf") from err
    if not config.profiles:
        raise DeviceConfigError(f"{conf_path} lists no compiled pipeline: recompile with "
                                "`make p4-tofino`")
    return config.SerializeToString()


@functools.cache
def bf_pipeline_config_class() -> type[message.Message]:
    """The BfPipelineConfig message class (bf.proto's field numbers and types)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="hysync/stratum_bf_pipeline_config.proto", package=_PACKAGE, syntax="proto3")
    config = file.message_type.add(name="BfPipelineConfig")
    profile = config.nested_type.add(name="Profile")
    _add_field(profile, "profile_name", 1, _FIELD.TYPE_STRING)
    _add_field(profile, "context", 2, _FIELD.TYPE_BYTES)
    _add_field(profile, "binary", 3, _FIELD.TYPE_BYTES)
    _add_field(profile, "pipe_scope", 4, _FIELD.TYPE_UINT32, repeated=True)
    _add_field(config, "p4_name", 1, _FIELD.TYPE_STRING)
    _add_field(config, "bfruntime_info", 2, _FIELD.TYPE_BYTES)
    _add_field(config, "profiles", 3, _FIELD.TYPE_MESSAGE, repeated=True,
               type_name=f".{_PACKAGE}.BfPipelineConfig.Profile")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    descriptor = pool.FindMessageTypeByName(f"{_PACKAGE}.BfPipelineConfig")
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    if get_class is None:  # protobuf 3.20, Debian 12's
        get_class = message_factory.MessageFactory(pool).GetPrototype
    return get_class(descriptor)  # type: ignore[no-any-return]


def _add_field(msg: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int, *,
               repeated: bool = False, type_name: str = "") -> None:
    label = _FIELD.LABEL_REPEATED if repeated else _FIELD.LABEL_OPTIONAL
    msg.field.add(name=name, number=number, type=kind, label=label, type_name=type_name)


def _load_conf(conf_path: Path) -> dict[str, Any]:
    conf = files.read_json(conf_path, what="the p4c-barefoot .conf file",
                           error=DeviceConfigError,
                           fix="with --target tofino, --device-config is the .conf that "
                               "`make p4-tofino` writes, e.g. build/tna/tofino2/hysync.conf")
    if not isinstance(conf, dict):
        raise DeviceConfigError(f"{conf_path} is not a p4c-barefoot .conf file (a JSON object)")
    return conf


def _resolve(conf_path: Path, name: str) -> Path:
    """A path named in the .conf: absolute, or relative to where the compiler ran (the
    current directory for `make p4-tofino`), or to the .conf's own directory."""
    path = Path(name)
    if path.is_absolute() or path.exists():
        return path
    return conf_path.parent / path


def _read(path: Path, what: str, fix: str = "recompile with `make p4-tofino`") -> bytes:
    return files.read_bytes(path, what=what, fix=fix, error=DeviceConfigError)


__all__ = ["TARGETS", "bf_pipeline_config_class", "pack_tofino", "read_device_config"]
