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
typedef bit<15> half_bank_index_t;  // 4 * slot + 2 * bank + half (HALF_BANK_CELLS)
typedef bit<16> member_index_t;     // slot * 8 + worker % 8 (MEMBER_SEQ_PART_CELLS)
typedef bit<13> member_cell_t;           // job * 32 + worker (MEMBER_COUNTER_CELLS)
typedef bit<12> drop_counter_index_t;    // job * 16 + reason (DROP_COUNTER_CELLS)

// member_seq in four registers of eight workers (slot_registers.p4, MemberSeq).
#define MEMBER_SEQ_PART_CELLS (MEMBER_SEQ_CELLS / 4)
// Tofino 1: a lane register holds pair p of both halves of each bank.
#define HALF_BANK_CELLS (2 * LANE_BANK_CELLS)
// The stored result header, per bank: written when the round closes, read by a resend.
#define RESULT_CELLS LANE_BANK_CELLS

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

// The deparser emits the valid ones in this order: a first pass has lanes_lo and lanes_hi;
// a Tofino 1 lane pass has lanes (first half, the rest payload) or lanes_lo and lanes
// (second half).
struct headers_t {
    ethernet_h   ethernet;
    ipv4_h       ipv4;
    udp_h        udp;
    hysync_h     hysync;
    lane_half_h  lanes_lo;      // lanes 0..31
#if __TARGET_TOFINO__ != 2
    lane_half_h  lanes;         // Tofino 1, a lane pass: the half it works on
#endif
    lane_half_h  lanes_hi;      // lanes 32..63
}

// FOR_EACH_WORKER(X) expands X(w) for w = 0..MAX_WORKERS-1.
#define FOR_EACH_WORKER(X) \
    X(0)  X(1)  X(2)  X(3)  X(4)  X(5)  X(6)  X(7)  \
    X(8)  X(9)  X(10) X(11) X(12) X(13) X(14) X(15) \
    X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) \
    X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31)

// ------------------------------------------------------------- recirculation
// Every later pass (DECIDE, lane, ASYNC, reset) goes through the recirculation port of the
// pipe the contribution arrived on: registers are per pipe, so the later pass must meet
// the same registers, and one port keeps the passes of a slot in order. Port 68 of each
// pipe on Tofino 1, port 6 on Tofino 2 (the SDE's default port maps; the pipe number is
// the port's top two bits on both).
#if __TARGET_TOFINO__ == 2
const bit<7> RECIRC_PORT_IN_PIPE = 6;
#else
const bit<7> RECIRC_PORT_IN_PIPE = 68;
#endif

// What a packet's pass is for; carried in the bridge header. A recirculated packet with
// NONE is a retry: the contribution again after a reset pass, as a first pass.
//
// The lanes act in a lane pass after the pass that decides (docs/tofino.md, "Stages"): it
// sends the packet through the pipe's recirculation port with the lane op in the bridge,
// and the lanes apply it in the next pass, in the stages the decision takes. The port is
// one queue, so lane ops reach the banks in the order their passes decided them. On
// Tofino 1 the lanes take a lane pass per half of 32 (and one more per half where the
// sums go out: a close, a resend), and the decision two passes: the first pass admits
// and latches, a DECIDE pass counts and gives the verdict.
enum bit<8> pass_t {
    NONE = 0,            // a first pass (egress ignores the pass)
    ABSORB = 1,          // lane pass: an absorbed contribution's write / add; then dropped
    CLOSE = 2,           // lane pass: a close's sums (add, write, or read); in its last,
                         // the round advances; then the RESULT
    RESEND = 3,          // lane pass: a resend reads the stored lanes; then the RESULT back
                         // to the sender
    ASYNC = 4,           // an async contribution takes a round number and stores the result
                         // header; its SEND_GROUP lane pass writes the bank
    SEND_GROUP = 5,      // lane pass: an async round's bank write; then the RESULT
    RESET = 7,           // a contribution met another install's epoch: reset the slot (the
                         // epoch rides in the contribution's bitmap field, which the switch
                         // ignores in a contribution)
    DECIDE = 8           // Tofino 1: an admitted contribution's count and verdict, one pass
                         // after the first pass admitted it and latched (the bridge carries
                         // what it learnt)
}

// What the lanes do with their banks in a lane pass (v1model's lane_op_t).
enum bit<4> tna_lane_op_t {
    NONE = 0,
    WRITE = 1,           // first contribution of a round: bank = lanes
    ADD = 2,             // later contributions: bank += lanes, lanes = the sums
    READ = 3             // a resend or a close without new lanes: lanes = bank
}

