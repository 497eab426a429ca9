"""Two leaves (or more) and a spine wired in-process for one job (docs/protocol.md §11), each
the softswitch's reference pipeline (engine "python") or its native one ("native"): datagrams
in, datagrams out, addressed by the labels of the two-level model
(tests/sim/two_level_model.py): "spine", ("leaf", i), ("host", i, h).

The controller's part is written here as table entries, groups and roles on each pipeline,
as `hysync serve` would: the same job id, slot and install epoch on every switch.
"""

from __future__ import annotations

import numpy as np

from hysync import p4names, wire
from hysync.softswitch.levels import JobRole, Level, Uplink
from hysync.softswitch.native import NativePipeline
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.tables import Entry, Replica
from hysync.wire import Flag, Mode, Op

JOB = 1
SLOT = 0
GROUP = 1
SPINE = "spine"
SPINE_ADDR = 0x0A000001  # 10.0.0.1
SPINE_MAC = 0x02000000A001
MODE_PRIORITY = 1
ENGINES = {"python": Pipeline, "native": NativePipeline}


def leaf_addr(leaf: int) -> int:
    return 0x0A010001 | leaf << 8  # 10.1.<leaf>.1


def host_addr(leaf: int, host: int) -> int:
    return 0x0A020000 | leaf << 8 | host + 1  # 10.2.<leaf>.<host + 1>


def host_port(host: int) -> int:
    return 40000 + host


def labels(leaves: int, hosts: int) -> dict[int, object]:
    """Every address of a fabric of `leaves` leaves of `hosts` hosts, to its label."""
    return {SPINE_ADDR: SPINE, **{leaf_addr(i): ("leaf", i) for i in range(leaves)},
            **{host_addr(i, h): ("host", i, h) for i in range(leaves) for h in range(hosts)}}


def address_of(label: object) -> tuple[int, int]:
    """The address and UDP port that `label` sends from."""
    if label == SPINE:
        return SPINE_ADDR, wire.HYSYNC_UDP_PORT
    if label[0] == "leaf":  # type: ignore[index]
        return leaf_addr(label[1]), wire.HYSYNC_UDP_PORT  # type: ignore[index]
    _, i, h = label  # type: ignore[misc]
    return host_addr(i, h), host_port(h)


def contrib(host: int, r: int, lanes: np.ndarray, tx: int = 1, chunk: int | None = None,
            retransmit: bool = False) -> bytes:
    """A host's CONTRIB for round r (its chunk defaults to r), transmission number tx."""
    flags = (tx << wire.TX_SHIFT) & wire.TX_MASK | (Flag.RETRANSMIT if retransmit else 0)
    head = wire.Header(op=Op.CONTRIB, job_id=JOB, worker_id=host, slot=SLOT, round=r,
                       chunk=r if chunk is None else chunk, flags=flags).pack()
    return head + np.asarray(lanes, dtype=">i4").tobytes()


def lanes_of(datagram: bytes) -> np.ndarray:
    return np.frombuffer(datagram, ">i4", wire.LANES, wire.HEADER_BYTES).astype(np.int64)


