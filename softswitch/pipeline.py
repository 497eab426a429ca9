"""The reference model of p4src/v1model/hysync.p4: docs/protocol.md in Python.

One `Pipeline` object holds the switch's registers, tables, multicast groups and
counters. Two entry points share one state machine (`_aggregate`):

* `process_frame(port, frame)` — Ethernet frames in, (port, frame) out, byte for
  byte what BMv2 emits for the same input (the conformance suite checks it);
* `process_datagram(src_ip, src_port, payload)` — the UDP data plane's fast path,
  which skips building and parsing Ethernet/IPv4/UDP headers it would throw away.

The hot path is written for speed: registers are Python lists (scalar access is
what the state machine does), lanes a native int32 numpy array (adds wrap) and a
result is sent with one conversion to network order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from hysync import p4names, wire
from hysync.protocol_spec.decision import Counter as MemberCounter
from hysync.protocol_spec.decision import Emit, LaneOp, SeqOp, decide, facts_of
from hysync.softswitch.levels import JobRole, Level, role_of_params, role_params, serial_after
from hysync.softswitch.tables import Counter, Entry, EntryError, Replica, Table
from hysync.wire import DropReason, Flag, Mode, Op, ResyncReason

# The counters in the order _contributions.._results unpack them (docs/protocol.md §8).
COUNTER_NAMES = (
    p4names.STATS_CONTRIBUTIONS,
    p4names.STATS_LATE,
    p4names.STATS_DUPLICATES,
    p4names.STATS_STALE,
    p4names.STATS_CLOSES,
    p4names.STATS_DROPS,
    p4names.STATS_SWITCH_DROPS,
    p4names.REPLICATION_RESULTS,
)
MEMBER_CELLS = wire.MAX_JOBS * wire.MAX_WORKERS
DROP_CELLS = wire.MAX_JOBS * wire.NUM_DROP_REASONS

_HDR = wire.HEADER_STRUCT  # module globals: the hot path looks them up per packet
_OP, _FLAGS, _JOB, _WORKER, _COUNT, _BITMAP = (
    wire.FIELD_OFFSET[f] for f in ("op", "flags", "job_id", "worker_id", "count", "bitmap"))
_U32 = 0xFFFFFFFF
_BE = np.dtype(">i4")
_FRAME_OVERHEAD = wire.HYSYNC_OFFSET
_EXPECTED_IP_LEN = wire.IPV4_BYTES + wire.UDP_BYTES + wire.PACKET_BYTES
_EXPECTED_UDP_LEN = wire.UDP_BYTES + wire.PACKET_BYTES
_REPLY_IP_LEN = wire.IPV4_BYTES + wire.UDP_BYTES + wire.HEADER_BYTES

# What `_aggregate` asks the caller to emit.
REPLY = 0  # back to the sender, out of the ingress port
MULTICAST = 1  # to every replica of the job's multicast group
UPLINK = 2  # a leaf's sum, to the spine of the job (the group field holds the job)
MULTICAST_BITMAP = 3  # to the replicas of the group whose worker's bit is in the bitmap


class Pipeline:
    def __init__(self, num_slots: int = wire.NUM_SLOTS) -> None:
        self.num_slots = num_slots
        # Serializes control-plane writes with packet batches; re-entrant so that a
        # P4Runtime batch can hold it across its updates (see batch()).
        self.lock = threading.RLock()
        self._deferred: set[str] | None = None
        self.tables: dict[str, Table] = {
            name: Table(name, size, p4names.TABLE_DEFAULT_ACTION[name]) for name, size in (
                (p4names.ADMISSION_MEMBERS, p4names.ADMISSION_MEMBERS_SIZE),
                (p4names.ADMISSION_JOBS, wire.MAX_JOBS),
                (p4names.ADMISSION_ROLES, p4names.ADMISSION_ROLES_SIZE),
                (p4names.SYNC_MODE_MODES, p4names.SYNC_MODE_MODES_SIZE),
                (p4names.FORWARDING_L2, p4names.FORWARDING_L2_SIZE),
                (p4names.REPLICATION_REWRITE, MEMBER_CELLS))}
        self.groups: dict[int, list[Replica]] = {}
        sizes = {p4names.STATS_DROPS: DROP_CELLS,
                 p4names.STATS_SWITCH_DROPS: p4names.STATS_SWITCH_DROPS_SIZE}
        self.counters = {name: Counter(name, sizes.get(name, MEMBER_CELLS))
                         for name in COUNTER_NAMES}
        self._contributions, self._late, self._duplicates, self._stale, self._closes, \
            self._drops, self._switch_drops, self._results = (self.counters[n]
                                                              for n in COUNTER_NAMES)
        self._member_counters = {MemberCounter.CONTRIBUTIONS: self._contributions,
                                 MemberCounter.LATE: self._late,
                                 MemberCounter.DUPLICATES: self._duplicates,
                                 MemberCounter.STALE: self._stale}
        # The level of each job that spans switches (docs/protocol.md §11), derived from the
        # roles table; absent: single.
        self._roles: dict[int, JobRole] = {}
        self.reset_registers()
        for name in self.tables:
            self._rebuild_index(name)

    # ------------------------------------------------------------ state
    def reset_registers(self) -> None:
        """Power-on state: every register zero (a pipeline push does this too)."""
        n = self.num_slots
        self.slot_epoch = [0] * n  # the install epoch of the job that last used the slot
        self.res_valid = [False] * n  # res_* and the other bank hold a round of this epoch
        self.round = [0] * n
        self.count = [0] * n
        self.bitmap = [0] * n
        self.chunk = [0] * n
        self.mode = [0] * n
        self.quorum = [0] * n
        self.res_bitmap = [0] * n
        self.res_count = [0] * n
        self.res_chunk = [0] * n
        self.res_mode = [0] * n
        self.res_quorum = [0] * n
        self.member_seq = [0] * (n * wire.MAX_WORKERS)
        self.member_epoch = [0] * (n * wire.MAX_WORKERS)  # member_seq is valid in this epoch
        # Native int32 (wrapping adds); converted to network order only for results.
        self.lanes = np.zeros((2 * n, wire.LANES), dtype=np.int32)
        # A spine's hosts in the open round (count[s] counts leaves); §11 "The spine".
        self.weight = [0] * n
        # A leaf's uplink: its sum of round up_round[s] is at the spine, no verdict yet
        # (up_pending), the hosts in it, its count and chunk, the latest transmission number.
        self.up_pending = [False] * n
        self.up_round = [0] * n
        self.up_bitmap = [0] * n
        self.up_count = [0] * n
        self.up_chunk = [0] * n
        self.up_tx = [0] * n

    def reset_counters(self) -> None:
        for counter in self.counters.values():
            counter.clear()

    def _rebuild_index(self, name: str) -> None:
        """Derive the dict the packet path looks up from one table's entries."""
        setattr(self, *_index(name, self.tables[name].entries.values()))

    def replace(self, tables: dict[str, dict[Any, Entry]],
                groups: dict[int, list[Replica]] | None = None,
                defaults: dict[str, tuple[str, tuple[int, ...]]] | None = None) -> None:
        """Swap in whole new entries of some tables (and the groups, default actions): a
        P4Runtime batch built beside the pipeline. The lookup indexes are derived before the
        lock is taken, so packets wait only for the swap, however big the batch."""
        indexes = [_index(name, entries.values()) for name, entries in tables.items()]
        with self.lock:
            self._swap(tables, groups, defaults)
            for attr, index in indexes:
                setattr(self, attr, index)

    def _swap(self, tables: dict[str, dict[Any, Entry]], groups: dict[int, list[Replica]] | None,
              defaults: dict[str, tuple[str, tuple[int, ...]]] | None) -> None:
        for name, entries in tables.items():
            self.tables[name].entries = entries
        if groups is not None:
            self.groups = groups
        for name, (action, params) in (defaults or {}).items():
            self.tables[name].default_action, self.tables[name].default_params = action, params

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Apply several writes under one lock, rebuilding each touched index once."""
        with self.lock:
            outer = self._deferred is None
            if outer:
                self._deferred = set()
            try:
                yield
            finally:
                if outer:
                    touched, self._deferred = self._deferred, None
                    for name in touched or ():
                        self._rebuild_index(name)

    # ------------------------------------------------- control-plane writes
    def write_entry(self, update: str, entry: Entry) -> None:
        """update is INSERT, MODIFY or DELETE; raises EntryError without side effects."""
        table = self.tables[entry.table]
        with self.lock:
            {"INSERT": table.insert, "MODIFY": table.modify, "DELETE": table.delete}[update](entry)
            if self._deferred is None:
                self._rebuild_index(entry.table)
            else:
                self._deferred.add(entry.table)

    def set_default_action(self, table: str, action: str, params: tuple[int, ...]) -> None:
        with self.lock:
            self.tables[table].default_action = action
            self.tables[table].default_params = params

    def write_group(self, update: str, group_id: int, replicas: list[Replica]) -> None:
        with self.lock:
            exists = group_id in self.groups
            if update == "INSERT" and exists:
                raise EntryError("ALREADY_EXISTS", f"multicast group {group_id} exists")
            if update in ("MODIFY", "DELETE") and not exists:
                raise EntryError("NOT_FOUND", f"multicast group {group_id} does not exist")
            if update == "DELETE":
                del self.groups[group_id]
            else:
                self.groups[group_id] = list(replicas)

    def clear_tables(self) -> None:
        """A new pipeline config drops every entry, group, counter and register."""
        with self.lock:
            for table in self.tables.values():
                table.entries.clear()
            self.groups.clear()
            self.reset_counters()
            self.reset_registers()
            for name in self.tables:
                self._rebuild_index(name)

    def set_role(self, job: int, role: JobRole | None) -> None:
        """The job's level on this switch (docs/protocol.md §11); None or single: §4. Written
        as the roles table's entry for the job, what a P4Runtime client writes."""
        if not 0 < job < wire.MAX_JOBS:
            raise ValueError(f"job {job} is out of range: job ids are 1..{wire.MAX_JOBS - 1}")
        table = self.tables[p4names.ADMISSION_ROLES]
        with self.lock:
            exists = ((job,), 0) in table.entries
            if role is None or role.level == Level.SINGLE:
                if exists:
                    self.write_entry("DELETE", Entry(table.name, (job,), p4names.NO_ACTION))
                return
            self.write_entry("MODIFY" if exists else "INSERT",
                             Entry(table.name, (job,), p4names.ADMISSION_SET_ROLE,
                                   role_params(role)))

    def role(self, job: int) -> JobRole:
        return self._roles.get(job) or JobRole(Level.SINGLE)

    # --------------------------------------------------------- the core
    def _drop(self, job: int, reason: int, nbytes: int) -> None:
        self._drops.count((job if job < wire.MAX_JOBS else 0) * wire.NUM_DROP_REASONS + reason,
                          nbytes)
        self._switch_drops.count(reason, nbytes)

    def _desired_mode(self, job: int, slot: int) -> tuple[int, int]:
        for _, lo, hi, mode, quorum in self._modes.get(job, ()):
            if lo <= slot <= hi:
                return mode, quorum
        return Mode.SYNC, 0

    def _aggregate(self, payload: bytes, src_ip: int, src_port: int,
                   nbytes: int) -> tuple[int, int, bytes] | None:
        """Steps 1-10 of docs/protocol.md §4 for one UDP payload on the HySync port.

        Returns (REPLY, 0, datagram), (MULTICAST, group, datagram) or None (absorbed/dropped);
        at a leaf (§11) also (UPLINK, job, datagram) and (MULTICAST_BITMAP, group, datagram).
        A RESULT or RESYNC reaching a leaf of its job is the spine's verdict (`_verdict`).
        """
        if (self._roles and len(payload) >= wire.HEADER_BYTES
                and payload[_OP] in (Op.RESULT, Op.RESYNC)):
            role = self._roles.get(int.from_bytes(payload[_JOB:_JOB + 2], "big"))
            if role is not None and role.leaf:
                return self._verdict(payload, src_ip, role, nbytes)
        admitted = self._admit(payload, src_ip, src_port, nbytes)
        if admitted is None:
            return None
        return self._slot_update(payload, admitted, nbytes)

    def _admit(self, payload: bytes, src_ip: int, src_port: int,
               nbytes: int) -> tuple[int, ...] | None:
        """Steps 1-7: (version, job, w, s, r, chunk, members, group, epoch) of an admitted
        contribution, or None (dropped and counted)."""
        size = len(payload)
        if size < wire.HEADER_BYTES:
            self._drop(0, DropReason.MALFORMED, nbytes)
            return None
        (version, op, _flags, _mode, job, w, _count, s, _reason, _quorum, r, chunk,
         _bitmap) = _HDR.unpack_from(payload)
        if op in (Op.CONTRIB, Op.RESULT) and size < wire.PACKET_BYTES:
            self._drop(job, DropReason.MALFORMED, nbytes)
            return None
        if version != wire.VERSION:
            self._drop(job, DropReason.BAD_VERSION, nbytes)
            return None
        if op != Op.CONTRIB:
            self._drop(job, DropReason.BAD_OP, nbytes)
            return None
        if size != wire.PACKET_BYTES:
            self._drop(job, DropReason.BAD_LENGTH, nbytes)
            return None
        if (job, w, src_ip, src_port) not in self._members:
            self._drop(job, DropReason.NOT_MEMBER, nbytes)
            return None
        job_cfg = self._jobs.get(job)
        if job_cfg is None:
            self._drop(job, DropReason.NO_JOB, nbytes)
            return None
        slot_base, slot_count, members, group, epoch = job_cfg
        if not slot_base <= s < slot_base + slot_count or s >= self.num_slots:
            self._drop(job, DropReason.SLOT_RANGE, nbytes)
            return None
        return version, job, w, s, r, chunk, members, group, epoch

    def _slot_update(self, payload: bytes, admitted: tuple[int, ...],
                     nbytes: int) -> tuple[int, int, bytes] | None:
        """Steps 8-10 for an admitted contribution: step 8 here, then the outcome of the
        decision table (hysync/protocol_spec/decision.py) for the facts it reads, applied."""
        version, job, w, s, r, chunk, members, group, epoch = admitted
        flags = payload[_FLAGS]
        echo = flags & wire.TX_MASK  # every reply echoes the transmission number
        # 8. a slot another install of a job used last starts afresh; then latch the
        # desired mode when no round is under way.
        if self.slot_epoch[s] != epoch:
            self._start_afresh(s, epoch)
        count = self.count[s]
        if count == 0:
            self.mode[s], self.quorum[s] = self._desired_mode(job, s)
        mode, quorum = self.mode[s], self.quorum[s]
        member = job * wire.MAX_WORKERS + w
        bit = 1 << w
        cur = self.round[s]
        seq_index = s * wire.MAX_WORKERS + w
        role = self._roles.get(job)
        if role is not None and role.leaf and self.up_pending[s] and r == self.up_round[s]:
            return self._pending_round(s, job, w, r, version, echo, epoch, role, nbytes)
        cell_seq, cell_epoch = self.member_seq[seq_index], self.member_epoch[seq_index]
        counted = cell_epoch == epoch and cell_seq == r
        behind = self._behind(seq_index, r, epoch)
        o = decide(facts_of(
            asynchronous=mode == Mode.ASYNC, counted=counted,
            refused=cell_epoch == wire.refused_mark(epoch) and cell_seq == r,
            join_marked=self._join_marked(seq_index, r, epoch), join=bool(flags & Flag.JOIN),
            open_round=r == cur, prev=r == (cur - 1) & _U32 and self.res_valid[s],
            count=count, has_bit=bool(self.bitmap[s] & bit),
            q=members if quorum == 0 else min(quorum, members),
            chunk_differs=chunk != self.chunk[s], res_has_bit=bool(self.res_bitmap[s] & bit),
            behind=behind))

        if o.seq == SeqOp.RECORD:
            self.member_seq[seq_index] = r
            self.member_epoch[seq_index] = epoch
        elif o.seq == SeqOp.REFUSE:
            if role is None:
                self._refuse(seq_index, r, epoch, counted or behind)
            else:
                self._refuse_unless_later(seq_index, r, epoch)
        elif o.seq in (SeqOp.JOIN_MARK, SeqOp.JOIN_SPEND):
            self._mark_join(seq_index, r, epoch, counted, spent=o.seq == SeqOp.JOIN_SPEND)
        if o.drop is not None:
            self._drop(job, o.drop, nbytes)
        if o.counter:
            self._member_counters[o.counter].count(member, nbytes)
        bank = 2 * s + (cur & 1)
        if o.lanes:
            lanes = np.frombuffer(payload, ">i4", wire.LANES, wire.HEADER_BYTES)
            if o.lanes == LaneOp.ADD:
                self.lanes[bank] += lanes
            else:
                self.lanes[bank] = lanes
                if o.lanes == LaneOp.WRITE_OPEN:
                    self.chunk[s] = chunk

        emit = o.emit
        if role is not None and emit in (Emit.CLOSE, Emit.ABSORB, Emit.CLOSE_AS_IS):
            return self._level_update(emit, role, payload, s, job, w, group, cur, bank, chunk,
                                      count, bit, version, nbytes)
        if emit == Emit.CLOSE:
            return self._close(s, job, w, group, cur, bank, chunk, count + 1,
                               self.bitmap[s] | bit, version, nbytes)
        if emit == Emit.ABSORB:
            self.count[s] = count + 1
            self.bitmap[s] |= bit
            return None
        if emit == Emit.RESYNC:
            return REPLY, 0, self._resync(s, version, job, w, echo, o.reason)
        if emit == Emit.ACK:
            return REPLY, 0, _HDR.pack(version, Op.ACK, echo, mode, job, w, 0, s,
                                       wire.install_tag(epoch), quorum, r, chunk, 0)
        if emit == Emit.RESEND:
            head = _HDR.pack(version, Op.RESULT, Flag.RESEND | echo, self.res_mode[s], job, w,
                             self.res_count[s], s, wire.install_tag(epoch), self.res_quorum[s],
                             r, self.res_chunk[s], self.res_bitmap[s])
            return REPLY, 0, head + self.lanes[2 * s + (r & 1)].astype(_BE).tobytes()
        if emit == Emit.CLOSE_AS_IS:
            return self._close(s, job, w, group, cur, bank, self.chunk[s], count,
                               self.bitmap[s], version, nbytes)
        return None

    def _behind(self, seq_index: int, r: int, epoch: int) -> bool:
        """Step 10's window: the cell counted a number 1 .. ASYNC_WINDOW - 1 after `r` in this
        install, so `r` is an older contribution of the member's on the slot, counted or given
        up (its owner sends a slot's contributions one at a time, each numbered after the last)."""
        return (self.member_epoch[seq_index] == epoch
                and wire.behind_counted(r, self.member_seq[seq_index]))

    def _refuse(self, seq_index: int, r: int, epoch: int, kept: bool) -> None:
        """Step 8's refusal mark: `r` was answered "not counted" and never will be, should a
        copy of it meet the slot in another mode (a duplicate behind a swap into async).
        `kept`: the cell says `r` counted, or a newer contribution within the async window
        (a late copy of an older one must not erase that: its owner, asking about the newer
        one, would be told "not counted" and carry what was summed)."""
        if not kept:
            self.member_seq[seq_index] = r
            self.member_epoch[seq_index] = wire.refused_mark(epoch)

    def _join_marked(self, seq_index: int, r: int, epoch: int) -> bool:
        return (self.member_epoch[seq_index] == wire.refused_mark(epoch)
                and self.member_seq[seq_index] == ~r & _U32)

    def _mark_join(self, seq_index: int, r: int, epoch: int, counted: bool, spent: bool) -> None:
        """Step 9's JOIN mark: a JOIN at `r` answered NOT_JOINED with no round open leaves
        `~r` under the refusal mark, so that a copy of it (a duplicate the network made) that
        meets round `r` once it opened is answered NOT_JOINED too; the first JOIN that meets
        the mark spends it, so the worker's next JOIN, sent `join_after` later, counts."""
        if spent:
            self.member_epoch[seq_index] = 0
        elif not counted:
            self.member_seq[seq_index] = ~r & _U32
            self.member_epoch[seq_index] = wire.refused_mark(epoch)

    def _start_afresh(self, s: int, epoch: int) -> None:
        """A fresh slot (protocol.md §4 step 8): round 0, nothing open, nothing to resend
        (and, at a spine or a leaf, no weight and no sum at the spine)."""
        self.slot_epoch[s] = epoch
        self.round[s] = self.count[s] = self.bitmap[s] = self.chunk[s] = 0
        self.res_valid[s] = False
        self.weight[s] = 0
        self.up_pending[s] = False

    def _close(self, s: int, job: int, w: int, group: int, cur: int, bank: int, chunk: int,
               count: int, bitmap: int, version: int, nbytes: int) -> tuple[int, int, bytes]:
        self._closes.count(job * wire.MAX_WORKERS + w, nbytes)
        mode, quorum = self.mode[s], self.quorum[s]
        self.res_bitmap[s], self.res_count[s], self.res_chunk[s] = bitmap, count, chunk
        self.res_mode[s], self.res_quorum[s] = mode, quorum
        self.res_valid[s] = True
        self.round[s] = (cur + 1) & _U32
        self.count[s] = 0
        self.bitmap[s] = 0
        self.weight[s] = 0
        head = _HDR.pack(version, Op.RESULT, 0, mode, job, w, count, s,
                         wire.install_tag(self.slot_epoch[s]), quorum, cur, chunk, bitmap)
        return MULTICAST, group, head + self.lanes[bank].astype(_BE).tobytes()

    def _resync(self, s: int, version: int, job: int, w: int, echo: int, reason: int) -> bytes:
        return _HDR.pack(version, Op.RESYNC, echo, self.mode[s], job, w, self.count[s], s, reason,
                         self.quorum[s], self.round[s], self.chunk[s], self.bitmap[s])

    # ----------------------------------------- two levels (docs/protocol.md §11)
    def _level_update(self, emit: Emit, role: JobRole, payload: bytes, s: int, job: int, w: int,
                      group: int, cur: int, bank: int, chunk: int, count: int, bit: int,
                      version: int, nbytes: int) -> tuple[int, int, bytes] | None:
        """A counted contribution at a spine (weighed by the hosts in it) or a leaf (whose
        close goes up to the spine, one sum there per slot at a time)."""
        if role.spine:
            hosts = payload[_COUNT]
            if emit == Emit.ABSORB:
                self.count[s] = count + 1
                self.bitmap[s] |= bit
                self.weight[s] += hosts
                return None
            # The weight is the RESULT's count byte: leaves that claim more than 255 hosts
            # between them wrap it, as a P4 bit<8> field does (a two-level job has at most 255).
            if emit == Emit.CLOSE:
                return self._close(s, job, w, group, cur, bank, chunk,
                                   (self.weight[s] + hosts) & 0xFF, self.bitmap[s] | bit,
                                   version, nbytes)
            return self._close(s, job, w, group, cur, bank, self.chunk[s], self.weight[s] & 0xFF,
                               self.bitmap[s], version, nbytes)
        pending = self.up_pending[s]
        if emit == Emit.ABSORB or emit == Emit.CLOSE and pending:
            # While a sum is at the spine the open round absorbs and waits: it closes on a
            # member's first packet after the verdict (the close on a retransmission).
            self.count[s] = count + 1
            self.bitmap[s] |= bit
            return None
        if pending:  # CLOSE_AS_IS: the same wait
            return None
        if emit == Emit.CLOSE:
            return self._close_up(s, job, w, cur, chunk, count + 1, self.bitmap[s] | bit,
                                  version, role, nbytes)
        return self._close_up(s, job, w, cur, self.chunk[s], count, self.bitmap[s], version,
                              role, nbytes)

    def _close_up(self, s: int, job: int, w: int, cur: int, chunk: int, count: int, bitmap: int,
                  version: int, role: JobRole, nbytes: int) -> tuple[int, int, bytes]:
        """A leaf's close: the sum stays in bank cur & 1 and goes up as the leaf's CONTRIB;
        there is no result to resend until the spine's verdict comes back."""
        self._closes.count(job * wire.MAX_WORKERS + w, nbytes)
        self.up_pending[s] = True
        self.up_round[s], self.up_bitmap[s], self.up_count[s], self.up_chunk[s] = (
            cur, bitmap, count, chunk)
        self.res_valid[s] = False
        self.round[s] = (cur + 1) & _U32
        self.count[s] = 0
        self.bitmap[s] = 0
        return self._uplink(s, job, version, role, retransmit=False)

    def _uplink(self, s: int, job: int, version: int, role: JobRole,
                retransmit: bool) -> tuple[int, int, bytes]:
        tx = (self.up_tx[s] + 1) & (wire.TX_MASK >> wire.TX_SHIFT)
        self.up_tx[s] = tx
        r = self.up_round[s]
        flags = tx << wire.TX_SHIFT | (Flag.RETRANSMIT if retransmit else 0)
        head = _HDR.pack(version, Op.CONTRIB, flags, self.mode[s], job, role.uplink.uplink_id,
                         self.up_count[s], s, 0, self.quorum[s], r, self.up_chunk[s], 0)
        return UPLINK, job, head + self.lanes[2 * s + (r & 1)].astype(_BE).tobytes()

    def _pending_round(self, s: int, job: int, w: int, r: int, version: int, echo: int,
                       epoch: int, role: JobRole, nbytes: int) -> tuple[int, int, bytes]:
        """A host's packet for the round whose sum is at the spine: from a host in the sum it
        asks again (its result or the uplink was lost), which is the uplink's only
        retransmission (switches have no timers); from any other host it is late."""
        if self.up_bitmap[s] >> w & 1:
            self._drop(job, DropReason.UPLINK_RESENT, nbytes)
            return self._uplink(s, job, version, role, retransmit=True)
        self._refuse_unless_later(s * wire.MAX_WORKERS + w, r, epoch)
        self._drop(job, DropReason.STALE, nbytes)
        self._stale.count(job * wire.MAX_WORKERS + w, nbytes)
        return REPLY, 0, self._resync(s, version, job, w, echo, ResyncReason.STALE_ROUND)

    def _refuse_unless_later(self, seq_index: int, r: int, epoch: int) -> None:
        """The refusal mark at a leaf or a spine: never over a cell that says the member was
        counted in `r` or a later round (a late copy of an older contribution must not erase
        that a newer one counted: its owner, asking about it, would carry what was summed)."""
        if self.member_epoch[seq_index] != epoch or serial_after(r, self.member_seq[seq_index]):
            self.member_seq[seq_index] = r
            self.member_epoch[seq_index] = wire.refused_mark(epoch)

    def _refuse_hosts(self, s: int, hosts: int, r: int, epoch: int) -> None:
        """The spine did not count the leaf's sum of round `r`: each of its hosts reads "not
        counted in r" from now on, over the leaf's own "counted", unless its cell is about a
        later round. (The P4 programs write one cell per packet and replicate the verdict to
        the recirculation port, one copy per host; here the loop is that replication.)"""
        mark = wire.refused_mark(epoch)
        base = s * wire.MAX_WORKERS
        while hosts:
            low = hosts & -hosts
            hosts ^= low
            i = base + low.bit_length() - 1
            if self.member_epoch[i] in (epoch, mark) and serial_after(self.member_seq[i], r):
                continue
            self.member_seq[i] = r
            self.member_epoch[i] = mark

    def _verdict(self, payload: bytes, src_ip: int, role: JobRole,
                 nbytes: int) -> tuple[int, int, bytes] | None:
        """A RESULT or RESYNC that reached a leaf of its job: the spine's answer to an uplink,
        or a round the spine closed. Admitted from the uplink's spine address only."""
        (version, op, flags, mode, job, w, count, s, reason, quorum, r, chunk,
         bitmap) = _HDR.unpack_from(payload)
        size = len(payload)
        if src_ip != role.uplink.spine_addr:
            self._drop(job, DropReason.NOT_MEMBER, nbytes)
            return None
        if op == Op.RESULT and size < wire.PACKET_BYTES:
            self._drop(job, DropReason.MALFORMED, nbytes)
            return None
        if version != wire.VERSION:
            self._drop(job, DropReason.BAD_VERSION, nbytes)
            return None
        if size != (wire.PACKET_BYTES if op == Op.RESULT else wire.HEADER_BYTES):
            self._drop(job, DropReason.BAD_LENGTH, nbytes)
            return None
        job_cfg = self._jobs.get(job)
        if job_cfg is None:
            self._drop(job, DropReason.NO_JOB, nbytes)
            return None
        slot_base, slot_count, _members, group, epoch = job_cfg
        if not slot_base <= s < slot_base + slot_count or s >= self.num_slots:
            self._drop(job, DropReason.SLOT_RANGE, nbytes)
            return None
        if self.slot_epoch[s] != epoch:
            self._start_afresh(s, epoch)
        if op == Op.RESULT:
            # Every switch of a job runs the same install: a result of another one (a spine
            # restarted, the job added again) belongs to no sum here.
            if reason != wire.install_tag(epoch):
                self._drop(job, DropReason.STALE, nbytes)
                return None
            return self._spine_result(payload, s, version, mode, job, w, count, quorum, r,
                                      chunk, bitmap, role, epoch, group, nbytes)
        return self._spine_resync(s, version, flags, mode, job, w, reason, quorum, r, chunk,
                                  epoch, group, nbytes)

    def _spine_result(self, payload: bytes, s: int, version: int, mode: int, job: int, w: int,
                      count: int, quorum: int, r: int, chunk: int, bitmap: int, role: JobRole,
                      epoch: int, group: int, nbytes: int) -> tuple[int, int, bytes] | None:
        cur = self.round[s]
        if self.up_pending[s] and r == self.up_round[s]:
            # The answer to the sum: the hosts' bits go down only with the leaf's own.
            self.up_pending[s] = False
            hosts = self.up_bitmap[s]
            if not bitmap >> role.uplink.uplink_id & 1:
                self._refuse_hosts(s, hosts, r, epoch)
                hosts = 0
        elif not serial_after(cur, r):
            # A round the spine closed without this rack: what the leaf had open can no
            # longer reach the spine. A sum pending for an earlier round stays pending.
            self._refuse_hosts(s, self.bitmap[s], cur, epoch)
            self.round[s] = (r + 1) & _U32
            self.count[s] = self.bitmap[s] = 0
            hosts = 0
        else:
            self._drop(job, DropReason.DUPLICATE, nbytes)
            return None
        lanes = payload[wire.HEADER_BYTES:wire.PACKET_BYTES]
        # Only the last round's result is kept for RESENDs: a verdict that the spine's
        # multicast delivered behind a later round's is relayed, not stored.
        if r == (self.round[s] - 1) & _U32:
            self.lanes[2 * s + (r & 1)] = np.frombuffer(lanes, _BE)
            self.res_bitmap[s], self.res_count[s], self.res_chunk[s] = hosts, count, chunk
            self.res_mode[s], self.res_quorum[s] = mode, quorum
            self.res_valid[s] = True
        head = _HDR.pack(version, Op.RESULT, 0, mode, job, w, count, s, wire.install_tag(epoch),
                         quorum, r, chunk, hosts)
        return MULTICAST, group, head + lanes

    def _spine_resync(self, s: int, version: int, flags: int, mode: int, job: int, w: int,
                      reason: int, quorum: int, r: int, chunk: int, epoch: int, group: int,
                      nbytes: int) -> tuple[int, int, bytes] | None:
        """The spine's RESYNC answering the latest uplink (the echo ties them): the sum is
        counted (STALE_COUNTED: its result is gone) or not, then relayed to its hosts."""
        if not self.up_pending[s] or flags & wire.TX_MASK != self.up_tx[s] << wire.TX_SHIFT:
            self._drop(job, DropReason.STALE, nbytes)
            return None
        self.up_pending[s] = False
        out = None
        if reason != ResyncReason.STALE_COUNTED:
            hosts = self.up_bitmap[s]
            self._refuse_hosts(s, hosts, self.up_round[s], epoch)
            # Which flight it settles: a STALE_ROUND names it by the sum's chunk (the spine's
            # round may be ahead of it); a CHUNK_MISMATCH answers the spine's open round, the
            # sum's, and carries the chunk that round aggregates, which the hosts send instead.
            about = chunk if reason == ResyncReason.CHUNK_MISMATCH else self.up_chunk[s]
            out = MULTICAST_BITMAP, group, _HDR.pack(
                version, Op.RESYNC, Flag.RELAYED, mode, job, w, 0, s, reason, quorum, r,
                about, hosts)
        cur = self.round[s]
        if serial_after(r, cur):
            # Forward: a RESYNC delayed behind later results must not take the leaf back to a
            # round its hosts are past.
            self._refuse_hosts(s, self.bitmap[s], cur, epoch)
            self.round[s] = r
            self.count[s] = self.bitmap[s] = 0
            self.res_valid[s] = False
        elif (reason == ResyncReason.CHUNK_MISMATCH and r == self.up_round[s]
              and cur == (r + 1) & _U32):
            # Back by one: the spine's open round r waits on this rack with another chunk, and
            # no result of r exists anywhere, so r opens again here (nothing in it) for the
            # chunk the hosts were told; what the leaf held open at r + 1 can go up no more.
            self._refuse_hosts(s, self.bitmap[s], cur, epoch)
            self.round[s] = r
            self.count[s] = self.bitmap[s] = 0
            self.res_valid[s] = False
        return out

    def _replicas(self, group: int, nbytes: int,
                  only: int | None = None) -> list[tuple[int, tuple[int, ...]]]:
        """Egress for a result: each replica's port and rewrite (dst mac, ip, udp port);
        with `only`, the replicas of the workers whose bits it holds.

        A replica without a rewrite entry is dropped: the controller installs both together.
        """
        out = []
        for replica in self.groups.get(group, ()):
            if only is not None and not only >> (replica.rid - 1) % wire.MAX_WORKERS & 1:
                continue
            rewrite = self._rewrite.get(replica.rid)
            if rewrite is None:
                continue
            self._results.count(replica.rid - 1, nbytes)
            out.append((replica.port, rewrite))
        return out

    # ------------------------------------------------ UDP data plane path
    def process_datagram(self, src_ip: int, src_port: int,
                         payload: bytes) -> list[tuple[int, int, bytes]]:
        """A datagram that arrived on the HySync UDP socket -> [(dst_ip, dst_port, datagram)]."""
        nbytes = _FRAME_OVERHEAD + len(payload)
        emit = self._aggregate(payload, src_ip, src_port, nbytes)
        if emit is None:
            return []
        kind, group, out = emit
        out_bytes = _FRAME_OVERHEAD + len(out)
        if kind == REPLY:
            if out[_OP] == Op.RESULT:
                self._results.count(_member_of(out), out_bytes)
            return [(src_ip, src_port, out)]
        if kind == UPLINK:
            return [(self._roles[group].uplink.spine_addr, wire.HYSYNC_UDP_PORT, out)]
        return [(rw[1], rw[2], out)
                for _, rw in self._replicas(group, out_bytes, _only(kind, out))]

    # ------------------------------------------------------ frame path
    def process_frame(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """One Ethernet frame in, every (egress port, frame) the P4 program emits for it."""
        nbytes = len(frame)
        parsed = _parse(frame)
        if parsed is None:  # parser error before the HySync header
            self._drop(0, DropReason.MALFORMED, nbytes)
            return []
        eth, ip, udp_ports, payload = parsed
        if payload is None:
            return self._forward(ingress_port, frame, eth)
        ip_len = int.from_bytes(ip[2:4], "big")
        udp_len = int.from_bytes(frame[38:40], "big")
        src_ip = int.from_bytes(ip[12:16], "big")
        if (len(payload) >= wire.HEADER_BYTES and payload[_OP] == Op.CONTRIB
                and len(payload) >= wire.PACKET_BYTES and payload[0] == wire.VERSION
                and (ip_len != _EXPECTED_IP_LEN or udp_len != _EXPECTED_UDP_LEN
                     or nbytes != wire.HYSYNC_OFFSET + wire.PACKET_BYTES)):
            job = int.from_bytes(payload[_JOB:_JOB + 2], "big")
            self._drop(job, DropReason.BAD_LENGTH, nbytes)
            return []
        # The P4 parser extracts exactly one header + lanes; trailing bytes are
        # caught by the length check above, so the model sees the parsed bytes only.
        has_lanes = len(payload) > _OP and payload[_OP] in (Op.CONTRIB, Op.RESULT)
        parsed_len = wire.PACKET_BYTES if has_lanes else wire.HEADER_BYTES
        emit = self._aggregate(payload[:parsed_len] if len(payload) >= parsed_len else payload,
                               src_ip, udp_ports[0], nbytes)
        if emit is None:
            return []
        kind, group, out = emit
        out_len = wire.HYSYNC_OFFSET + len(out)
        if kind == REPLY:
            if out[_OP] == Op.RESULT:
                self._results.count(_member_of(out), out_len)
            frame_out = _build(eth[0:6], eth[6:12], ip, ip[16:20], ip[12:16], udp_ports[0], out)
            return [(ingress_port, frame_out)]
        if kind == UPLINK:
            uplink = self._roles[group].uplink
            port = self._l2.get(uplink.spine_mac)
            if port is None:  # the controller installs the spine's L2 entry with the role
                return []
            return [(port, _build(eth[0:6], uplink.spine_mac.to_bytes(6, "big"), ip,
                                  uplink.leaf_addr.to_bytes(4, "big"),
                                  uplink.spine_addr.to_bytes(4, "big"), wire.HYSYNC_UDP_PORT,
                                  out))]
        return [(port, _build(eth[0:6], rw[0].to_bytes(6, "big"), ip, ip[16:20],
                              rw[1].to_bytes(4, "big"), rw[2], out))
                for port, rw in self._replicas(group, out_len, _only(kind, out))]

    def _forward(self, ingress_port: int, frame: bytes, eth: bytes) -> list[tuple[int, bytes]]:
        port = self._l2.get(int.from_bytes(eth[0:6], "big"))
        if port is not None:
            return [(port, frame)]
        return [(replica.port, frame) for replica in self.groups.get(wire.FLOOD_MCAST_GROUP, ())
                if replica.port != ingress_port]


def _index(name: str, entries: Iterable[Entry]) -> tuple[str, Any]:
    """(attribute, value): the lookup index the packet path reads for table `name`."""
    if name == p4names.ADMISSION_MEMBERS:
        return "_members", {e.match for e in entries}
    if name == p4names.ADMISSION_JOBS:
        return "_jobs", {e.match[0]: e.params for e in entries}
    if name == p4names.ADMISSION_ROLES:
        roles = ((e.match[0], role_of_params(e.params)) for e in entries)
        return "_roles", {job: role for job, role in roles if role.level != Level.SINGLE}
    if name == p4names.SYNC_MODE_MODES:
        modes: dict[int, list[tuple[int, ...]]] = {}
        for e in entries:
            lo, hi = e.match[1]  # type: ignore[misc]
            modes.setdefault(e.match[0], []).append(  # type: ignore[arg-type]
                (-e.priority, lo, hi, *e.params))
        return "_modes", {job: sorted(rows) for job, rows in modes.items()}
    if name == p4names.FORWARDING_L2:
        return "_l2", {e.match[0]: e.params[0] for e in entries}
    if name == p4names.REPLICATION_REWRITE:
        return "_rewrite", {e.match[0]: e.params for e in entries}
    raise KeyError(f"no table {name} in the pipeline")


def _only(kind: int, datagram: bytes) -> int | None:
    """The workers a MULTICAST_BITMAP reaches: those whose bits its bitmap holds."""
    if kind != MULTICAST_BITMAP:
        return None
    return int.from_bytes(datagram[_BITMAP:_BITMAP + 4], "big")


def _member_of(datagram: bytes) -> int:
    job = int.from_bytes(datagram[_JOB:_JOB + 2], "big")
    return job * wire.MAX_WORKERS + datagram[_WORKER]


def _parse(frame: bytes) -> tuple[bytes, bytes, tuple[int, int], bytes | None] | None:
    """The P4 parser: (ethernet, ipv4, (udp src, dst), hysync payload or None), None = error."""
    if len(frame) < wire.ETH_BYTES:
        return None
    eth = frame[:wire.ETH_BYTES]
    if int.from_bytes(eth[12:14], "big") != wire.ETHERTYPE_IPV4:
        return eth, b"", (0, 0), None
    if len(frame) < wire.ETH_BYTES + wire.IPV4_BYTES:
        return None
    ip = frame[wire.ETH_BYTES:wire.ETH_BYTES + wire.IPV4_BYTES]
    if ip[0] != 0x45 or ip[9] != wire.IPPROTO_UDP:
        return eth, ip, (0, 0), None
    if len(frame) < wire.HYSYNC_OFFSET:
        return None
    src_port, dst_port, _, _ = wire.UDP_STRUCT.unpack_from(frame, wire.ETH_BYTES + wire.IPV4_BYTES)
    if dst_port != wire.HYSYNC_UDP_PORT:
        return eth, ip, (src_port, dst_port), None
    return eth, ip, (src_port, dst_port), frame[wire.HYSYNC_OFFSET:]


def _build(src_mac: bytes, dst_mac: bytes, ip_in: bytes, src_ip: bytes, dst_ip: bytes,
           dst_port: int, datagram: bytes) -> bytes:
    """A switch-generated frame: IPv4 fields copied from the trigger, lengths and checksum new."""
    ip = bytearray(ip_in)
    ip[2:4] = (wire.IPV4_BYTES + wire.UDP_BYTES + len(datagram)).to_bytes(2, "big")
    ip[10:12] = b"\x00\x00"
    ip[12:16] = src_ip
    ip[16:20] = dst_ip
    ip[10:12] = wire.ipv4_checksum(ip).to_bytes(2, "big")
    udp = wire.UDP_STRUCT.pack(wire.HYSYNC_UDP_PORT, dst_port, wire.UDP_BYTES + len(datagram), 0)
    return wire.ETH_STRUCT.pack(dst_mac, src_mac, wire.ETHERTYPE_IPV4) + bytes(ip) + udp + datagram
