// Aggregation on Tofino (protocol.md §3, §4 steps 8-10): the same state machine as
// p4src/v1model/include/control/aggregation.p4, laid out over the stages so that every
// register is touched once per pass (slot_registers.p4). The plan, in pipeline order:
//
//   RoundCompare, Latching (a first pass, or a retry pass; any HySync packet reads, only
//   an admitted one writes)
//     1. Round         cur = round[s] (ingress, stage 0); diff = r - cur: open (0) or
//                      prev (-1)
//     2. SlotEpoch     the install that used the slot last: another one -> reset pass
//        ModeLatch     latch mode/quorum if this contribution opens the round, else read
//        ChunkLatch    the same for the chunk
//     3. classify      the flags Counting needs, in the bridge header; quorum
//   Counting (Tofino 2: the same pass; Tofino 1: a DECIDE pass, through the recirculation
//   port: the whole decision is more stages than Tofino 1 has)
//     4. Bitmap        add w's bit;    MemberSeq  record r (a swap: it was there = counted)
//     5. Count         +1, and CLOSING when the quorum is reached (refuses later ones)
//        Weight        Tofino 2: the hosts in the sum, a RESULT's count (a spine's
//                      member adds its uplink's count, any other 1)
//     6. verdict       what Replies sends, and the lane op (write / add / read) the lane
//                      passes apply; Results stores a close's header, reads a resend's
//   lane passes (recirculated; Tofino 2: one, Tofino 1: one or two per half of the lanes)
//     CLOSE            the sums; the last advances round[s] (Round); the RESULT
//     RESEND           the stored lanes; the last sends the RESULT back to the sender
//     ABSORB           the lanes write or add; then dropped
//     SEND_GROUP       an async round's bank; then the RESULT
//   ASYNC pass         Round takes round[s]++ as the result's round; Results stores the
//                      header; then its SEND_GROUP lane passes
//   reset pass (a contribution that met another install's epoch), then a retry pass
//     1. Round         round 0 of the new epoch, unless a reset pass of it came first
//     2. SlotEpoch     the new epoch;  ModeLatch, ChunkLatch  cleared (first reset only)
//
// Where the outcome differs from v1model's one action, docs/tofino.md says how and why.

#ifndef __HYSYNC_TNA_AGGREGATION__
#define __HYSYNC_TNA_AGGREGATION__

// A RESULT's count: the hosts in its sum (Weight's answer) where a spine may weigh its
// members (HYSYNC_ROLES); else the members counted, the count register's low byte, which
// is the same number at a single switch.
#ifdef HYSYNC_ROLES
#define RESULT_COUNT meta.tf.weight_out
#else
#define RESULT_COUNT meta.tf.count_out[7:0]
#endif

// A first pass (or a retry pass) and a reset pass, before admission (it needs none): the
// contribution's round against the open one (Round, applied by ingress to every packet in
// stage 0, read it), and the fields the latches are given.
control RoundCompare(inout headers_t hdr, inout ingress_metadata_t meta) {

    // Fields assembled from several fields come from a hash unit (identity): an action
    // writes a PHV container from one source only.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) desired_hash;

    @hidden action prepare() {
        meta.tf.r_plus_1 = hdr.hysync.round + 1;
        meta.tf.desired = desired_hash.get({meta.hs.desired_mode, meta.hs.desired_quorum});
    }

    // The contribution's round against the open one, as one field a table or a gateway
    // compares with constants (a gateway comparing two 32-bit fields takes more input
    // than it has).
    @hidden action difference() {
        meta.tf.diff = hdr.hysync.round - meta.tf.cur;
    }

    apply {
        prepare();
        difference();
        // r == cur - 1; the round before round 0 closed in no epoch (v1model's res_valid),
        // and cur = r + 1 is 0 exactly when r is the last round. Tofino assigns no
        // comparison to a bool: each flag is a branch.
        meta.tf.open = false;
        meta.tf.desired_async = false;
        meta.tf.join = false;
        meta.bridge.prev = 0;
        meta.bridge.join = 0;
        if (meta.tf.diff == 0) {
            meta.tf.open = true;
        }
        if (meta.tf.diff == 0xFFFFFFFF && hdr.hysync.round != 0xFFFFFFFF) {
            meta.bridge.prev = 1;
        }
        if (hdr.hysync.flags[2:2] == 1) {   // FLAG_JOIN
            meta.tf.join = true;
            meta.bridge.join = 1;
        }
        if (meta.hs.desired_mode == MODE_ASYNC) {
            meta.tf.desired_async = true;
        }
    }
}

