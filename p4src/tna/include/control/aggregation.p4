// Aggregation on Tofino (protocol.md §3, §4 steps 8-10): the same state machine as
// p4src/v1model/include/control/aggregation.p4, laid out over the stages so that every
// register is touched once per pass (slot_registers.p4). The plan, in pipeline order:
//
//   first pass of a contribution (any HySync packet reads; only an admitted one writes)
//     1. Round         cur = round[s]; diff = r - cur: open (0) or prev (-1)
//     2. SlotEpoch     the install that used the slot last: another one -> reset pass
//        ModeLatch     latch mode/quorum if this contribution opens the round, else read
//        ChunkLatch    the same for the chunk
//     3. Bitmap        add w's bit;    MemberSeq  record r (a swap: it was there = counted)
//     4. Count         +1, and CLOSING when the quorum is reached (refuses later ones)
//     5. verdict       what Replies sends, and the lane op (write / add / read) that the
//                      next pass applies: every lane op and every close recirculate
//   the next pass (recirculated; the lanes act first, from the bridge, in the stages the
//   first pass decides in)
//     ABSORB           an absorbed contribution's lane op, then dropped
//     CLOSE            Round advances round[s]; ResultHeader stores res_*; the RESULT
//     RESEND           the stored lanes; the RESULT back to the sender
//     ASYNC            Round takes round[s]++ as the result's round; ResultHeader; its
//                      SEND_GROUP pass writes the bank
//     SEND_GROUP/BACK  Tofino 1, after CLOSE / RESEND: the even lanes (the async write)
//   reset pass (a contribution that met another install's epoch), then a retry pass
//     1. Round         round 0 of the new epoch, unless a reset pass of it came first
//     2. SlotEpoch     the new epoch;  ModeLatch, ChunkLatch  cleared (first reset only)
//   retry pass: the contribution again, as a first pass (admission and all)
//
// Where the outcome differs from v1model's one action, docs/tofino.md says how and why.

#ifndef __HYSYNC_TNA_AGGREGATION__
#define __HYSYNC_TNA_AGGREGATION__

