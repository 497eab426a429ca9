// Headers and metadata shared by every target. The HySync header itself, hysync_h, is
// generated from hysync/wire.py into wire.p4.

#ifndef __HYSYNC_HEADERS__
#define __HYSYNC_HEADERS__

header ethernet_h {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

header ipv4_h {
    bit<4>      version;
    bit<4>      ihl;
    bit<6>      dscp;
    bit<2>      ecn;
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header udp_h {
    l4_port_t src_port;
    l4_port_t dst_port;
    bit<16>   length;
    bit<16>   checksum;
}

// One signed 32-bit lane, big-endian two's complement; a CONTRIB or RESULT carries
// LANES of them.
header lane_h {
    bit<32> value;
}

// Tofino declares its own headers_t (p4src/tna/include/defines.p4): the same headers,
// with the lanes in two halves, because a stack of 64 headers needs its 64 validity bits
// in one PHV container, and the widest has 32.
#ifndef __TARGET_TOFINO__
struct headers_t {
    ethernet_h     ethernet;
    ipv4_h         ipv4;
    udp_h          udp;
    hysync_h       hysync;
    lane_h[LANES]  lanes;
}
#endif

// A slot's registers as the aggregation read them (v1model), after step 8.
struct slot_state_t {
    epoch_t  epoch;        // slot_epoch
    bit<1>   has_result;   // res_valid
    round_t  cur;          // round: the open round
    count_t  count;
    bitmap_t bitmap;
    chunk_t  chunk;
    mode_t   mode;         // latched
    quorum_t quorum;       // latched
    count_t  q;            // the effective quorum
    round_t  seq;          // member_seq of (slot, sender)
    epoch_t  seq_epoch;    // member_epoch of (slot, sender)
}

#ifdef HYSYNC_ROLES
// A job's level on this switch and a leaf's uplink (protocol.md §11), as the roles table
// set them (control/roles.p4; a program that runs no leaf reads the level alone).
struct role_t {
    level_t     level;
    bit<8>      uplink_id;      // the leaf's member id at the spine
    ipv4_addr_t spine_addr;
    mac_addr_t  spine_mac;
    ipv4_addr_t leaf_addr;      // the uplink's source address
}
#endif

#ifdef HYSYNC_TWO_LEVELS

// A leaf's uplink registers of the slot as read (§11 "The leaf"), and what the packet
// makes of them.
struct uplink_state_t {
    bit<1>   pending;      // up_pending: the sum of `round` is at the spine
    round_t  round;        // up_round
    bitmap_t bitmap;       // up_bitmap: the hosts in that sum
    count_t  count;        // up_count
    chunk_t  chunk;        // up_chunk
    bit<5>   tx;           // up_tx: the latest uplink's transmission number
    bool     send;         // the packet goes up to the spine as the leaf's CONTRIB
    bool     retransmit;   // ...sent again, for a host that asked again
}
#endif

// Per-packet metadata: each group is written by one control and read by later ones.
struct metadata_t {
    // Admission (steps 5-7): the job's configuration.
    bool             admitted;
    slot_t           slot_count;
    slot_t           slot_below;      // slot_base - slot: <= 0 (signed) from the base on
    slot_t           slot_room;       // slot_base + slot_count - slot: > 0 below the end
    count_t          members;         // active member count n
    mcast_group_t    mcast_grp;
    epoch_t          epoch;           // the install's epoch: a slot that differs starts afresh

    // SyncMode (step 8): the desired mode of the slot, latched only by a new round.
    mode_t           desired_mode;
    quorum_t         desired_quorum;

    // Aggregation (steps 8-10): the slot as read, the facts the decision table is keyed
    // on, and the outcome it decides (hysync/protocol_spec/decision.py).
    slot_state_t     slot;
    facts_t          facts;
    verdict_t        verdict;
    emit_t           emit;
    member_cell_op_t cell_op;
    lane_write_t     lane_write;
    reason_t         resync_reason;

    // The HySync header of the packet the switch sends for it (fields not listed are
    // copied from the contribution).
    round_t          out_round;
    count_t          out_count;
    bitmap_t         out_bitmap;
    chunk_t          out_chunk;
    mode_t           out_mode;
    quorum_t         out_quorum;
    reason_t         out_reason;

    // Aggregation -> Lane controls: what to do with the lanes of this packet.
    lane_op_t        lane_op;
    cell_index_t     lane_cell;       // 2 * slot + bank
    lane_t           lane_keep;       // 0: the first contribution writes; ~0: later ones add

    // -> Stats: what to count.
    bool             count_drop;      // a drop by reason (the packet may still be answered)
    drop_reason_t    drop_reason;
    member_counter_t member_counter;

    // Forwarding -> Replication: this copy is an L2 flood.
    bool             flooded;

#ifdef HYSYNC_ROLES
    // Roles -> every later control: the job's level here (§11).
    role_t           role;
#endif
#ifdef HYSYNC_TWO_LEVELS
    // Aggregation: a spine's hosts in the slot's open round (weight[s]; count is leaves).
    count_t          weight;
    // Aggregation -> Replies, Forwarding: a leaf's uplink.
    uplink_state_t   up;
    // A spine's RESULT or RESYNC at a leaf of its job (§11 leaf steps 4-6), and whether
    // this pass of it is a resubmitted one.
    bool             spine_verdict;
    bool             resubmitted;
    // Kept across the resubmitted passes of a verdict (field list 1): one pass marks one
    // host refused, a host of mark_hosts for mark_round, or of mark_hosts2 for
    // mark_round2 (a host of both: for mark_round2); the pass that marks the last relays
    // the verdict.
    @field_list(1) bitmap_t mark_hosts;
    @field_list(1) round_t  mark_round;
    @field_list(1) bitmap_t mark_hosts2;
    @field_list(1) round_t  mark_round2;
    @field_list(1) bit<8>   relay;          // RELAY_NONE, RELAY_RESULT or RELAY_RESYNC
    @field_list(1) bitmap_t relay_hosts;    // the relayed header's bitmap
    @field_list(1) chunk_t  relay_chunk;    // a relayed RESYNC's chunk
#endif
}

#endif  // __HYSYNC_HEADERS__
