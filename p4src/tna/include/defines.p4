// TNA-only types, constants and metadata: what Tofino needs on top of p4src/shared/.
//
// The shared headers_t and metadata_t are used as they are, so every shared control
// (admission, sync_mode) and every P4Info name is the same as on v1model. What is here
// exists because Tofino splits the v1model slot action into registers that each take one
// stateful-ALU access per pass, and because the lanes act in a later pass (docs/tofino.md).

#ifndef __HYSYNC_TNA_DEFINES__
#define __HYSYNC_TNA_DEFINES__

// ------------------------------------------------------------------ index types
// Register and counter indexes as wide as their arrays: a wider index costs hash bits.
typedef bit<13> slot_index_t;       // NUM_SLOTS = 8192 slots
typedef bit<14> bank_index_t;       // 2 * slot + bank (LANE_BANK_CELLS)
typedef bit<16> member_index_t;     // slot * 8 + worker % 8 (MEMBER_SEQ_PART_CELLS)
typedef bit<13> member_cell_t;           // job * 32 + worker (MEMBER_COUNTER_CELLS)
typedef bit<12> drop_counter_index_t;    // job * 16 + reason (DROP_COUNTER_CELLS)

// member_seq in four registers of eight workers (slot_registers.p4, MemberSeq).
#define MEMBER_SEQ_PART_CELLS (MEMBER_SEQ_CELLS / 4)

// FOR_EACH_HALF_PAIR(X) expands X(p) for p = 0..LANES/4-1: pair p of a half holds its
// lanes 2p and 2p+1; the low half holds lanes 0..31, the high half lanes 32..63.
#define FOR_EACH_HALF_PAIR(X) \
    X(0)  X(1)  X(2)  X(3)  X(4)  X(5)  X(6)  X(7)  \
    X(8)  X(9)  X(10) X(11) X(12) X(13) X(14) X(15)

// ------------------------------------------------------------------ headers
// The lanes in two headers of 32 (SwitchML's layout) instead of v1model's stack of 64,
// whose 64 validity bits would have to share one 32-bit PHV container. Same bytes on the
// wire: lane 2p of a half is even_p, lane 2p + 1 is odd_p.
#define LANE_PAIR_FIELDS(p) lane_t even_##p; lane_t odd_##p;
header lane_half_h {
    FOR_EACH_HALF_PAIR(LANE_PAIR_FIELDS)
}
#undef LANE_PAIR_FIELDS

struct headers_t {
    ethernet_h   ethernet;
    ipv4_h       ipv4;
    udp_h        udp;
    hysync_h     hysync;
    lane_half_h  lanes_lo;      // lanes 0..31
    lane_half_h  lanes_hi;      // lanes 32..63
}

// FOR_EACH_WORKER(X) expands X(w) for w = 0..MAX_WORKERS-1.
#define FOR_EACH_WORKER(X) \
    X(0)  X(1)  X(2)  X(3)  X(4)  X(5)  X(6)  X(7)  \
    X(8)  X(9)  X(10) X(11) X(12) X(13) X(14) X(15) \
    X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) \
    X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)

// ------------------------------------------------------------- recirculation
// Every lane op, and a close's advance, takes a later pass through the recirculation port
// of the pipe the contribution arrived on: registers are per pipe, so the later pass must
// meet the same registers, and one port keeps the lane ops of a slot in order. Port 68 of each pipe on Tofino 1, port 6 on Tofino 2 (the SDE's
// default port maps; the pipe number is the port's top two bits on both).
#if __TARGET_TOFINO__ == 2
const bit<7> RECIRC_PORT_IN_PIPE = 6;
#else
const bit<7> RECIRC_PORT_IN_PIPE = 68;
#endif

// What a packet's pass is for; carried in the bridge header. A recirculated packet with
// NONE is a retry: the contribution again after a reset pass, as a first pass.
//
// The lanes act one pass after the decision (docs/tofino.md, "Stages"): the first pass
// decides, and a pass through the recirculation port applies the lane op the bridge
// carries, in the stages the first pass decides in. The recirculation port
// is one queue, so lane ops reach the banks in the order their first passes decided them.
enum bit<8> pass_t {
    NONE = 0,            // a first pass; or, in a packet for egress, no next pass
    ABSORB = 1,          // an absorbed contribution's lane op (write / add); nothing goes out
    CLOSE = 2,           // a close's lane op (add / write / read), the round's advance and
                         // the result header; then the RESULT (Tofino 1: a SEND_GROUP pass
                         // for the even lanes first)
    RESEND = 3,          // a resend's read of the bank; then the RESULT back to the sender
                         // (Tofino 1: a SEND_BACK pass for the even lanes first)
    ASYNC = 4,           // an async contribution takes a round number and stores the result
                         // header; a SEND_GROUP pass writes its bank
    SEND_GROUP = 5,      // a lane op (Tofino 1: the even lanes; async: the write), then the
                         // RESULT to the job's group
    SEND_BACK = 6,       // Tofino 1: a resend's even lanes, then back to the sender
    RESET = 7            // a contribution met another install's epoch: reset the slot (the
                         // epoch rides in the contribution's bitmap field, which the switch
                         // ignores in a contribution)
}

