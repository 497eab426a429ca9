"""The HySync wire format: the one owner of every byte on the wire.

Layout (network byte order), see docs/protocol.md for the semantics:

    Ethernet (14) / IPv4 (20, no options) / UDP (8, dst port HYSYNC_UDP_PORT)
    / HySync header (24) / payload: LANES signed 32-bit lanes (256)

The worker, the softswitch, the controller and the tests all use this module;
``p4src/shared/headers.p4`` mirrors ``HEADER_FIELDS`` and a test keeps the two
in step. Batches are numpy structured arrays so that encoding and decoding
never loop over lanes in Python.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

import numpy as np

# ---------------------------------------------------------------- constants
VERSION = 1
HYSYNC_UDP_PORT = 48620  # IANA-unassigned; one fixed port, as SwitchML
LANES = 64  # K: int32 lanes per packet (256 B of payload, as SwitchML)
MAX_WORKERS = 32  # the contributor bitmap is 32 bits wide
MAX_JOBS = 256  # job ids 1..255; job 0 collects unattributable drops
NUM_SLOTS = 8192  # aggregation slots in the switch's register pool
NUM_DROP_REASONS = 16  # width of a job's block in the drops counter
FLOOD_MCAST_GROUP = 1024  # multicast group of L2 flooding; job groups are below it


def member_index(job_id: int, worker_id: int) -> int:
    """Index of (job, worker) in the per-member counters."""
    return job_id * MAX_WORKERS + worker_id


def member_rid(job_id: int, worker_id: int) -> int:
    """Replication id of a member's replica in its job's multicast group (0 = L2 flood)."""
    return member_index(job_id, worker_id) + 1


class Op(enum.IntEnum):
    CONTRIB = 1  # worker -> switch: my lanes for (slot, round)
    RESULT = 2  # switch -> worker(s): the closed round's sum
    RESYNC = 3  # switch -> worker: your round is not served; header only
    ACK = 4  # switch -> worker: async duplicate, already counted; header only


class Mode(enum.IntEnum):
    SYNC = 0
    PARTIAL = 1
    ASYNC = 2


class Flag(enum.IntFlag):
    NONE = 0
    RETRANSMIT = 0x01  # contribution: sent again after a timeout (informational)
    RESEND = 0x02  # result: unicast copy of the stored result of the previous round
    # contribution: count me in the slot's open round if it lacks me, never open one
    # (a worker with nothing due on the slot unblocks a round waiting for it; §4 step 9)
    JOIN = 0x04
    # RESYNC: the spine's verdict on a leaf's sum, relayed by the leaf to the hosts in its
    # bitmap; it settles their flight whatever transmission it echoes (§11)
    RELAYED = 0x01


# Bits 3-7 of a CONTRIB's flags: its transmission number (mod 32), which every reply to it
# (RESYNC, ACK, RESEND) echoes, so that a worker acts on "not counted" only when it answers
# its latest transmission (docs/protocol.md §4 "Replies" and §9).
TX_SHIFT = 3
TX_MASK = 0xF8


class DropReason(enum.IntEnum):
    """Why the switch dropped a packet; index into a job's block of the drops counter."""

    MALFORMED = 0  # parser error: truncated header or payload
    BAD_VERSION = 1
    BAD_OP = 2  # an op the switch does not accept (anything but CONTRIB)
    BAD_LENGTH = 3  # IPv4/UDP lengths disagree with one header + LANES lanes
    NOT_MEMBER = 4  # (job, worker, source address, source port) not admitted
    NO_JOB = 5  # admitted, but the job has no configuration entry
    SLOT_RANGE = 6  # slot outside the job's slot range
    STALE = 7  # round neither open nor just closed (answered with RESYNC)
    DUPLICATE = 8  # contribution already counted (per-worker counter too)
    CHUNK_MISMATCH = 9  # chunk differs from the one latched by the round (answered with RESYNC)
    NOT_JOINED = 10  # a JOIN found no open round to join (answered with RESYNC)
    UPLINK_RESENT = 11  # a leaf's host asked again about the sum at the spine: uplink resent