// A first pass (or a retry pass) and a reset pass, after admission: the slot's install,
// the latches; for an admitted contribution of the slot's install, the flags Counting
// needs (meta.tf.counting), in the bridge header.
//
// Tofino 1 has no long branches: every element of a sequence starts where the one before
// it ended. So the decision is a few tables keyed on the raw answers (one stage each), not
// a tree of ifs (a table and a gateway per branch, and mostly a stage).
control Latching(inout headers_t hdr, inout ingress_metadata_t meta) {

    SlotEpoch() slot_epoch;
    ModeLatch() mode;
    ChunkLatch() chunk;

    // member_seq's key: the round plus a hash of the install (slot_registers.p4, MemberSeq).
    Hash<bit<32>>(HashAlgorithm_t.CRC32) epoch_hash;

    @hidden action hash_epoch() {
        meta.tf.epoch_key = epoch_hash.get({meta.hs.epoch});
    }

    @hidden action key_member_seq() {
        meta.bridge.seq_key = hdr.hysync.round + meta.tf.epoch_key;
    }

    // What a RESYNC reports and where a RESULT goes, for the pass that decides.
    @hidden action carry() {
        meta.bridge.cur = meta.tf.cur;
        meta.bridge.stored_chunk = meta.tf.stored_chunk;
        meta.bridge.mcast_grp = meta.hs.mcast_grp;
    }

    // ---- the flags, from the latches' answers
    @hidden action stale() {
        meta.tf.stale_epoch = true;
    }

    @hidden action flags(bit<1> fresh, bit<1> open_sync, bit<1> async_path,
                         bit<1> not_joined, bit<1> latched) {
        meta.tf.counting = true;
        meta.bridge.fresh = fresh;
        meta.bridge.open_sync = open_sync;
        meta.bridge.async_path = async_path;
        meta.bridge.not_joined = not_joined;
        meta.bridge.latched = latched;
    }

    // Another install used the slot last: nothing is counted, Replies takes the reset pass.
    // Else, with nothing latched for the open round (the mode latch answered 0), the
    // desired mode decides: async is a round of its own; a contribution to the open round
    // opens it, but a JOIN never does. With a round latched, a contribution to it counts.
    // (Generated from hysync/protocol_spec/tna_tables.py.)
#include "classify.p4"

    // ---- the latched mode and the effective quorum (protocol.md §4 step 8): q = n if the
    // quorum is 0, else min(quorum, n), re-evaluated on every packet; the mode and quorum
    // of a latched round, else the desired ones (which the contribution opening the round
    // has just latched). min is an ALU instruction; a gateway cannot compare two fields.
    @hidden action all_desired() {
        meta.bridge.q = meta.hs.members;
        hdr.hysync.mode = meta.hs.desired_mode;
        hdr.hysync.quorum = 0;
    }

    @hidden action quorum_desired() {
        meta.bridge.q = meta.hs.desired_quorum < meta.hs.members
                        ? meta.hs.desired_quorum : meta.hs.members;
        hdr.hysync.mode = meta.hs.desired_mode;
        hdr.hysync.quorum = meta.hs.desired_quorum;
    }

    @hidden action all_latched() {
        meta.bridge.q = meta.hs.members;
        hdr.hysync.mode = meta.tf.latched[15:8];
        hdr.hysync.quorum = 0;
    }

    @hidden action quorum_latched() {
        meta.bridge.q = meta.tf.latched[7:0] < meta.hs.members
                        ? meta.tf.latched[7:0] : meta.hs.members;
        hdr.hysync.mode = meta.tf.latched[15:8];
        hdr.hysync.quorum = meta.tf.latched[7:0];
    }

    @hidden table quorum {
        key = {
            meta.tf.latched        : ternary;
            meta.hs.desired_quorum : ternary;
        }
        actions = {
            all_desired;
            quorum_desired;
            all_latched;
            quorum_latched;
        }
        const entries = {
            (0, 0) : all_desired();
            (0, _) : quorum_desired();
            (0 &&& 0xFF, _) : all_latched();
        }
        const default_action = quorum_latched();
        size = 4;
    }

    apply {
        // ---- 1. the slot's install and the latches. An admitted first pass reads the
        // install and latches the mode when it opens the round; the latches act before the
        // epoch is compared, and what they write for another install its reset pass clears.
        // A reset pass writes the new install and clears the latches. (One apply site each:
        // Tofino applies a table in one place.) Ingress gives a reset pass its epoch.
        if ((meta.bridge.pass == pass_t.NONE && meta.hs.admitted)
            || meta.bridge.pass == pass_t.RESET) {
            slot_epoch.apply(hdr, meta.tf, meta.bridge.pass, meta.hs.epoch);
            mode.apply(hdr, meta.tf, meta.bridge.pass, meta.hs.epoch);
            chunk.apply(hdr, meta.tf, meta.bridge.pass, meta.hs.epoch);
        }
        // ---- 2. the flags Counting needs, and what it reports. A reset pass counts
        // nothing: Replies retries the contribution.
        meta.bridge.chunk_ok = 0;
        if (meta.tf.stored_chunk == hdr.hysync.chunk) {
            meta.bridge.chunk_ok = 1;
        }
        if (meta.bridge.pass == pass_t.NONE && meta.hs.admitted) {
            classify.apply();
            quorum.apply();
            hash_epoch();
            key_member_seq();
            carry();
#ifdef HYSYNC_ROLES
            // What Weight adds if the contribution is counted: a spine's member is a leaf,
            // whose uplink carries the hosts in its sum (protocol.md §11).
            meta.bridge.weight_inc = 1;
            if (meta.hs.role.level == LEVEL_SPINE) {
                meta.bridge.weight_inc = hdr.hysync.count;
            }
#endif
        }
    }
}

