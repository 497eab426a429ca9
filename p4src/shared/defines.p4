// HySync constants and type names shared by every target (v1model, tna).
//
// The wire values mirror hysync/wire.py, which owns them; tests/test_headers_p4.py
// fails when the two disagree. docs/protocol.md gives their meaning.

#ifndef __HYSYNC_DEFINES__
#define __HYSYNC_DEFINES__

// ------------------------------------------------------------------ dimensions
// Preprocessor constants: they size header stacks, registers and tables.
#define LANES 64              // K: int32 lanes per packet (256 B of payload, as SwitchML)
#define MAX_WORKERS 32        // the contributor bitmap is 32 bits wide
#define MAX_JOBS 256          // job ids 1..255; job 0 collects unattributable drops
#define NUM_SLOTS 8192        // aggregation slots in the switch's register pool
#define NUM_DROP_REASONS 16   // width of a job's block in the drops counter

// FOR_EACH_LANE(X) expands X(i) for every lane i = 0..LANES-1: the one place the lane
// indices are written out (the parser extracts, aggregation.p4 instantiates a Lane
// control per lane). tests/test_headers_p4.py checks it lists exactly 0..LANES-1.
#define FOR_EACH_LANE(X) \
    X(0)  X(1)  X(2)  X(3)  X(4)  X(5)  X(6)  X(7)  \
    X(8)  X(9)  X(10) X(11) X(12) X(13) X(14) X(15) \
    X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) \
    X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31) \
    X(32) X(33) X(34) X(35) X(36) X(37) X(38) X(39) \
    X(40) X(41) X(42) X(43) X(44) X(45) X(46) X(47) \
    X(48) X(49) X(50) X(51) X(52) X(53) X(54) X(55) \
    X(56) X(57) X(58) X(59) X(60) X(61) X(62) X(63)

// ----------------------------------------------------------------------- types
typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<16> l4_port_t;
typedef bit<9>  port_num_t;      // v1model port; the TNA shim uses PortId_t
typedef bit<16> mcast_group_t;

typedef bit<8>  op_t;
typedef bit<8>  flags_t;
typedef bit<8>  mode_t;
typedef bit<8>  count_t;
typedef bit<16> slot_t;
typedef bit<8>  reason_t;
typedef bit<8>  quorum_t;
typedef bit<32> epoch_t;         // a job install's epoch (non-zero); a slot latches it
typedef bit<32> round_t;         // sync/partial round, or a worker's async sequence number
typedef bit<32> chunk_t;
typedef bit<32> bitmap_t;        // bit w set <=> worker w contributed
typedef bit<32> lane_t;          // a signed int32 lane; sums wrap mod 2^32 as on the wire
typedef bit<8>  drop_reason_t;
typedef bit<32> cell_index_t;    // index into a register or counter array

// ------------------------------------------------------------------ wire values
const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;

const l4_port_t HYSYNC_UDP_PORT = 48620;
const bit<8>    HYSYNC_VERSION = 1;

// op
const op_t OP_CONTRIB = 1;   // worker -> switch
const op_t OP_RESULT = 2;    // switch -> worker(s)
const op_t OP_RESYNC = 3;    // switch -> worker, header only
const op_t OP_ACK = 4;       // switch -> worker, header only (async duplicate)

// mode
const mode_t MODE_SYNC = 0;
const mode_t MODE_PARTIAL = 1;
const mode_t MODE_ASYNC = 2;

// The modes table's `mode` parameter, the same bits as mode_t: a serializable enum so
// that the P4Info names the modes (type_info.serializable_enums["sync_mode_t"]) for
// tools that read it; the registers and the header keep mode_t.
enum bit<8> sync_mode_t {
    SYNC = 0,
    PARTIAL = 1,
    ASYNC = 2
}

// flags
const flags_t FLAG_RETRANSMIT = 0x01;   // contribution sent again (informational)
const flags_t FLAG_RESEND = 0x02;       // result is a unicast copy of the stored round
const flags_t FLAG_JOIN = 0x04;         // contribution: join an open round, never open one

// bits 3-7 of a contribution's flags: its transmission number, echoed by every reply to it
const flags_t TX_MASK = 0xF8;

// reason byte of a RESYNC
const reason_t RESYNC_NONE = 0;
const reason_t RESYNC_STALE_ROUND = 1;
const reason_t RESYNC_CHUNK_MISMATCH = 2;
const reason_t RESYNC_STALE_COUNTED = 3;
const reason_t RESYNC_NOT_JOINED = 4;

// drop reasons: the index inside a job's block of the drops counter
const drop_reason_t DROP_MALFORMED = 0;
const drop_reason_t DROP_BAD_VERSION = 1;
const drop_reason_t DROP_BAD_OP = 2;
const drop_reason_t DROP_BAD_LENGTH = 3;
const drop_reason_t DROP_NOT_MEMBER = 4;
const drop_reason_t DROP_NO_JOB = 5;
const drop_reason_t DROP_SLOT_RANGE = 6;
const drop_reason_t DROP_STALE = 7;
const drop_reason_t DROP_DUPLICATE = 8;
const drop_reason_t DROP_CHUNK_MISMATCH = 9;
const drop_reason_t DROP_NOT_JOINED = 10;

// L2 flooding; job groups are below it, its replicas have rid 0.
const mcast_group_t FLOOD_MCAST_GROUP = 1024;

// Lengths of what the switch accepts and sends (IPv4 without options, UDP checksum 0).
const bit<16> HYSYNC_HEADER_BYTES = 24;
const bit<16> CONTRIB_UDP_LEN = 8 + HYSYNC_HEADER_BYTES + 4 * LANES;      // 288
const bit<16> CONTRIB_IPV4_LEN = 20 + CONTRIB_UDP_LEN;                    // 308
// The whole frame: catches bytes after the IPv4 packet, which the deparser would send back.
const bit<32> CONTRIB_FRAME_LEN = 322;                                     // 14 + 308
const bit<16> REPLY_UDP_LEN = 8 + HYSYNC_HEADER_BYTES;                    // 32: RESYNC, ACK
const bit<16> REPLY_IPV4_LEN = 20 + REPLY_UDP_LEN;                        // 52

// ------------------------------------------------------ pipeline-internal values
// What the aggregation state machine (protocol.md §4 steps 9-10) decided for a
// contribution; Replies turns it into a packet, Stats into counts.
enum bit<8> verdict_t {
    NONE = 0,            // not a contribution that reached the state machine
    ABSORB = 1,          // accepted, the round stays open: no packet out
    CLOSE = 2,           // accepted and the round closed: RESULT to the job's group
    DUPLICATE = 3,       // open round, bit already set: dropped
    CHUNK_MISMATCH = 4,  // open round aggregates another chunk: RESYNC
    RESEND = 5,          // the round that closed last: RESULT to the sender alone
    STALE = 6,           // any other round: RESYNC
    ACK = 7,             // async retransmission of a counted contribution: ACK
    NOT_JOINED = 8       // a JOIN with no open round to join (or async): RESYNC
}

// What a Lane control does with its register on this packet.
enum bit<8> lane_op_t {
    NONE = 0,
    ACCUMULATE = 1,      // bank = (bank & keep) + lane; the lane becomes the new bank value
    READ = 2             // the lane becomes the stored bank value (a resend)
}

// Which per-member counter a packet increments (protocol.md §8).
enum bit<8> member_counter_t {
    NONE = 0,
    CONTRIBUTIONS = 1,
    LATE = 2,
    DUPLICATES = 3,
    STALE = 4
}

#endif  // __HYSYNC_DEFINES__