// A first pass (or a retry pass) and a reset pass.
control Aggregation(inout headers_t hdr, inout ingress_metadata_t meta) {

    SlotEpoch() slot_epoch;
    ModeLatch() mode;
    ChunkLatch() chunk;
    Bitmap() bitmap;
    MemberSeq(0) member_seq_0;
    MemberSeq(1) member_seq_1;
    MemberSeq(2) member_seq_2;
    MemberSeq(3) member_seq_3;
    Count() count;

    // w's bit. Tofino has no shift by a variable amount: one row per worker id.
    @hidden action set_me(bitmap_t me) {
        meta.tf.me = me;
    }

    @hidden table worker_bit {
        key = {
            hdr.hysync.worker_id : exact;
        }
        actions = {
            set_me;
        }
        const entries = {
#define WORKER_BIT(w) w : set_me(32w1 << w);
            FOR_EACH_WORKER(WORKER_BIT)
#undef WORKER_BIT
        }
        size = MAX_WORKERS;
    }

    // Fields assembled from several fields come from a hash unit (identity): an action
    // writes a PHV container from one source only.
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) desired_hash;
    // member_seq's key: the round and the install (slot_registers.p4, MemberSeq).
    Hash<bit<32>>(HashAlgorithm_t.CRC32) seq_key_hash;

    @hidden action prepare() {
        meta.tf.r_plus_1 = hdr.hysync.round + 1;
        meta.tf.desired = desired_hash.get({meta.hs.desired_mode, meta.hs.desired_quorum});
        meta.tf.result_op = result_op_t.NONE;
    }

    // The contribution's round against the open one, as one field a gateway compares with
    // constants (a gateway comparing two 32-bit fields takes more input than it has).
    @hidden action difference() {
        meta.tf.diff = hdr.hysync.round - meta.tf.cur;
    }

    @hidden action key_member_seq() {
        meta.tf.seq_key = seq_key_hash.get({hdr.hysync.round, meta.hs.epoch});
    }

    // The effective quorum (protocol.md §4 step 8): q = n if the latched quorum is 0, else
    // min(quorum, n), re-evaluated on every packet. min is an ALU instruction; comparing
    // two fields in a gateway is not possible on Tofino.
    @hidden action set_quorum(quorum_t qr) {
        meta.tf.q8 = meta.hs.members;
        hdr.hysync.quorum = qr;
    }

    @hidden action use_quorum(quorum_t qr) {
        meta.tf.q8 = qr < meta.hs.members ? qr : meta.hs.members;
        hdr.hysync.quorum = qr;
    }

    @hidden action widen_quorum() {
        meta.tf.q = (int<32>) (bit<32>) meta.tf.q8;
    }

    // What Stats counts. The RESULT or RESYNC header's fields are written into the header
    // here, not through v1model's meta.hs.out_* (a PHV container each saved: Tofino 1's
    // PHV is full).
    @hidden action verdict(verdict_t v, member_counter_t counter) {
        meta.hs.verdict = v;
        meta.hs.count_drop = false;
        meta.hs.member_counter = counter;
    }

    // A verdict that is also a drop by reason (the packet may still be answered).
    @hidden action drop_verdict(verdict_t v, drop_reason_t reason, member_counter_t counter) {
        meta.hs.verdict = v;
        meta.hs.count_drop = true;
        meta.hs.drop_reason = reason;
        meta.hs.member_counter = counter;
    }

    @hidden action resync_header(reason_t reason) {
        hdr.hysync.reason = reason;
        hdr.hysync.round = meta.tf.cur;
        hdr.hysync.chunk = meta.tf.stored_chunk;
        hdr.hysync.bitmap = 0;
        hdr.hysync.count = 0;
    }

    apply {
        bit<8> latched_mode;
        quorum_t latched_quorum;

        // ---- 1. indexes, and the contribution's round against the open one (Round, applied
        // by ingress to every packet in stage 0, read it: a read changes nothing, so it
        // needs no stage after admission).
        worker_bit.apply();
        prepare();
        key_member_seq();
        difference();
        // The first pass's flags, computed for a reset pass too: a gateway that also tested
        // the pass would compare more PHV bytes than one gateway can (Tofino 2 refused it).
        // A reset pass reads none of them. Tofino assigns no comparison to a bool: each
        // flag is a branch.
        meta.tf.open = false;
        meta.tf.prev = false;
        meta.tf.last_round = false;
        meta.tf.desired_async = false;
        meta.tf.join = false;
        if (hdr.hysync.round == 0xFFFFFFFF) {
            meta.tf.last_round = true;
        }
        if (meta.tf.diff == 0) {
            meta.tf.open = true;
        }
        // r == cur - 1; the round before round 0 closed in no epoch (v1model's res_valid),
        // and cur = r + 1 is 0 exactly when r is the last round.
        if (meta.tf.diff == 0xFFFFFFFF && !meta.tf.last_round) {
            meta.tf.prev = true;
        }
        if (meta.hs.desired_mode == MODE_ASYNC) {
            meta.tf.desired_async = true;
        }
        if (hdr.hysync.flags[2:2] == 1) {   // FLAG_JOIN
            meta.tf.join = true;
        }
        // ---- 2. the slot's install and the latches. An admitted first pass reads the
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
        if (meta.bridge.pass == pass_t.RESET) {
            // Nothing is counted or sent: Replies retries the contribution.
        } else if (meta.hs.admitted) {
            meta.tf.stale_epoch = false;
            if (meta.tf.epoch_differs == 1) {
                // Another install used the slot last: every register below only reads.
                meta.tf.stale_epoch = true;
                meta.tf.open = false;
                meta.tf.prev = false;
                meta.tf.desired_async = false;
            }
            meta.tf.fresh = false;
            meta.tf.async_path = false;
            meta.tf.not_joined = false;
            if (meta.tf.latched == 0) {
                latched_mode = meta.hs.desired_mode;
                latched_quorum = meta.hs.desired_quorum;
                if (meta.tf.desired_async) {
                    meta.tf.async_path = true;
                } else if (meta.tf.open) {
                    if (meta.tf.join) {
                        meta.tf.not_joined = true;   // a JOIN never opens a round
                    } else {
                        meta.tf.fresh = true;
                    }
                }
            } else {
                latched_mode = meta.tf.latched[15:8];
                latched_quorum = meta.tf.latched[7:0];
            }
            hdr.hysync.mode = latched_mode;
            meta.tf.open_sync = false;
            if (meta.tf.open && !meta.tf.async_path && !meta.tf.not_joined) {
                meta.tf.open_sync = true;
            }
            if (latched_quorum == 0) {
                set_quorum(latched_quorum);
            } else {
                use_quorum(latched_quorum);
            }
            widen_quorum();

            // ---- 3-4. contributors, member sequence, count and the close guard
            bitmap.apply(hdr, meta.tf);
            member_seq_0.apply(hdr, meta.tf);
            member_seq_1.apply(hdr, meta.tf);
            member_seq_2.apply(hdr, meta.tf);
            member_seq_3.apply(hdr, meta.tf);
            count.apply(hdr, meta.tf);

            // ---- 5. the verdict (protocol.md §4 steps 9-10), and the lane op the next pass
            // applies (in the bridge header). The header keeps the contribution's round (the open one, or r for an ACK or a
            // resend) and chunk unless a RESYNC says otherwise.
            hdr.hysync.reason = RESYNC_NONE;
            if (meta.tf.stale_epoch) {
                // Nothing counted, nothing sent: Replies takes the reset pass.
            } else if (meta.tf.not_joined) {
                drop_verdict(verdict_t.NOT_JOINED, DROP_NOT_JOINED, member_counter_t.NONE);
                resync_header(RESYNC_NOT_JOINED);
            } else if (meta.tf.async_path) {
                if (meta.tf.counted == 1) {
                    // A retransmission of a counted contribution.
                    drop_verdict(verdict_t.ACK, DROP_DUPLICATE, member_counter_t.DUPLICATES);
                    hdr.hysync.count = 0;
                    hdr.hysync.bitmap = 0;
                } else if (meta.tf.join) {
                    // A JOIN never makes an async round of its own.
                    drop_verdict(verdict_t.NOT_JOINED, DROP_NOT_JOINED, member_counter_t.NONE);
                    resync_header(RESYNC_NOT_JOINED);
                } else {
                    // A round of its own: the result is the contribution's own lanes; its
                    // ASYNC pass takes the round number and stores the result header, and
                    // the SEND_GROUP pass after it writes the bank.
                    verdict(verdict_t.CLOSE, member_counter_t.CONTRIBUTIONS);
                    hdr.hysync.count = 1;
                    hdr.hysync.bitmap = meta.tf.me;
                }
            } else if (meta.tf.open_sync) {
                if (!meta.tf.fresh && meta.tf.stored_chunk != hdr.hysync.chunk) {
                    drop_verdict(verdict_t.CHUNK_MISMATCH, DROP_CHUNK_MISMATCH,
                                 member_counter_t.NONE);
                    resync_header(RESYNC_CHUNK_MISMATCH);
                    hdr.hysync.bitmap = meta.tf.stored_bits;
                    hdr.hysync.count = meta.tf.count_out[7:0];
                } else if (meta.tf.fresh) {
                    // Opens the round: writes the bank, latches the chunk; q = 1 closes it.
                    meta.bridge.lane_op = tna_lane_op_t.WRITE;
                    hdr.hysync.count = meta.tf.count_out[7:0];
                    hdr.hysync.bitmap = meta.tf.me;
                    if (meta.tf.count_out < 0) {
                        verdict(verdict_t.CLOSE, member_counter_t.CONTRIBUTIONS);
                    } else {
                        verdict(verdict_t.ABSORB, member_counter_t.CONTRIBUTIONS);
                    }
                } else if (meta.tf.counted == 1) {
                    // Counted before: a duplicate, unless the quorum shrank under the round
                    // (an exclusion) and this retransmission closes it with the lanes it holds.
                    hdr.hysync.count = meta.tf.count_out[7:0];
                    hdr.hysync.bitmap = meta.tf.stored_bits;
                    if (meta.tf.count_out < 0) {
                        drop_verdict(verdict_t.CLOSE, DROP_DUPLICATE,
                                     member_counter_t.DUPLICATES);
                        meta.bridge.lane_op = tna_lane_op_t.READ;
                    } else {
                        drop_verdict(verdict_t.DUPLICATE, DROP_DUPLICATE,
                                     member_counter_t.DUPLICATES);
                    }
                } else if (meta.tf.count_out == 0) {
                    // The round's close is under way (between its two passes): refused without
                    // a reply; the retransmission will be answered with the stored result.
                    drop_verdict(verdict_t.NONE, DROP_STALE, member_counter_t.LATE);
                } else {
                    meta.bridge.lane_op = tna_lane_op_t.ADD;
                    hdr.hysync.count = meta.tf.count_out[7:0];
                    hdr.hysync.bitmap = meta.tf.stored_bits | meta.tf.me;
                    if (meta.tf.count_out < 0) {
                        verdict(verdict_t.CLOSE, member_counter_t.CONTRIBUTIONS);
                    } else {
                        verdict(verdict_t.ABSORB, member_counter_t.CONTRIBUTIONS);
                    }
                }
            } else if (meta.tf.prev) {
                // The round that closed last: its stored header and lanes, to the sender alone.
                verdict(verdict_t.RESEND, member_counter_t.NONE);
                meta.tf.result_op = result_op_t.READ;
                meta.bridge.lane_op = tna_lane_op_t.READ;
            } else {
                // Older, or ahead of the switch.
                drop_verdict(verdict_t.STALE, DROP_STALE, member_counter_t.STALE);
                if (meta.tf.counted == 1) {
                    resync_header(RESYNC_STALE_COUNTED);   // counted, but its result is gone
                } else {
                    resync_header(RESYNC_STALE_ROUND);
                }
                if (meta.tf.latched != 0) {
                    hdr.hysync.bitmap = meta.tf.stored_bits;
                    hdr.hysync.count = meta.tf.count_out[7:0];
                }
            }
        }
    }
}

