"""Big P4Runtime writes: how long a batch takes, and what it does to aggregation meanwhile.

For batches of 1k, 5k and 20k INSERTs (a fifth forwarding.l2, two fifths
replication.rewrite, two fifths admission.members, as a big deployment writes them):

* client encode: `Switch.write`'s entities -> bytes (hysync/p4rt_codec), against the generic
  protobuf path it replaced (`Update.encode` into a WriteRequest, SerializeToString);
* server: the softswitch's Write handler in this process (decode, plan, swap in), per
  engine, against the generic path's parse alone (`WriteRequest.FromString`);
* end to end: `Switch.write` against a softswitch process, then the DELETEs of the batch;
* reply delay: a one-member job on the same softswitch answers a contribution at a
  time (a separate process, so that the client's work does not delay it); the round
  trips of contributions sent while the batch was being written, against those before.

    .venv/bin/python -m bench.write_bench [--sizes 1000 5000 20000] [--engines native python]

Writes bench/results/write.json. Times are wall-clock seconds on whatever else the machine
runs; the load average is recorded with them.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from p4.v1 import p4runtime_pb2 as p4r

from hysync import p4names, p4rt_codec, wire
from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt import entities as ent
from hysync.controlplane.p4rt.switch import Switch, wait_for_server
from hysync.p4schema import Schema
from hysync.softswitch.native import NativePipeline
from hysync.softswitch.p4binding import bind_p4info
from hysync.softswitch.p4write import Annotations, Writer
from hysync.softswitch.pipeline import Pipeline
from hysync.topologies.runner import P4INFO, start_softswitch
from hysync.wire import Op

RESULTS = Path(__file__).resolve().parent / "results"
PROBE_JOB = 255  # its member and replica ids are outside the batches' (jobs 1..250, rids 1..8000)
PROBE_TIMEOUT_S = 2.0


def batch(size: int) -> list[ent.Update]:
    l2, rewrites = size // 5, 2 * size // 5
    members = size - l2 - rewrites
    updates = [ent.insert(ent.TableEntry(
        p4names.FORWARDING_L2, {"dst_addr": 0x020000100000 + i},
        p4names.FORWARDING_SET_EGRESS_PORT, {"port": 1 + i % 8})) for i in range(l2)]
    updates += [ent.insert(ent.TableEntry(
        p4names.REPLICATION_REWRITE, {"egress_rid": i + 1}, p4names.REPLICATION_REWRITE_DST,
        {"dst_mac": 0x020000000001, "dst_addr": 0x7F000001, "dst_port": 40000 + i % 1000}))
        for i in range(rewrites)]
    updates += [ent.insert(ent.TableEntry(
        p4names.ADMISSION_MEMBERS, {"job_id": 1 + i // 32, "worker_id": i % 32,
                                    "src_addr": 0x7F000001, "src_port": 20000 + i},
        p4names.ADMISSION_ADMIT)) for i in range(members)]
    return updates


def encode_generic(schema: Schema, updates: list[ent.Update]) -> bytes:
    """The WriteRequest bytes as the generic protobuf path built them."""
    request = p4r.WriteRequest(device_id=1, election_id=p4r.Uint128(high=0, low=1),
                               atomicity=p4r.WriteRequest.CONTINUE_ON_ERROR)
    request.updates.extend(u.encode(schema) for u in updates)
    return request.SerializeToString()


def encode_codec(schema: Schema, updates: list[ent.Update]) -> bytes:
    """The WriteRequest bytes as Switch.write builds them."""
    request = p4rt_codec.WriteRequest(1, election_id=(0, 1),
                                  atomicity=p4r.WriteRequest.CONTINUE_ON_ERROR)
    return p4rt_codec.encode_write_request(
        request, [p4rt_codec.encode_update(u.record(schema)) for u in updates])


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    """Wall seconds of fn(*args), without cyclic GC (as the server's Write runs)."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        result = fn(*args)
        return time.perf_counter() - t0, result
    finally:
        gc.enable()


def in_process(schema: Schema, updates: list[ent.Update]) -> dict[str, Any]:
    generic_s, generic = timed(encode_generic, schema, updates)
    codec_s, data = timed(encode_codec, schema, updates)
    assert data == generic, "the codec's bytes differ from the protobuf library's"
    parse_s, _ = timed(p4r.WriteRequest.FromString, data)
    row: dict[str, Any] = {"bytes": len(data), "client_encode_generic_s": generic_s,
                           "client_encode_s": codec_s, "server_parse_generic_s": parse_s}
    for engine, pipeline in (("native", NativePipeline()), ("python", Pipeline())):
        writer = Writer(pipeline, Annotations())
        checked = bind_p4info(schema.p4info, pipeline)
        decode_s, request = timed(p4rt_codec.decode_write_request, data)
        plan_s, _ = timed(writer.write, checked, request.updates)
        row[f"server_{engine}_decode_s"], row[f"server_{engine}_apply_s"] = decode_s, plan_s
        row[f"server_{engine}_s"] = decode_s + plan_s
    return row


# ------------------------------------------------------------------ end to end
def probe_main(sock: socket.socket, switch_port: int, seconds: float, ready: Any,
               out: Any) -> None:
    """Contribute on the probe job's slot 0 one round at a time from `sock` (bound by the
    parent): (sent at, round trip). `ready` is set at the first answer."""
    sock.settimeout(PROBE_TIMEOUT_S)
    packet = wire.empty_batch(1)
    packet["op"], packet["job_id"], packet["worker_id"], packet["slot"] = Op.CONTRIB, \
        PROBE_JOB, 0, 0
    pkt = bytearray(wire.encode_batch(packet)[0])
    samples: list[tuple[float, float | None]] = []
    rnd, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        pkt[12:16] = rnd.to_bytes(4, "big")
        sent = time.monotonic()
        sock.sendto(pkt, ("127.0.0.1", switch_port))
        rtt = None
        try:
            while rtt is None:
                data = sock.recv(2048)
                got = int.from_bytes(data[12:16], "big")
                if data[1] == Op.RESYNC or (data[1] == Op.RESULT and got >= rnd):
                    rtt = time.monotonic() - sent
                    rnd = got if data[1] == Op.RESYNC else got + 1
            ready.set()
        except TimeoutError:
            pass
        samples.append((sent, rtt))
        time.sleep(0.001)
    out.put(samples)
    sock.close()


def delays(samples: list[tuple[float, float | None]], start: float, stop: float) -> dict:
    during = [r for t, r in samples if start <= t <= stop]
    answered = sorted(r for r in during if r is not None)
    return {"probes": len(during), "lost": len(during) - len(answered),
            "median_ms": 1000 * statistics.median(answered) if answered else None,
            "max_ms": 1000 * max(answered) if answered else None}


def end_to_end(engine: str, updates: list[ent.Update]) -> dict[str, Any]:
    # Every port bound where it is used: the switch's by the switch (port 0, printed), the
    # probe's here, its socket handed to the probe process.
    proc, grpc_addr, data_port = start_softswitch(
        Path(tempfile.gettempdir()) / f"write-bench-softswitch-{os.getpid()}.log",
        "--engine", engine)
    probe_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe_sock.bind(("127.0.0.1", 0))
    probe_port = probe_sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out, ready = ctx.Queue(), ctx.Event()
    try:
        wait_for_server(grpc_addr, failed=lambda: None if proc.poll() is None
                        else "the softswitch exited")
        with Switch(grpc_addr, timeout=10) as switch:
            switch.push_pipeline(P4INFO)
            Controller(switch).attach().add_job(JobConfig(PROBE_JOB, (Member(
                0, "127.0.0.1", "02:00:00:00:09:01", probe_port, 1),), 0, 16))
            window = 5.0 + len(updates) / 2000
            probe = ctx.Process(target=probe_main,
                                args=(probe_sock, data_port, window, ready, out))
            probe.start()
            if not ready.wait(timeout=60):
                raise RuntimeError("the probe job got no answer from the softswitch")
            before = time.monotonic()
            time.sleep(0.5)
            t0 = time.monotonic()
            switch.write(updates)
            t1 = time.monotonic()
            switch.write([ent.delete(u.entity) for u in updates])
            t2 = time.monotonic()
            samples = out.get(timeout=window + 60)
            probe.join(timeout=10)
        return {"insert_s": t1 - t0, "delete_s": t2 - t1,
                "reply_delay_idle": delays(samples, before, t0),
                "reply_delay_during_write": delays(samples, t0, t2)}
    finally:
        probe_sock.close()
        proc.terminate()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument("--engines", nargs="+", choices=["native", "python"],
                        default=["native", "python"])
    args = parser.parse_args(argv)
    schema = Schema.from_file(P4INFO)
    rows = []
    for size in args.sizes:
        updates = batch(size)
        row: dict[str, Any] = {"updates": size, "load_avg_1m": os.getloadavg()[0]}
        row.update(in_process(schema, updates))
        for engine in args.engines:
            row[f"e2e_{engine}"] = end_to_end(engine, updates)
        rows.append(row)
        print(json.dumps(row), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "write.json").write_text(json.dumps({
        "generic_path": "p4runtime-shell's protobuf (pure Python, protobuf<3.21)",
        "rows": rows}, indent=1) + "\n")
    print(f"wrote {RESULTS / 'write.json'}")


if __name__ == "__main__":
    main()