class ResyncReason(enum.IntEnum):
    """Carried in the ``reason`` byte of a RESYNC reply."""

    NONE = 0
    STALE_ROUND = 1
    CHUNK_MISMATCH = 2
    STALE_COUNTED = 3  # stale, but this worker was counted in that round; its result is gone
    NOT_JOINED = 4  # a JOIN was not counted: no round open (or async); the slot's state


# An install epoch is 1..MAX_EPOCH: its complement, which marks a refused contribution in
# member_epoch (docs/protocol.md §4 step 8), is then never 0, the registers' power-on value.
MAX_EPOCH = 0xFFFFFFFE


# An async slot refuses a sequence number up to ASYNC_WINDOW - 1 behind the one its member
# cell says was counted last in this install (docs/protocol.md §4 step 10): a copy the network
# delayed behind that many of the member's newer contributions on the slot.
ASYNC_WINDOW = 256


def behind_counted(r: int, counted: int) -> bool:
    """Whether `r` is 1 .. ASYNC_WINDOW - 1 behind `counted`, in 32-bit serial arithmetic."""
    return 0 < (counted - r) & 0xFFFFFFFF < ASYNC_WINDOW


def refused_mark(epoch: int) -> int:
    """What member_epoch holds for a contribution the switch answered "not counted" in the
    install `epoch`: it is never counted later (docs/protocol.md §4 step 8)."""
    return epoch ^ 0xFFFFFFFF


def install_tag(epoch: int) -> int:
    """What a RESULT or an ACK carries in its ``reason`` byte: the low byte of the install
    epoch of the job that the switch's state for the slot belongs to. A worker that hears
    another tag than the one it knew learns that the switch's state for its job is new (a
    restart, or the job installed again: docs/protocol.md §9)."""
    return epoch & 0xFF


# ------------------------------------------------------------- the header
# (name, width in bits): the order is the wire order. headers.p4 must agree.
HEADER_FIELDS: tuple[tuple[str, int], ...] = (
    ("version", 8),
    ("op", 8),
    ("flags", 8),
    ("mode", 8),  # RESULT: mode the round was aggregated under
    ("job_id", 16),
    ("worker_id", 8),  # CONTRIB: sender; RESULT/RESYNC/ACK: the worker whose packet triggered it
    ("count", 8),  # RESULT: number of contributors in the sum
    ("slot", 16),
    ("reason", 8),  # RESYNC: ResyncReason; RESULT and ACK: install_tag(the job's epoch)
    ("quorum", 8),  # RESULT: quorum the round closed at (0 = every member)
    ("round", 32),  # CONTRIB: round (sync/partial) or sender sequence (async); RESULT: round
    ("chunk", 32),  # worker's chunk id, echoed in the result so the worker places it
    ("bitmap", 32),  # RESULT: contributors; RESYNC: contributors of the open round so far
)
HEADER_BYTES = sum(width for _, width in HEADER_FIELDS) // 8
PAYLOAD_BYTES = LANES * 4
PACKET_BYTES = HEADER_BYTES + PAYLOAD_BYTES  # a CONTRIB or RESULT datagram

_NUMPY_TYPE = {8: "u1", 16: ">u2", 32: ">u4"}
HEADER_DTYPE = np.dtype([(name, _NUMPY_TYPE[width]) for name, width in HEADER_FIELDS])
PACKET_DTYPE = np.dtype(HEADER_DTYPE.descr + [("lanes", ">i4", (LANES,))])
_STRUCT_CODE = {8: "B", 16: "H", 32: "I"}
# The header as one struct (values in HEADER_FIELDS order) and each field's byte offset:
# the codecs that cannot afford a Header object per packet (the softswitch's pipeline)
# use these instead of a copy of the layout.
HEADER_STRUCT = struct.Struct("!" + "".join(_STRUCT_CODE[width] for _, width in HEADER_FIELDS))
FIELD_OFFSET = {name: sum(w for _, w in HEADER_FIELDS[:i]) // 8
                for i, (name, _) in enumerate(HEADER_FIELDS)}