// Prepended by the ingress deparser to every packet it sends on: egress reads it, and a
// recirculated packet comes back with it in front of its Ethernet header.
// Every field an action writes has a container of its own where the writers' sources
// differ: an action writes a PHV container from one source only.
header bridge_h {
    pass_t   pass;
    bit<7>   _pad0;
    PortId_t ingress_port;      // the contribution's port: replies go back to it (the
                                // parser sets it for a packet from a port)
    bit<7>   _pad1;
    bit<1>   switch_packet;     // a RESULT, RESYNC or ACK the switch made (not L2 traffic)
    bit<7>   _pad2;
    bit<1>   flooded;           // an L2 flood: egress prunes the copy on ingress_port
    bit<16>  mcast_grp;         // the job's group, for the RESULT a later pass sends
    bit<1>   _pad3;
    bit<1>   half;              // Tofino 1: the half of the lanes this lane pass works on
    bit<1>   even;              // Tofino 1: this lane pass reads the half's even lanes
    bit<1>   last;              // the last lane pass of its lane op: the pass takes its
                                // next step (a close advances the round; the RESULT goes)
    tna_lane_op_t lane_op;      // what the lane pass does with the lanes, in the bank of
                                // the header's round (the contribution's, or async's)
    // What the first pass learnt for counting (Counting, aggregation.p4): on Tofino 1 it
    // counts in the DECIDE pass, which gets them here; on Tofino 2 in the same pass.
    bit<1>   fresh;             // opens its round (nothing latched for it, open, no JOIN)
    bit<1>   open_sync;         // to the open round, not async, not a refused JOIN
    bit<1>   async_path;        // async desired and no round latched: a round of its own
    bit<1>   join;              // flag JOIN
    bit<1>   prev;              // to the round that closed last
    bit<1>   chunk_ok;          // its chunk is the one the round latched
    bit<1>   latched;           // a round is under way (the mode latch answered)
    bit<1>   not_joined;        // a JOIN with no round to join
    count_t  q;                 // the effective quorum (protocol.md §4 step 8)
    round_t  cur;               // round[s]: a RESYNC's round
    chunk_t  stored_chunk;      // chunk[s] before this packet: a RESYNC's chunk
    bit<32>  seq_key;           // what member_seq holds once w is counted in hdr.round:
                                // round + CRC32 of the epoch, so another install's mismatch
    bit<32>  res_packed;        // a resend: the stored count << 16 | mode << 8 | quorum,
                                // for its last lane pass (Resent)
#ifdef HYSYNC_ROLES
    count_t  weight_inc;        // what Weight adds for a counted contribution: the
                                // uplink's count byte at a spine, else 1 (protocol.md §11)
#endif
}

// What ResultHeader does with res_* on this pass.
enum bit<4> result_op_t {
    NONE = 0,
    READ = 1,            // the pass that decides a resend
    WRITE = 2            // the pass that decides a close; an async round's ASYNC pass
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

// Count register: bit 31 set while the round's close is under way (its last CLOSE pass
// has not advanced the round yet). As a signed number that is negative, which is what the
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
    bool          open;          // hdr.round == cur
    bool          join;          // the contribution has flag JOIN
    bit<8>        epoch_differs; // 1: first pass, slot_epoch[s] is another install's; reset
                                 // pass, the round register held another epoch
    bool          stale_epoch;   // epoch_differs in a first pass: reset pass, then retry
    bool          counting;      // admitted, the slot's install: Counting decides
    packed_mode_t desired;       // the modes table's answer, packed
    bool          desired_async;
    packed_mode_t latched;       // the mode register's answer: 0 = no round under way
    int<32>       q;             // the effective quorum, as wide as the count register
    chunk_t       stored_chunk;  // chunk[s] before this packet
    bitmap_t      stored_bits;   // bitmap[s] before this packet
    bitmap_t      me;            // 1 << worker
    bit<8>        drop_job;      // the job a drop is counted under (0: none)
    PortId_t      recirc_port;   // the recirculation port of the packet's pipe
    bitmap_t      mine;          // a resend: w's bit of the resent round's bitmap
    bit<8>        counted;       // 1: member_seq[s*32+w] held seq_key before this packet;
                                 // 2: a key 1 .. ASYNC_WINDOW - 1 after it (async path)
    bit<32>       epoch_key;     // CRC32 of the install epoch: member_seq's key less the round
    int<32>       count_out;     // Count's answer: count[s] after this packet (bit 31:
                                 // closing), 0 if it refused or ignored the packet
#ifdef HYSYNC_ROLES
    count_t       weight_out;    // Weight's answer: the hosts in the open round's sum after
                                 // this packet (a RESULT's count)
#endif
    bit<32>       res_packed;    // what a close stores in res_meta: count << 16 | mode << 8
                                 // | quorum
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