// What the Lane controls do with their banks on this pass (v1model's lane_op_t plus the
// operations that Tofino's one-output stateful ALU needs).
enum bit<4> tna_lane_op_t {
    NONE = 0,
    WRITE = 1,           // first contribution of a round: bank = lanes
    ADD = 2,             // later contributions: bank += lanes
    READ = 3,            // a resend or a close without new lanes: lanes = bank
    READ_EVEN = 4        // Tofino 1, the pass after: the even lanes of the pair
}

// Prepended by the ingress deparser to every packet it sends on: egress reads it, and a
// recirculated packet comes back with it in front of its Ethernet header.
header bridge_h {
    pass_t   pass;
    bit<7>   _pad0;
    PortId_t ingress_port;      // the contribution's port: replies go back to it (the
                                // parser sets it for a packet from a port)
    // One byte each: an action writes a PHV container from one source only.
    bit<7>   _pad1;
    bit<1>   switch_packet;     // a RESULT, RESYNC or ACK the switch made (not L2 traffic)
    bit<7>   _pad2;
    bit<1>   flooded;           // an L2 flood: egress prunes the copy on ingress_port
    bit<16>  mcast_grp;         // a recirculated close multicasts to the job's group
    bit<4>   _pad3;
    tna_lane_op_t lane_op;      // what the next pass's lanes do, with the bank of the
                                // header's round (the contribution's, or the async one's)
}

// What ResultHeader does with res_* on this pass.
enum bit<4> result_op_t {
    NONE = 0,
    READ = 1,            // a resend's first pass
    WRITE = 2            // a close's CLOSE pass, an async contribution's ASYNC pass
}

// Pairs of 32-bit words: two lanes, or a tag and a value.
struct lane_pair_t {
    bit<32> even;
    bit<32> odd;
}

struct tagged_t {
    bit<32> tag;                // the round the value belongs to
    bit<32> value;
}

// The round register: the open round and the install epoch it counts in. A reset pass
// sets both (round 0 of the new epoch); every other action touches the round only.
struct round_epoch_t {
    round_t round;
    epoch_t epoch;
}

// The mode and quorum latched by a round, packed so that 0 means "nothing latched":
// bit 16 is always set in a latched value, bits 15..8 are the mode, 7..0 the quorum.
typedef bit<32> packed_mode_t;
const bit<32> LATCHED = 0x10000;

// Count register: bit 31 set while the round's close is under way (its CLOSE pass has
// not advanced the round yet). As a signed number that is negative, which is what the
// stateful ALU can compare: every later contribution to the round sees it and is refused.
const int<32> CLOSING = (int<32>) 32w0x80000000;

// Per-packet state of the aggregation on Tofino: each field is written by one register
// control or by the plan in aggregation.p4, and read by later stages.
struct tna_metadata_t {
    round_t       cur;           // round[s] as the round register holds it (an ASYNC pass:
                                 // the number it took)
    round_t       r_plus_1;      // hdr.round + 1: the chunk latch's tag
    round_t       diff;          // hdr.round - cur: 0 is the open round, -1 the one before
                                 // (a gateway compares a field with a constant, cheaply)
    bool          last_round;    // hdr.round == 2^32 - 1: cur = round + 1 is 0, no close
    bool          open;          // hdr.round == cur
    bool          prev;          // hdr.round == cur - 1, cur != 0 (a round closed before)
    bool          join;          // the contribution has flag JOIN
    bit<8>        epoch_differs; // 1: first pass, slot_epoch[s] is another install's; reset
                                 // pass, the round register held another epoch
    bool          stale_epoch;   // epoch_differs in a first pass: reset pass, then retry
    bool          not_joined;    // a JOIN with no round to join
    packed_mode_t desired;       // the modes table's answer, packed
    bool          desired_async;
    packed_mode_t latched;       // the mode register's answer: 0 = no round under way
    bool          fresh;         // this contribution opens its round (latched == 0, open)
    bool          async_path;    // the slot is in async: no round under way, async desired
    bool          open_sync;     // open and not async: a contribution to the open round
    count_t       q8;            // effective quorum (protocol.md §4 step 8)
    int<32>       q;             // the same, as wide as the count register
    chunk_t       stored_chunk;  // chunk[s] before this packet
    bitmap_t      stored_bits;   // bitmap[s] before this packet; in a resend, w's bit of the
                                 // resent round's bitmap (one PHV field for both)
    bitmap_t      me;            // 1 << worker
    bit<32>       seq_key;       // what member_seq holds once w is counted in hdr.round:
                                 // CRC32 of {round, epoch}, so another install's mismatch
    bit<8>        counted;       // 1: member_seq[s*32+w] held seq_key before this packet
    int<32>       count_out;     // Count's answer: count[s] after this packet (bit 31:
                                 // closing), 0 if it refused or ignored the packet
    bit<32>       res_packed;    // res_meta: count << 16 | mode << 8 | quorum
    result_op_t   result_op;
}

struct ingress_metadata_t {
    metadata_t     hs;           // the shared per-packet metadata (p4src/shared/headers.p4)
    tna_metadata_t tf;
    bridge_h       bridge;
}

struct egress_metadata_t {
    bridge_h bridge;
    bit<16>  recipient;          // a replica's rid - 1: job * 32 + worker
}

#endif  // __HYSYNC_TNA_DEFINES__