// A later pass (CLOSE, RESEND, ASYNC, and the SEND passes): its lanes have acted (they
// come first in that pass, hysync.p4); this sets what the pass stores and the lane op of
// the next pass, if any. The round register acted in stage 0 (Round, applied by ingress
// on every pass).
control NextPass(inout headers_t hdr, inout ingress_metadata_t meta) {

    // The stored result header word, from a field each (a PHV container takes one source
    // per action).
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) res_packed_hash;

    apply {
        // The HySync header is already the RESULT.
        meta.tf.res_packed = res_packed_hash.get({hdr.hysync.count, hdr.hysync.mode,
                                                  hdr.hysync.quorum});
        if (meta.bridge.pass == pass_t.ASYNC) {
            // An async round of its own: its lanes are the result, kept for resends in
            // the bank of the round it took (now the header's).
            hdr.hysync.round = meta.tf.cur;   // the number Round took
            meta.tf.result_op = result_op_t.WRITE;
            meta.bridge.lane_op = tna_lane_op_t.WRITE;
        } else if (meta.bridge.pass == pass_t.CLOSE) {
            meta.tf.result_op = result_op_t.WRITE;
#if __TARGET_TOFINO__ != 2
            meta.bridge.lane_op = tna_lane_op_t.READ_EVEN;
        } else if (meta.bridge.pass == pass_t.RESEND) {
            meta.bridge.lane_op = tna_lane_op_t.READ_EVEN;
#endif
        }
    }
}