assert HEADER_STRUCT.size == HEADER_BYTES == HEADER_DTYPE.itemsize == 24

# Frame layer offsets (Ethernet II, IPv4 without options, UDP).
ETH_BYTES, IPV4_BYTES, UDP_BYTES = 14, 20, 8
HYSYNC_OFFSET = ETH_BYTES + IPV4_BYTES + UDP_BYTES
ETHERTYPE_IPV4 = 0x0800
IPPROTO_UDP = 17


class WireError(ValueError):
    """A datagram or frame that is not a well-formed HySync packet."""


@dataclass(frozen=True, slots=True)
class Header:
    op: int
    job_id: int
    worker_id: int
    slot: int
    round: int
    chunk: int = 0
    flags: int = 0
    mode: int = 0
    count: int = 0
    reason: int = 0
    quorum: int = 0
    bitmap: int = 0
    version: int = VERSION

    def pack(self) -> bytes:
        return HEADER_STRUCT.pack(
            self.version, self.op, self.flags, self.mode, self.job_id, self.worker_id,
            self.count, self.slot, self.reason, self.quorum, self.round & 0xFFFFFFFF,
            self.chunk & 0xFFFFFFFF, self.bitmap & 0xFFFFFFFF,
        )

    @classmethod
    def unpack(cls, data: bytes | memoryview, offset: int = 0) -> Header:
        if len(data) - offset < HEADER_BYTES:
            raise WireError(f"HySync header needs {HEADER_BYTES} bytes, got {len(data) - offset}")
        (version, op, flags, mode, job_id, worker_id, count, slot, reason, quorum, rnd, chunk,
         bitmap) = HEADER_STRUCT.unpack_from(data, offset)
        return cls(op=op, job_id=job_id, worker_id=worker_id, slot=slot, round=rnd, chunk=chunk,
                   flags=flags, mode=mode, count=count, reason=reason, quorum=quorum,
                   bitmap=bitmap, version=version)


@dataclass(frozen=True, slots=True)
class Packet:
    """One HySync datagram: a header and, for CONTRIB/RESULT, LANES int32 lanes."""

    header: Header
    lanes: np.ndarray | None = field(default=None)

    def encode(self) -> bytes:
        head = self.header.pack()
        if self.lanes is None:
            return head
        lanes = np.asarray(self.lanes)
        if lanes.shape != (LANES,):
            raise WireError(f"a packet carries exactly {LANES} lanes, got shape {lanes.shape}")
        return head + lanes.astype(">i4", copy=False).tobytes()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Packet:
        """Decode a datagram; raise WireError naming what is wrong."""
        header = Header.unpack(data)
        if header.version != VERSION:
            raise WireError(f"HySync version {header.version}, this build speaks {VERSION}")
        if header.op in (Op.CONTRIB, Op.RESULT):
            if len(data) != PACKET_BYTES:
                raise WireError(
                    f"{Op(header.op).name} must be {PACKET_BYTES} bytes, got {len(data)}")
            lanes = np.frombuffer(data, dtype=">i4", count=LANES, offset=HEADER_BYTES)
            return cls(header, lanes.astype(np.int32))
        if header.op in (Op.RESYNC, Op.ACK):
            if len(data) != HEADER_BYTES:
                raise WireError(
                    f"{Op(header.op).name} must be {HEADER_BYTES} bytes, got {len(data)}")
            return cls(header, None)
        raise WireError(f"unknown HySync op {header.op}")


# --------------------------------------------------------------- batches
def empty_batch(n: int) -> np.ndarray:
    """A zeroed batch of n full packets (version set), to fill field by field."""
    batch = np.zeros(n, dtype=PACKET_DTYPE)
    batch["version"] = VERSION
    return batch


def encode_batch(batch: np.ndarray) -> list[bytes]:
    """One datagram per row of a PACKET_DTYPE array, without a per-lane Python loop."""
    raw = batch.astype(PACKET_DTYPE, copy=False).tobytes()
    return [raw[i:i + PACKET_BYTES] for i in range(0, len(raw), PACKET_BYTES)]


