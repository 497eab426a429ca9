"""Leaves and a spine of BMv2 simple_switch_grpc processes for one job (docs/protocol.md §11),
with the interface of tests/softswitch/two_level_fabric.py's Fabric: datagrams in, datagrams
out, addressed by the two-level model's labels. Each switch is a conformance Bmv2Target (its
own network namespace, P4Runtime, veth ports); the harness carries the packets between them,
as frames: a datagram for a switch becomes the frame its sender would put on the wire, and
every frame a switch sends becomes a datagram for the label of its destination address.

The controller's part is Fabric's, written over P4Runtime: the same job id, slot and install
epoch on every switch, a role per switch, and on each leaf the L2 entry of the spine's MAC
(port 2) that its uplinks go out of.
"""

from __future__ import annotations

from pathlib import Path

from hysync import p4names, wire
from hysync.softswitch.levels import JobRole, Level, Uplink, role_params
from hysync.wire import Mode
from tests.softswitch.two_level_fabric import (
    GROUP,
    JOB,
    MODE_PRIORITY,
    SLOT,
    SPINE,
    SPINE_ADDR,
    SPINE_MAC,
    Fabric,
    address_of,
    host_addr,
    host_port,
    labels,
    leaf_addr,
)

from .bmv2_target import Bmv2Target
from .targets import Write

MEMBER_PORT, SPINE_PORT = 1, 2  # every member behind port 1; a leaf's spine behind port 2


class Bmv2Switch(Bmv2Target):
    """A BMv2 target beside others: the program compiled by the first of them only."""

    compiled: Path | None = None

    @staticmethod
    def _compile() -> Path:
        if Bmv2Switch.compiled is None:
            Bmv2Switch.compiled = Bmv2Target._compile()
        return Bmv2Switch.compiled


class Bmv2Fabric:
    """`leaves` leaves of `hosts` hosts and a spine, on `switches` (reset here), one job; with
    `native_leaves`, the spine alone on BMv2 and the leaves the softswitch's native pipelines
    (targets mixed as a testbed may mix them)."""

    def __init__(self, leaves: int, hosts: int, switches: list[Bmv2Switch],
                 epoch: int = 1, native_leaves: bool = False) -> None:
        self.leaves, self.hosts, self.epoch = leaves, hosts, epoch
        self.native = Fabric(leaves, hosts, epoch, engine="native") if native_leaves else None
        self.spine, *self.leaf = switches[:1 if native_leaves else leaves + 1]
        self._label = labels(leaves, hosts)
        for switch in (self.spine, *self.leaf):
            switch.reset()
        self._install(self.spine, [(i, leaf_addr(i), wire.HYSYNC_UDP_PORT)
                                   for i in range(leaves)], JobRole(Level.SPINE))
        for i, leaf in enumerate(self.leaf):
            leaf.write("INSERT", Write(p4names.FORWARDING_L2, (SPINE_MAC,),
                                       p4names.FORWARDING_SET_EGRESS_PORT, (SPINE_PORT,)))
            self._install(leaf, [(h, host_addr(i, h), host_port(h)) for h in range(hosts)],
                          JobRole(Level.LEAF, Uplink(SPINE_ADDR, SPINE_MAC, i, leaf_addr(i))))

    def _install(self, switch: Bmv2Switch, members: list[tuple[int, int, int]],
                 role: JobRole) -> None:
        for w, addr, port in members:
            switch.write("INSERT", Write(p4names.ADMISSION_MEMBERS, (JOB, w, addr, port),
                                         p4names.ADMISSION_ADMIT))
            switch.write("INSERT", Write(p4names.REPLICATION_REWRITE, (wire.member_rid(JOB, w),),
                                         p4names.REPLICATION_REWRITE_DST, (0, addr, port)))
        switch.write_group("INSERT", GROUP, [(MEMBER_PORT, wire.member_rid(JOB, w))
                                             for w, _, _ in members])
        # The role before the job's entry, as a controller writes them (§11).
        switch.write("INSERT", Write(p4names.ADMISSION_ROLES, (JOB,), p4names.ADMISSION_SET_ROLE,
                                     role_params(role)))
        switch.write("INSERT", Write(p4names.ADMISSION_JOBS, (JOB,), p4names.ADMISSION_SET_JOB,
                                     (SLOT, 1, len(members), GROUP, self.epoch)))
        switch.write("INSERT", Write(p4names.SYNC_MODE_MODES, (JOB, (SLOT, SLOT)),
                                     p4names.SYNC_MODE_SET_MODE, (int(Mode.SYNC), 0),
                                     MODE_PRIORITY))

    def pipeline(self, label: object) -> Bmv2Switch:
        return self.spine if label == SPINE else self.leaf[label[1]]  # type: ignore[index]

    def set_mode(self, label: object, mode: Mode, quorum: int = 0) -> None:
        if self.native is not None and label != SPINE:
            self.native.set_mode(label, mode, quorum)
            return
        self.pipeline(label).write("MODIFY", Write(
            p4names.SYNC_MODE_MODES, (JOB, (SLOT, SLOT)), p4names.SYNC_MODE_SET_MODE,
            (int(mode), quorum), MODE_PRIORITY))

    def deliver(self, src: object, dst: object, datagram: bytes) -> list[tuple[object, bytes]]:
        """`datagram` from `src` reaches switch `dst` as a frame: what the switch sends, by
        label, in the order of the labels (a switch's frames come out of several ports)."""
        if self.native is not None and dst != SPINE:
            return self.native.deliver(src, dst, datagram)
        addr, port = address_of(src)
        to = SPINE_ADDR if dst == SPINE else leaf_addr(dst[1])  # type: ignore[index]
        frame = wire.build_frame(wire.FrameAddress(
            src_mac=(0x020000000000 | addr).to_bytes(6, "big"),
            dst_mac=SPINE_MAC.to_bytes(6, "big") if dst == SPINE else bytes(6),
            src_ip=addr, dst_ip=to, src_port=port), datagram)
        ingress = SPINE_PORT if src == SPINE else MEMBER_PORT
        out = []
        for _port, sent in self.pipeline(dst).send(ingress, frame):
            address, payload = wire.parse_frame(sent)
            out.append((self._label[address.dst_ip], payload))
        return out

    def counter(self, label: object, name: str, index: int) -> int:
        if self.native is not None and label != SPINE:
            return self.native.pipeline(label).counters[name].packets[index]
        return self.pipeline(label).counter(name, index)