// The stored header of the round that closed last, after either path (ingress applies it
// once, where the first pass and the later passes meet): read by a resend's first pass,
// written by a close's CLOSE pass and an async ASYNC pass, with the round's advance.
control Results(inout headers_t hdr, inout ingress_metadata_t meta) {

    ResultHeader() result;

    // w's bit in a resent round's bitmap. A table, so that the compiler keeps the AND in an
    // action instead of folding it into the gateway, which cannot AND two fields.
    @hidden action set_mine() {
        meta.tf.stored_bits = hdr.hysync.bitmap & meta.tf.me;
    }

    @hidden table mine_bit {
        actions = {
            set_mine;
        }
        const default_action = set_mine();
        size = 1;
    }

    apply {
        result.apply(hdr, meta.tf);
        if (meta.hs.verdict == verdict_t.RESEND) {
            hdr.hysync.count = meta.tf.res_packed[23:16];
            hdr.hysync.mode = meta.tf.res_packed[15:8];
            hdr.hysync.quorum = meta.tf.res_packed[7:0];
            mine_bit.apply();
            if (meta.tf.stored_bits == 0) {
                meta.hs.member_counter = member_counter_t.LATE;
            } else {
                meta.hs.member_counter = member_counter_t.DUPLICATES;
            }
        }
    }
}

#endif  // __HYSYNC_TNA_AGGREGATION__
