"""The register plan of p4src/tna/hysync.p4 in Python, as a conformance target.

No Tofino model runs here (docs/tofino.md, "The ASIC model"), so the TNA program's
*design* is held to the conformance suite through this transliteration of its slot state
(include/control/slot_registers.p4 and aggregation.p4): the same registers with the same
encodings (round-tagged latches, member_seq + 1, count with the CLOSING bit), the same
one-action-per-register-per-pass rule, and the close (and an async round) finished in a
later pass. It decides by the rows of the program's decision tables
(hysync/protocol_spec/tna_tables.py: classify, and verdict as generated from the decision table),
on the register answers it computes the program's way. It checks the state machine and
those rows, not the rest of the P4 code: only a Tofino (or its model) runs that.

`recirculate` decides when a later pass runs: at once (the default, as if the
recirculation took no time), or later, so that a test can put packets between a close's
decision and the pass that advances its round (the window of docs/tofino.md,
difference 2).

On the switch the lanes act in lane passes after the decision (a close's sums, a
resend's read, an absorbed contribution's add), and on Tofino 1 the decision itself takes
two passes (the first pass latches, a DECIDE pass counts). The model decides and applies
each lane op at once. That is the same: every later pass goes through the pipe's one
recirculation queue, so a packet's k-th later pass comes after the k-th later pass of
every packet whose first pass came before its own; so DECIDE passes count in the order
their first passes latched, a round's close is decided before any contribution its
advance lets open the next round, and the lane ops on a bank come in the order they were
decided (a contribution that arrives while a close is under way meets the CLOSING mark;
the bank's next round cannot open before the advance). The result header is stored per
bank, like the lanes, when the close is decided: a resend of round r reads bank r & 1,
which only round r + 2's close writes again. The one case where the passes are not the
same (an async bank write between a resend's lane passes, after a swap away from async,
which the controller never makes on Tofino) is in docs/tofino.md, difference 3.

A job's level (the roles table, protocol.md §11) is the Tofino 2 program's: a spine weighs
each counted uplink by its count byte in `Weight` (t_weight), whose answer is every RESULT's
count; no job is a leaf here (a leaf entry runs the job at one level, as the program reads
the level alone; the controller writes none), so a RESULT or RESYNC is never a verdict.

The install epoch (protocol.md §4 step 8) follows the TNA plan too: `slot_epoch` is read
in the first pass; a contribution that meets another install's epoch changes nothing and
takes a *reset pass* (the round, tagged with its epoch, back to 0 and the latches
cleared), then a *retry pass*, a first pass again. `member_seq` holds a hash of the round
and the epoch, the round plus a hash of the epoch, so that one install's numbers keep their
distances (docs/tofino.md, "The install epoch"; protocol.md §4 step 10, the async window).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from hysync import wire
from hysync.protocol_spec import tna_tables
from hysync.protocol_spec.decision import Counter, Verdict
from hysync.protocol_spec.tna_tables import Action
from hysync.softswitch.pipeline import MULTICAST, REPLY, Pipeline
from hysync.wire import DropReason, Flag, Mode, Op

from .targets import SoftswitchTarget
from .topology import PORTS

_BE = np.dtype(">i4")
_U32 = 0xFFFFFFFF
CLOSING = -(1 << 31)
LATCHED = 0x10000


def _pack(head: dict[str, int]) -> bytes:
    """The header fields by name, in wire order (hysync/wire.py owns the layout)."""
    return wire.HEADER_STRUCT.pack(*(head[name] for name, _ in wire.HEADER_FIELDS))


def _int32(value: int) -> int:
    value &= _U32
    return value - (1 << 32) if value & 0x80000000 else value


def seq_key(r: int, epoch: int) -> int:
    """What member_seq holds for round (or sequence number) r of an install: r plus the P4's
    CRC32 hash unit over the epoch. Within an install, two keys differ as their numbers do
    (the async window compares them); a cell written in another epoch matches with
    probability 2^-32, as two installs draw one epoch, and reads as behind with probability
    (ASYNC_WINDOW - 1) / 2^32."""
    return (r + zlib.crc32(struct.pack("!I", epoch))) & _U32


@dataclass
class SecondPass:
    """A recirculated packet: what its next pass does (pass_t) and the RESULT it carries."""
    kind: str           # "close", "async", "resend", "reset" (then "retry": a first pass)
    s: int
    head: dict[str, int]  # the HySync header, by field name
    lanes: np.ndarray
    group: int
    port_back: bool     # resend: unicast back to the sender
    frame: tuple[int, bytes]   # the contribution (port, frame) that took it
    epoch: int = 0      # reset: the install whose epoch the slot takes


class TnaModelPipeline(Pipeline):
    """Pipeline (tables, counters, parser, egress) with the TNA slot state machine."""

    def __init__(self, num_slots: int = wire.NUM_SLOTS) -> None:
        self.hold = False                   # keep second passes pending (the window)
        self.pending: list[SecondPass] = []
        self._forced: tuple[int, int, bytes] | None = None
        self._frame: tuple[int, bytes] = (0, b"")   # the frame in the pipeline now
        self._args: tuple[bytes, int, int, int] = (b"", 0, 0, 0)   # and its _aggregate
        super().__init__(num_slots)

    def reset_registers(self) -> None:
        super().reset_registers()
        n = self.num_slots
        self.t_round = [(0, 0)] * n         # (round, epoch)
        self.t_slot_epoch = [0] * n
        self.t_mode = [(0, 0)] * n          # (tag, packed mode)
        self.t_chunk = [(0, 0)] * n         # (round + 1, chunk)
        self.t_bitmap = [0] * n
        self.t_member_seq = [0] * (n * wire.MAX_WORKERS)   # seq_key(seq, epoch)
        self.t_count = [0] * n              # int32; CLOSING bit while a close is under way
        self.t_weight = [0] * n             # uint8: the hosts in the open round's sum
        # per bank, 2s + (round & 1): (bitmap, count << 16 | mode << 8 | quorum, chunk)
        self.t_res = [(0, 0, 0)] * (2 * n)
        self.t_lanes = np.zeros((2 * n, wire.LANES), dtype=np.int32)

    def open_round(self, s: int, epoch: int) -> tuple[int, int, int, int] | None:
        """(mode, quorum, count, bitmap) of slot s's open round of install `epoch`, read the
        program's way: a round is under way when the mode latch is tagged with the open
        round (only the contribution that opens a round latches it); None when no round is
        (or the slot holds another install's state)."""
        cur, round_epoch = self.t_round[s]
        tag, packed = self.t_mode[s]
        if self.t_slot_epoch[s] != epoch or round_epoch != epoch or tag != cur or not packed \
                or self.t_count[s] <= 0:
            return None
        return packed >> 8 & 0xFF, packed & 0xFF, self.t_count[s], self.t_bitmap[s]

    def process_frame(self, ingress_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        self._frame = (ingress_port, frame)
        return super().process_frame(ingress_port, frame)

    def _aggregate(self, payload: bytes, src_ip: int, src_port: int,
                   nbytes: int) -> tuple[int, int, bytes] | None:
        if self._forced is not None:   # release(): a held second pass leaves now
            emit, self._forced = self._forced, None
            return emit
        self._args = (payload, src_ip, src_port, nbytes)
        # The program reads a job's level only to weigh a spine's members: a RESULT or
        # RESYNC is never a verdict on a sum here (it runs no leaf), §4 step 3 drops it.
        admitted = self._admit(payload, src_ip, src_port, nbytes)
        return None if admitted is None else self._slot_update(payload, admitted, nbytes)

    def _slot_update(self, payload: bytes, admitted: tuple[int, ...],
                     nbytes: int) -> tuple[int, int, bytes] | None:
        version, job, w, s, r, chunk, members, group, epoch = admitted
        flags = payload[wire.FIELD_OFFSET["flags"]]
        join, echo = flags & Flag.JOIN, flags & wire.TX_MASK   # replies echo the tx number
        desired_mode, desired_quorum = self._desired_mode(job, s)
        desired = LATCHED | desired_mode << 8 | desired_quorum
        me, member = 1 << w, job * wire.MAX_WORKERS + w
        seq_cell = s * wire.MAX_WORKERS + w
        key = seq_key(r, epoch)
        lanes = np.frombuffer(payload, ">i4", wire.LANES, wire.HEADER_BYTES).astype(np.int32)

        # 1. Round: read.
        cur = self.t_round[s][0]
        is_open = r == cur
        prev = (r + 1) & _U32 == cur and cur != 0   # round 0: nothing closed in this epoch
        desired_async = desired_mode == Mode.ASYNC
        # 2. SlotEpoch, ModeLatch and ChunkLatch: latch for an opening contribution (a JOIN
        # never opens a round), else read. The latches act before the epoch is known: a
        # reset pass clears what they wrote for another install.
        stale_epoch = self.t_slot_epoch[s] != epoch
        tag, packed = self.t_mode[s]
        chunk_tag, stored_chunk = self.t_chunk[s]
        if is_open and not desired_async and not join:
            latched = packed if tag == r and packed else 0
            if not latched:
                self.t_mode[s] = (r, desired)
            if chunk_tag != (r + 1) & _U32:
                self.t_chunk[s] = ((r + 1) & _U32, chunk)
        else:
            latched = packed if tag == cur and packed else 0
        # 3. classify: the program's generated rows.
        f = tna_tables.classify(dict(epoch_differs=int(stale_epoch), latched=latched,
                                     desired_mode=desired_mode, diff=(r - cur) & _U32,
                                     flags=flags))
        if f.stale:   # another install's slot: nothing counts until it is reset
            return self._recirculate(SecondPass("reset", s, [], lanes, group, False,
                                                self._frame, epoch))
        async_path, not_joined = bool(f.async_path), bool(f.not_joined)
        fresh, open_sync = bool(f.fresh), bool(f.open_sync)
        mode, quorum = ((desired_mode, desired_quorum) if latched == 0
                        else (latched >> 8 & 0xFF, latched & 0xFF))
        q = members if quorum == 0 or quorum > members else quorum
        chunk_ok = fresh or stored_chunk == chunk
        # 4. Bitmap and MemberSeq.
        if fresh:
            self.t_bitmap[s], stored_bits = me, 0
        else:
            stored_bits = self.t_bitmap[s]
            if open_sync and chunk_ok:
                self.t_bitmap[s] = stored_bits | me
        # The async path's swap keeps a cell that counted a number after r (the async window).
        stored_seq = self.t_member_seq[seq_cell]
        behind = async_path and not join and 0 < (stored_seq - key) & _U32 < wire.ASYNC_WINDOW
        if (async_path and not join and not behind) or (open_sync and chunk_ok):
            self.t_member_seq[seq_cell] = key
        duplicate = stored_seq == key
        # 5. Count, with the close guard (slot_registers.p4, Count): the count after this
        # packet (CLOSING set: it closes the round), or 0 where the guard refused it.
        stored_count = self.t_count[s]
        if open_sync and fresh:
            count_out = CLOSING + 1 if q == 1 else 1
            self.t_count[s] = count_out
        elif open_sync and chunk_ok and duplicate:
            count_out = _int32(stored_count + CLOSING) if stored_count >= q else 0
            if count_out:
                self.t_count[s] = count_out
        elif open_sync and chunk_ok:
            count_out = 0
            if stored_count >= 0:
                count_out = _int32(stored_count + (CLOSING + 1 if stored_count + 1 >= q else 1))
                self.t_count[s] = count_out
        else:
            count_out = stored_count
        # 5'. Weight (HYSYNC_ROLES): the hosts in the sum, after Count. A spine's member is a
        # leaf whose uplink's count byte is the hosts in its sum; anywhere else 1 (so that
        # it is count's low byte). Eight bits, wrapping as the RESULT's count byte does.
        role = self._roles.get(job)
        weight_inc = payload[wire.FIELD_OFFSET["count"]] if role is not None and role.spine \
            else 1
        if open_sync and fresh:
            self.t_weight[s] = weight_inc
        elif open_sync and chunk_ok and not duplicate and count_out != 0:
            self.t_weight[s] = (self.t_weight[s] + weight_inc) & 0xFF
        weight_out = self.t_weight[s]

        # 6. The verdict: the program's generated rows, then what their action does.
        keys = dict(
            not_joined=int(not_joined), async_path=int(async_path), join=int(bool(join)),
            open_sync=int(open_sync), fresh=int(fresh), chunk_ok=int(chunk_ok), prev=int(prev),
            latched=int(latched != 0), counted=int(duplicate), behind=int(behind),
            count_out=count_out & _U32,
            closes=int(count_out < 0))
        assert tna_tables.is_answer(keys), (
            f"the TNA passes produced {keys}, which hysync/protocol_spec/tna_tables.py answers() "
            "leaves out: the generated verdict rows were not derived for it")
        o = tna_tables.decide(keys)
        tag = wire.install_tag(epoch)   # RESULT and ACK; a RESYNC puts its reason there
        head = dict(version=version, op=Op.RESULT, flags=0, mode=mode, job_id=job, worker_id=w,
                    count=weight_out, slot=s, reason=tag, quorum=quorum, round=cur,
                    chunk=chunk, bitmap=0)
        bank = 2 * s + (cur & 1)
        closes = o.verdict == Verdict.CLOSE
        if o.action in (Action.RESYNC, Action.RESYNC_ROUND):
            self._drop(job, o.drop, nbytes)
            if o.counter == Counter.STALE:
                self._stale.count(member, nbytes)
            with_round = o.action == Action.RESYNC_ROUND
            return REPLY, 0, self._resync_tna(head, o.reason, echo, stored_chunk,
                                              stored_bits if with_round else 0,
                                              count_out if with_round else 0)
        if o.action == Action.ACK:
            self._drop(job, DropReason.DUPLICATE, nbytes)
            self._duplicates.count(member, nbytes)
            head.update(op=Op.ACK, flags=echo, count=0, round=r, bitmap=0)
            return REPLY, 0, _pack(head)
        if o.action == Action.ASYNC_ROUND:
            self._contributions.count(member, nbytes)
            self._closes.count(member, nbytes)
            head["count"], head["bitmap"] = 1, me
            return self._recirculate(SecondPass("async", s, head, lanes, group, False,
                                                self._frame))
        if o.action == Action.OPEN_ROUND:
            self._contributions.count(member, nbytes)
            self.t_lanes[bank] = lanes
            head["bitmap"] = me
            return self._close_first_pass(s, head, bank, group, member, nbytes) if closes \
                else None
        if o.action == Action.JOIN_ROUND:
            self._contributions.count(member, nbytes)
            self.t_lanes[bank] += lanes
            head["bitmap"] = stored_bits | me
            return self._close_first_pass(s, head, bank, group, member, nbytes) if closes \
                else None
        if o.action == Action.DUPLICATE:
            self._drop(job, DropReason.DUPLICATE, nbytes)
            self._duplicates.count(member, nbytes)
            head["bitmap"] = stored_bits
            return self._close_first_pass(s, head, bank, group, member, nbytes) if closes \
                else None
        if o.action == Action.CLOSING:   # the round's close is under way: refused
            self._drop(job, DropReason.STALE, nbytes)
            self._late.count(member, nbytes)
            return None
        assert o.action == Action.RESEND, o
        res_bitmap, res_packed, res_chunk = self.t_res[2 * s + (r & 1)]
        (self._duplicates if res_bitmap & me else self._late).count(member, nbytes)
        head = dict(version=version, op=Op.RESULT, flags=Flag.RESEND | echo,
                    mode=res_packed >> 8 & 0xFF, job_id=job, worker_id=w,
                    count=res_packed >> 16 & 0xFF, slot=s, reason=tag,
                    quorum=res_packed & 0xFF, round=r, chunk=res_chunk, bitmap=res_bitmap)
        lanes = self.t_lanes[2 * s + (r & 1)].copy()
        return self._recirculate(SecondPass("resend", s, head, lanes, group, True,
                                            self._frame))

    def _resync_tna(self, head: dict[str, int], reason: int, echo: int, chunk: int, bits: int,
                    count: int) -> bytes:
        """A RESYNC of the open round head["round"] = cur, echoing the transmission number."""
        head.update(op=Op.RESYNC, flags=echo, reason=reason, chunk=chunk, bitmap=bits,
                    count=count & 0xFF)
        return _pack(head)

    def _close_first_pass(self, s: int, head: dict[str, int], bank: int, group: int, member: int,
                          nbytes: int) -> tuple[int, int, bytes] | None:
        self._closes.count(member, nbytes)
        self._store_result(bank, head)
        return self._recirculate(SecondPass("close", s, head, self.t_lanes[bank].copy(),
                                            group, False, self._frame))

    def _store_result(self, bank: int, head: dict[str, int]) -> None:
        """ResultHeader's write: the RESULT header of the round that closes in this bank."""
        self.t_res[bank] = (head["bitmap"],
                            head["count"] << 16 | head["mode"] << 8 | head["quorum"],
                            head["chunk"])

    def _recirculate(self, second: SecondPass) -> tuple[int, int, bytes] | None:
        if self.hold:
            self.pending.append(second)
            return None
        if second.kind == "retry":   # at once: the same contribution, a first pass again
            return super()._aggregate(*self._args)
        return self.second_pass(second)

    def release(self) -> list[tuple[int, bytes]]:
        """Run the held passes, in order; what they send. The parser and deparser take the
        addresses from each pass's contribution, as on the switch. A pass that takes another
        (a reset, then its retry) leaves that one held for the next release."""
        held, self.pending = self.pending, []
        out = []
        for second in held:
            if second.kind != "retry":
                self._forced = self.second_pass(second)
                if self._forced is None:
                    continue
            out += self.process_frame(*second.frame)
        return sorted(out)

    def second_pass(self, second: SecondPass) -> tuple[int, int, bytes] | None:
        """The recirculated pass: advance the round, or take one and store the result; send
        it; or reset the slot for a new install and retry the contribution."""
        s, head = second.s, second.head
        cur, round_epoch = self.t_round[s]
        if second.kind == "reset":
            if round_epoch != second.epoch:   # the first reset pass of this install
                self.t_round[s] = (0, second.epoch)
                self.t_mode[s] = self.t_chunk[s] = (0, 0)
            self.t_slot_epoch[s] = second.epoch
            return self._recirculate(SecondPass("retry", s, [], second.lanes, second.group,
                                                False, second.frame))
        if second.kind == "close" and cur == head["round"]:
            self.t_round[s] = ((head["round"] + 1) & _U32, round_epoch)
        elif second.kind == "async":
            head["round"] = cur
            self.t_round[s] = ((cur + 1) & _U32, round_epoch)
            self.t_lanes[2 * s + (cur & 1)] = second.lanes
            self._store_result(2 * s + (cur & 1), head)
        datagram = _pack(head) + second.lanes.astype(_BE).tobytes()
        return (REPLY, 0, datagram) if second.port_back else (MULTICAST, second.group, datagram)


class TnaModelTarget(SoftswitchTarget):
    """The TNA design as a conformance target. A second pass runs right after the first,
    or, with `hold`, when `release()` is called: packets sent in between meet the round
    between its two passes, as on a switch whose recirculation takes time."""

    name = "tna-model"

    def __init__(self, num_slots: int = wire.NUM_SLOTS, *, hold: bool = False) -> None:
        self.pipeline: TnaModelPipeline = TnaModelPipeline(num_slots)
        self.pipeline.hold = hold
        self.write_group("INSERT", wire.FLOOD_MCAST_GROUP, [(p, 0) for p in PORTS])

    def restart(self) -> None:
        self.__init__(self.pipeline.num_slots, hold=self.pipeline.hold)  # type: ignore[misc]

    def send(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return sorted(self.pipeline.process_frame(port, frame))

    def release(self) -> list[tuple[int, bytes]]:
        """Run the held passes, in order; what they send."""
        return self.pipeline.release()