// An admitted contribution of the slot's install, after Latching (Tofino 2: the same pass;
// Tofino 1: its DECIDE pass): contributors, member sequence, count and the close guard,
// and the verdict, with the flags Latching left in the bridge.
control Counting(inout headers_t hdr, inout ingress_metadata_t meta) {

    Bitmap() bitmap;
    MemberSeq(0) member_seq_0;
    MemberSeq(1) member_seq_1;
    MemberSeq(2) member_seq_2;
    MemberSeq(3) member_seq_3;
    Count() count;
#ifdef HYSYNC_ROLES
    Weight() weight;
#endif

    @hidden action widen_quorum() {
        meta.tf.q = (int<32>) (bit<32>) meta.bridge.q;
    }

    // ---- the verdict's actions: what Stats counts, what Replies sends (the RESULT or
    // RESYNC header's fields, written straight into the header), and the lane op.
    @hidden action resync(verdict_t v, drop_reason_t drop_reason, reason_t reason,
                          member_counter_t counter) {
        meta.hs.verdict = v;
        meta.hs.count_drop = true;
        meta.hs.drop_reason = drop_reason;
        meta.hs.member_counter = counter;
        hdr.hysync.reason = reason;
        hdr.hysync.round = meta.bridge.cur;
        hdr.hysync.chunk = meta.bridge.stored_chunk;
        hdr.hysync.bitmap = 0;
        hdr.hysync.count = 0;
    }

    // A RESYNC with the open round's contributors and count.
    @hidden action resync_round(verdict_t v, drop_reason_t drop_reason, reason_t reason,
                                member_counter_t counter) {
        meta.hs.verdict = v;
        meta.hs.count_drop = true;
        meta.hs.drop_reason = drop_reason;
        meta.hs.member_counter = counter;
        hdr.hysync.reason = reason;
        hdr.hysync.round = meta.bridge.cur;
        hdr.hysync.chunk = meta.bridge.stored_chunk;
        hdr.hysync.bitmap = meta.tf.stored_bits;
        hdr.hysync.count = meta.tf.count_out[7:0];
    }

    // A retransmission of a counted async contribution.
    @hidden action ack() {
        meta.hs.verdict = verdict_t.ACK;
        meta.hs.count_drop = true;
        meta.hs.drop_reason = DROP_DUPLICATE;
        meta.hs.member_counter = member_counter_t.DUPLICATES;
        hdr.hysync.reason = meta.hs.epoch[7:0];   // RESULT, ACK: the install tag (§2)
        hdr.hysync.count = 0;
        hdr.hysync.bitmap = 0;
    }

    // An async round of its own: the result is the contribution's own lanes; its ASYNC
    // pass takes the round number and stores the result header, and its SEND_GROUP lane
    // pass writes the bank.
    @hidden action async_round() {
        meta.hs.verdict = verdict_t.CLOSE;
        meta.hs.count_drop = false;
        meta.hs.member_counter = member_counter_t.CONTRIBUTIONS;
        hdr.hysync.reason = meta.hs.epoch[7:0];   // RESULT, ACK: the install tag (§2)
        hdr.hysync.count = 1;
        hdr.hysync.bitmap = meta.tf.me;
    }

    // Opens the round: writes the bank (the chunk latched in Latching); q = 1 closes it.
    // A close stores its result header (Results).
    @hidden action open_round(verdict_t v, result_op_t rop) {
        meta.hs.verdict = v;
        meta.tf.result_op = rop;
        meta.hs.count_drop = false;
        meta.hs.member_counter = member_counter_t.CONTRIBUTIONS;
        meta.bridge.lane_op = tna_lane_op_t.WRITE;
        hdr.hysync.reason = meta.hs.epoch[7:0];   // RESULT, ACK: the install tag (§2)
        hdr.hysync.count = RESULT_COUNT;
        hdr.hysync.bitmap = meta.tf.me;
    }

    // Joins the round: adds to the bank; the last one closes it.
    @hidden action join_round(verdict_t v, result_op_t rop) {
        meta.hs.verdict = v;
        meta.tf.result_op = rop;
        meta.hs.count_drop = false;
        meta.hs.member_counter = member_counter_t.CONTRIBUTIONS;
        meta.bridge.lane_op = tna_lane_op_t.ADD;
        hdr.hysync.reason = meta.hs.epoch[7:0];   // RESULT, ACK: the install tag (§2)
        hdr.hysync.count = RESULT_COUNT;
        hdr.hysync.bitmap = meta.tf.stored_bits | meta.tf.me;
    }

    // Counted before: a duplicate, unless the quorum shrank under the round (an exclusion)
    // and this retransmission closes it with the lanes it holds (lane op READ).
    @hidden action duplicate(verdict_t v, tna_lane_op_t op, result_op_t rop) {
        meta.hs.verdict = v;
        meta.tf.result_op = rop;
        meta.hs.count_drop = true;
        meta.hs.drop_reason = DROP_DUPLICATE;
        meta.hs.member_counter = member_counter_t.DUPLICATES;
        meta.bridge.lane_op = op;
        hdr.hysync.reason = meta.hs.epoch[7:0];   // RESULT, ACK: the install tag (§2)
        hdr.hysync.count = RESULT_COUNT;
        hdr.hysync.bitmap = meta.tf.stored_bits;
    }

    // The round's close is under way (its CLOSING mark is set, its last CLOSE pass has not
    // advanced the round yet): refused without a reply; the retransmission will be answered
    // with the stored result.
    @hidden action closing() {
        meta.hs.verdict = verdict_t.NONE;
        meta.hs.count_drop = true;
        meta.hs.drop_reason = DROP_STALE;
        meta.hs.member_counter = member_counter_t.LATE;
    }

    // The round that closed last: its stored header (Results) and lanes, to the sender
    // alone. Its last lane pass sets the member counter (Resent).
    @hidden action resend() {
        meta.hs.verdict = verdict_t.RESEND;
        meta.tf.result_op = result_op_t.READ;
        meta.hs.count_drop = false;
        meta.bridge.lane_op = tna_lane_op_t.READ;
        hdr.hysync.reason = meta.hs.epoch[7:0];   // RESULT, ACK: the install tag (§2)
    }

    // protocol.md §4 steps 9-10, one row per outcome, first match wins (generated from
    // hysync/protocol_spec/tna_tables.py). count_out is the count after this packet (bit 31,
    // CLOSING, set: it closes the round), or 0 when Count refused it.
#include "verdict.p4"

    apply {
        widen_quorum();
        // ---- 4-5. contributors, member sequence, count and the close guard
        bitmap.apply(hdr, meta.tf, meta.bridge);
        member_seq_0.apply(hdr, meta.tf, meta.bridge);
        member_seq_1.apply(hdr, meta.tf, meta.bridge);
        member_seq_2.apply(hdr, meta.tf, meta.bridge);
        member_seq_3.apply(hdr, meta.tf, meta.bridge);
        count.apply(hdr, meta.tf, meta.bridge);
#ifdef HYSYNC_ROLES
        weight.apply(hdr, meta.tf, meta.bridge);
#endif
        // ---- 6. the verdict, and the lane op of the lane pass
        verdict.apply();
    }
}

