"""The worker's configuration has one set of defaults (native/worker/config.h), and a
simulation's faults (native/worker/faults.h) never reach an engine on a socket."""

from __future__ import annotations

import socket

import pytest

from hysync import _core
from hysync.worker.config import ENGINE_FIELDS, TransportConfig, engine_config


def test_transport_defaults_are_the_engines() -> None:
    engine = _core.worker.EngineConfig()
    transport = TransportConfig(job_id=1, worker_id=0, switch_host="127.0.0.1")
    for name in ENGINE_FIELDS:
        if name in ("job_id", "worker_id"):
            continue
        assert getattr(transport, name) == getattr(engine, name), name
    assert transport.join_after > transport.rto_max  # a JOIN never races a back-off


def test_engine_config_carries_every_field() -> None:
    cfg = TransportConfig(job_id=3, worker_id=2, switch_host="127.0.0.1", switch_port=9999,
                          slot_base=8, slot_count=16, members=4, join_after=2.5,
                          staleness_decay=0.5)
    engine = cfg.engine_config("127.0.0.2", 2.0**16, seed=7)
    for name in ENGINE_FIELDS:
        assert getattr(engine, name) == getattr(cfg, name), name
    assert (engine.switch_ip, engine.switch_port, engine.scale, engine.seed) == \
        ("127.0.0.2", 9999, 2.0**16, 7)


def test_engine_config_names_what_is_wrong() -> None:
    with pytest.raises(TypeError, match="no engine setting 'join_afer'"):
        engine_config(join_afer=1.0)
    with pytest.raises(ValueError, match="not a dotted IPv4 address"):
        engine_config(switch_ip="switch.local")


def test_faults_are_refused_on_a_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        config = engine_config(switch_ip="127.0.0.1")
        faults = _core.worker.Faults()
        faults.no_chase = True
        with pytest.raises(ValueError, match="in-memory backend"):
            _core.worker.Engine(config, fd=sock.fileno(), faults=faults)
        engine = _core.worker.Engine(config, fd=sock.fileno())
        with pytest.raises(RuntimeError, match="runs on a socket"):
            engine.set_time(1.0)
    simulated = _core.worker.Engine(config, faults=faults)
    simulated.set_time(2.0)
    assert simulated.take_sent() == []


def test_the_install_tag_is_carried_and_checked() -> None:
    cfg = TransportConfig(job_id=3, worker_id=2, switch_host="127.0.0.1", install_tag=0x5A)
    assert cfg.engine_config("127.0.0.1", 2.0**16, seed=1).install_tag == 0x5A
    assert TransportConfig(job_id=3, worker_id=2, switch_host="127.0.0.1").install_tag == -1
    with pytest.raises(ValueError, match="install_tag is invalid"):
        TransportConfig(job_id=3, worker_id=2, switch_host="127.0.0.1", install_tag=256)
    with pytest.raises(ValueError, match="low byte of the job's install epoch"):
        engine_config(install_tag=300)