# ------------------------------------------------------------ frame layer
def ipv4_checksum(header: bytes | bytearray | memoryview) -> int:
    """RFC 1071 checksum of an IPv4 header whose checksum field is zero."""
    words = np.frombuffer(bytes(header), dtype=">u2")
    total = int(words.sum(dtype=np.uint64))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def mac_to_bytes(mac: str) -> bytes:
    parts = mac.split(":")
    if len(parts) != 6 or not all(0 < len(p) <= 2 and set(p) <= _HEX_DIGITS for p in parts):
        raise ValueError(f"MAC address {mac!r} must be six hex bytes separated by ':'")
    return bytes(int(p, 16) for p in parts)


def bytes_to_mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def ip_to_int(ip: str) -> int:
    parts = ip.split(".")
    # ASCII digits only: str.isdigit() and int() also take other scripts' digits.
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() and int(p) < 256 for p in parts):
        raise ValueError(f"IPv4 address {ip!r} must be four numbers 0-255 separated by '.'")
    return int.from_bytes(bytes(int(p) for p in parts), "big")


def int_to_ip(value: int) -> str:
    return ".".join(str(b) for b in value.to_bytes(4, "big"))


@dataclass(frozen=True, slots=True)
class FrameAddress:
    """The L2-L4 addresses of a HySync frame."""

    src_mac: bytes
    dst_mac: bytes
    src_ip: int
    dst_ip: int
    src_port: int
    dst_port: int = HYSYNC_UDP_PORT


ETH_STRUCT = struct.Struct("!6s6sH")  # dst, src, ethertype
IPV4_STRUCT = struct.Struct("!BBHHHBBHII")  # no options
UDP_STRUCT = struct.Struct("!HHHH")  # src port, dst port, length, checksum


def build_frame(addr: FrameAddress, payload: bytes, *, ttl: int = 64, ident: int = 0) -> bytes:
    """Ethernet/IPv4/UDP around a HySync datagram. UDP checksum 0 (none, legal in IPv4)."""
    total = IPV4_BYTES + UDP_BYTES + len(payload)
    ip = bytearray(IPV4_STRUCT.pack(0x45, 0, total, ident, 0, ttl, IPPROTO_UDP, 0, addr.src_ip,
                              addr.dst_ip))
    ip[10:12] = ipv4_checksum(ip).to_bytes(2, "big")
    return (ETH_STRUCT.pack(addr.dst_mac, addr.src_mac, ETHERTYPE_IPV4) + bytes(ip)
            + UDP_STRUCT.pack(addr.src_port, addr.dst_port, UDP_BYTES + len(payload), 0) + payload)


def parse_frame(frame: bytes) -> tuple[FrameAddress, bytes]:
    """Split an Ethernet/IPv4/UDP frame into its addresses and UDP payload."""
    if len(frame) < HYSYNC_OFFSET:
        raise WireError(f"frame of {len(frame)} bytes is shorter than Ethernet/IPv4/UDP")
    dst_mac, src_mac, ethertype = ETH_STRUCT.unpack_from(frame, 0)
    if ethertype != ETHERTYPE_IPV4:
        raise WireError(f"ethertype 0x{ethertype:04x} is not IPv4")
    ver_ihl, _, total, _, _, _, proto, _, src_ip, dst_ip = IPV4_STRUCT.unpack_from(frame, ETH_BYTES)
    if ver_ihl != 0x45 or proto != IPPROTO_UDP:
        raise WireError("not an IPv4 (no options) UDP frame")
    src_port, dst_port, udp_len, _ = UDP_STRUCT.unpack_from(frame, ETH_BYTES + IPV4_BYTES)
    payload = frame[HYSYNC_OFFSET:ETH_BYTES + IPV4_BYTES + udp_len]
    return FrameAddress(src_mac, dst_mac, src_ip, dst_ip, src_port, dst_port), payload