// An ASYNC pass puts the round it took (Round, stage 0) into the header, where its lane
// pass finds the bank, and stores the result header (Results) in that round's bank.
control AsyncPass(inout headers_t hdr, inout ingress_metadata_t meta) {

    @hidden action async_result() {
        hdr.hysync.round = meta.tf.cur;
        meta.bridge.lane_op = tna_lane_op_t.WRITE;
        meta.tf.result_op = result_op_t.WRITE;
    }

    apply {
        async_result();
    }
}

// The stored header of a bank's last round (ResultHeader): written by the pass that
// decides a close, or by an ASYNC pass; read by the pass that decides a resend, which
// sends it on in the header and the bridge (Resent).
control Results(inout headers_t hdr, inout ingress_metadata_t meta) {

    ResultHeader() result;

    // The stored result header word, from a field each (a PHV container takes one source
    // per action): a close's count is its count or weight register's answer (the header
    // gets it in the same stage), an async round's is in the header.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) close_packed_hash;
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) async_packed_hash;

    @hidden action pack_close() {
        meta.tf.res_packed = close_packed_hash.get({RESULT_COUNT, hdr.hysync.mode,
                                                    hdr.hysync.quorum});
    }

    @hidden action pack_async() {
        meta.tf.res_packed = async_packed_hash.get({hdr.hysync.count, hdr.hysync.mode,
                                                    hdr.hysync.quorum});
    }

    apply {
        if (meta.bridge.pass == pass_t.ASYNC) {
            pack_async();
        } else {
            pack_close();
        }
        result.apply(hdr, meta.tf, meta.bridge);
    }
}