class Fabric:
    def __init__(self, leaves: int, hosts: int, epoch: int = 1, engine: str = "python",
                 spine_pipeline: type[Pipeline] | None = None) -> None:
        """`spine_pipeline`: the spine's pipeline class where it is not the engine's (a
        conformance target's, such as the TNA program's register plan)."""
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: choose one of {', '.join(ENGINES)}")
        self.leaves, self.hosts, self.epoch = leaves, hosts, epoch
        self.engine = ENGINES[engine]
        self.spine = (spine_pipeline or self.engine)(num_slots=1)
        self.leaf = [self.engine(num_slots=1) for _ in range(leaves)]
        self._label = labels(leaves, hosts)
        self._install_spine()
        for i in range(leaves):
            self._install_leaf(i)

    # ---------------------------------------------------------------- the controller
    def _install(self, p: Pipeline, members: list[tuple[int, int, int]]) -> None:
        replicas = []
        for w, addr, port in members:
            p.write_entry("INSERT", Entry(p4names.ADMISSION_MEMBERS, (JOB, w, addr, port),
                                          p4names.ADMISSION_ADMIT))
            rid = wire.member_rid(JOB, w)
            p.write_entry("INSERT", Entry(p4names.REPLICATION_REWRITE, (rid,),
                                          p4names.REPLICATION_REWRITE_DST, (0, addr, port)))
            replicas.append(Replica(port=1, rid=rid))
        p.write_group("INSERT", GROUP, replicas)
        p.write_entry("INSERT", Entry(p4names.ADMISSION_JOBS, (JOB,), p4names.ADMISSION_SET_JOB,
                                      (SLOT, 1, len(members), GROUP, self.epoch)))
        p.write_entry("INSERT", Entry(p4names.SYNC_MODE_MODES, (JOB, (SLOT, SLOT)),
                                      p4names.SYNC_MODE_SET_MODE, (int(Mode.SYNC), 0),
                                      priority=MODE_PRIORITY))

    def _install_spine(self) -> None:
        self._install(self.spine, [(i, leaf_addr(i), wire.HYSYNC_UDP_PORT)
                                   for i in range(self.leaves)])
        self.spine.set_role(JOB, JobRole(Level.SPINE))

    def _install_leaf(self, i: int) -> None:
        p = self.leaf[i]
        self._install(p, [(h, host_addr(i, h), host_port(h)) for h in range(self.hosts)])
        p.set_role(JOB, JobRole(Level.LEAF, Uplink(SPINE_ADDR, SPINE_MAC, i, leaf_addr(i))))

    def pipeline(self, label: object) -> Pipeline:
        return self.spine if label == SPINE else self.leaf[label[1]]  # type: ignore[index]

    def set_mode(self, label: object, mode: Mode, quorum: int = 0) -> None:
        """A hot swap at one level: one MODIFY of that switch's modes entry."""
        self.pipeline(label).write_entry("MODIFY", Entry(
            p4names.SYNC_MODE_MODES, (JOB, (SLOT, SLOT)), p4names.SYNC_MODE_SET_MODE,
            (int(mode), quorum), priority=MODE_PRIORITY))

    def restart_leaf(self, i: int, epoch: int) -> None:
        """A leaf lost its registers and tables: the job is added again on every switch it
        spans, under a new install epoch (§11, "a switch restart is a restart of the job")."""
        self.epoch = epoch
        self.leaf[i] = self.engine(num_slots=1)
        self._install_leaf(i)
        for p in [self.spine, *(lf for j, lf in enumerate(self.leaf) if j != i)]:
            members = p.tables[p4names.ADMISSION_JOBS].entries[((JOB,), 0)].params[2]
            p.write_entry("MODIFY", Entry(p4names.ADMISSION_JOBS, (JOB,),
                                          p4names.ADMISSION_SET_JOB,
                                          (SLOT, 1, members, GROUP, epoch)))

    # -------------------------------------------------------------------- the wire
    def deliver(self, src: object, dst: object, datagram: bytes) -> list[tuple[object, bytes]]:
        """`datagram` from `src` reaches switch `dst`: what the switch sends, by label."""
        addr, port = address_of(src)
        return [(self._label[ip], out)
                for ip, _port, out in self.pipeline(dst).process_datagram(addr, port, datagram)]

    def settle(self, packets: list[tuple[object, object, bytes]],
               lose=lambda src, dst, datagram: False) -> dict[object, list[bytes]]:
        """Deliver (src, dst, datagram) in order, and everything the switches send, until
        the switches are quiet; `lose` drops the packets it names. What reached each host."""
        at_hosts: dict[object, list[bytes]] = {}
        queue = list(packets)
        while queue:
            src, dst, datagram = queue.pop(0)
            if lose(src, dst, datagram):
                continue
            if dst[0] == "host":  # type: ignore[index]
                at_hosts.setdefault(dst, []).append(datagram)
                continue
            queue += [(dst, to, out) for to, out in self.deliver(src, dst, datagram)]
        return at_hosts