// A resend's last lane pass: the stored count, mode and quorum (ResultHeader left them in
// the bridge) into the RESULT; LATE if w is not among the resent round's contributors (it
// missed the round), else DUPLICATES (it retransmitted a counted contribution).
control Resent(inout headers_t hdr, inout ingress_metadata_t meta) {

    @hidden action resent() {
        hdr.hysync.count = meta.bridge.res_packed[23:16];
        hdr.hysync.mode = meta.bridge.res_packed[15:8];
        hdr.hysync.quorum = meta.bridge.res_packed[7:0];
    }

    // w's bit in the resent round's bitmap. A table, so that the compiler keeps the AND in
    // an action instead of folding it into the gateway, which cannot AND two fields.
    @hidden action set_mine() {
        meta.tf.mine = hdr.hysync.bitmap & meta.tf.me;
    }

    @hidden table mine_bit {
        actions = {
            set_mine;
        }
        const default_action = set_mine();
        size = 1;
    }

    apply {
        if (meta.bridge.pass == pass_t.RESEND && meta.bridge.last == 1) {
            resent();
            mine_bit.apply();
            if (meta.tf.mine == 0) {
                meta.hs.member_counter = member_counter_t.LATE;
            } else {
                meta.hs.member_counter = member_counter_t.DUPLICATES;
            }
        }
    }
}

#endif  // __HYSYNC_TNA_AGGREGATION__
