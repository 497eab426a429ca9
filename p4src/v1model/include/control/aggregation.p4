// Aggregation (protocol.md §3 and §4 steps 8-10): the per-slot registers and the state
// machine that decides, for one admitted contribution, whether it opens, joins, closes,
// duplicates or misses a round.
//
// Register discipline (docs/design.md): every read-modify-write of a register happens inside
// one action, and each register is touched by at most one action per packet:
//   slot_update_action    slot_epoch, res_valid, round, count, bitmap, chunk, mode,
//                         quorum, member_seq, member_epoch
//   result_write_action   res_* (on a close)         } never both
//   result_read_action    res_* (on a resend)        } on one packet
//   Lane.accumulate_action / Lane.read_action        one bank cell per lane
// The slot's header state is one action because its parts depend on each other in a
// cycle: the latch needs count, count's update needs the latched quorum, the round's
// update needs count and member_seq (async), and a new epoch resets them all.

#ifndef __HYSYNC_AGGREGATION__
#define __HYSYNC_AGGREGATION__

// One lane of the payload and its two banks (bank = round & 1) for every slot: the open
// round accumulates in one bank while the previous round's result stays readable in the
// other. There is no clearing pass: keep = 0 makes the first contribution of a round
// overwrite the bank, keep = ~0 makes the later ones add.
control Lane(inout lane_t value, in cell_index_t cell, in lane_op_t op, in lane_t keep) {
    register<lane_t>(LANE_BANK_CELLS) banks;

    @hidden action accumulate_action() {
        lane_t stored;
        banks.read(stored, cell);
        stored = (stored & keep) + value;   // wraps mod 2^32, as the workers expect
        banks.write(cell, stored);
        value = stored;
    }

    @hidden action read_action() {
        banks.read(value, cell);
    }

    apply {
        if (op == lane_op_t.ACCUMULATE) {
            accumulate_action();
        } else if (op == lane_op_t.READ) {
            read_action();
        }
    }
}

control Aggregation(inout headers_t hdr, inout metadata_t meta) {

    // The install epoch of the job that used each slot last, and whether res_* and the
    // other bank hold a round closed in that epoch (§3, §4 step 8).
    register<epoch_t>(SLOT_CELLS) slot_epoch;
    register<bit<1>>(SLOT_CELLS) res_valid;
    // The open round of each slot (§3).
    register<round_t>(SLOT_CELLS) round;
    register<count_t>(SLOT_CELLS) count;
    register<bitmap_t>(SLOT_CELLS) bitmap;
    register<chunk_t>(SLOT_CELLS) chunk;
    // The per-slot sync-mode registers: mode and quorum latched by the open round.
    register<mode_t>(SLOT_CELLS) mode;
    register<quorum_t>(SLOT_CELLS) quorum;
    // Header of the round that closed last (round - 1), for resends.
    register<bitmap_t>(SLOT_CELLS) res_bitmap;
    register<count_t>(SLOT_CELLS) res_count;
    register<chunk_t>(SLOT_CELLS) res_chunk;
    register<mode_t>(SLOT_CELLS) res_mode;
    register<quorum_t>(SLOT_CELLS) res_quorum;
    // Per (slot, worker): the last round (sync/partial) or sequence number (async) in
    // which the worker was counted, or that the switch answered "not counted"...
    register<round_t>(MEMBER_SEQ_CELLS) member_seq;
    // ...and the epoch it was counted in, or its complement if it was refused: a
    // member_seq of another epoch means nothing.
    register<epoch_t>(MEMBER_SEQ_CELLS) member_epoch;

#define LANE_INSTANCE(i) Lane() lanes_##i;
    FOR_EACH_LANE(LANE_INSTANCE)
#undef LANE_INSTANCE

    // Steps 8-10 for slot s = hdr.hysync.slot, worker w, round (or sequence) r: reads
    // the slot's state, decides, writes it back. Only assignments are conditional; every
    // register is read once at the top and written once at the bottom.
    @hidden action slot_update_action() {
        cell_index_t s = (cell_index_t) hdr.hysync.slot;
        cell_index_t seq_cell = s * MAX_WORKERS + (cell_index_t) hdr.hysync.worker_id;
        round_t r = hdr.hysync.round;
        bitmap_t me = (bitmap_t) 1 << hdr.hysync.worker_id;
        // A JOIN is counted only into a round that is open and lacks the sender (§4 step 9).
        bool join = (hdr.hysync.flags & FLAG_JOIN) != 0;

        round_t cur;
        count_t cnt;
        bitmap_t bmp;
        chunk_t chk;
        mode_t md;
        quorum_t qr;
        round_t seq;
        epoch_t ep;
        bit<1> has_result;
        epoch_t seq_ep;
        bitmap_t res_bmp;
        slot_epoch.read(ep, s);
        res_valid.read(has_result, s);
        round.read(cur, s);
        count.read(cnt, s);
        bitmap.read(bmp, s);
        chunk.read(chk, s);
        mode.read(md, s);
        quorum.read(qr, s);
        member_seq.read(seq, seq_cell);
        member_epoch.read(seq_ep, seq_cell);
        res_bitmap.read(res_bmp, s);

        // 8. A slot that another install of a job used last starts afresh: round 0,
        // nothing open, nothing to resend. The lanes need no clearing (the first
        // contribution of a round writes its bank) and member_seq is ignored until
        // rewritten in this epoch.
        if (ep != meta.epoch) {
            ep = meta.epoch;
            has_result = 0;
            cur = 0;
            cnt = 0;
            bmp = 0;
            chk = 0;
        }
        // Counted in this install as r; or answered "not counted" as r, and so never to be
        // counted, should a copy of r meet the slot in another mode (a duplicate behind a
        // swap into async). A refusal is marked where r was not counted.
        bool counted = seq_ep == meta.epoch && seq == r;
        bool refused = seq_ep == ~meta.epoch && seq == r;
        // A JOIN at r answered NOT_JOINED with no round open leaves ~r under the refusal
        // mark (the JOIN mark, step 9), so that a copy of it that meets round r once it
        // opened is refused too; the first JOIN that meets the mark spends it.
        bool join_marked = seq_ep == ~meta.epoch && seq == ~r;
        epoch_t refuse_ep = seq_ep;
        if (!counted) {
            refuse_ep = ~meta.epoch;
        }

        // 8. Latch the desired mode only when no round is under way...
        if (cnt == 0) {
            md = meta.desired_mode;
            qr = meta.desired_quorum;
        }
        // ...but re-evaluate the effective quorum on every packet, so that excluding a
        // member never leaves a round waiting for a worker who is gone.
        count_t q = meta.members;
        if (qr != 0 && qr < meta.members) {
            q = qr;
        }

        // Defaults: a RESYNC carrying the slot's state; no lanes touched. A RESULT or an
        // ACK carries the install tag (the epoch's low byte, §2) where a RESYNC its reason.
        meta.out_reason = meta.epoch[7:0];
        meta.lane_op = lane_op_t.NONE;
        meta.lane_cell = 2 * s + (cell_index_t) (cur & 1);
        meta.lane_keep = 0xFFFFFFFF;
        meta.member_counter = member_counter_t.NONE;
        meta.count_drop = false;

        if (md == MODE_ASYNC) {
            // 10. Async: r is the sender's own sequence number for this slot.
            if (counted) {
                // A retransmission of a counted contribution.
                meta.verdict = verdict_t.ACK;
                meta.count_drop = true;
                meta.drop_reason = DROP_DUPLICATE;
                meta.member_counter = member_counter_t.DUPLICATES;
                meta.out_round = r;
                meta.out_count = 0;
                meta.out_bitmap = 0;
                meta.out_chunk = hdr.hysync.chunk;
            } else if (join) {
                // A JOIN never makes a round of its own.
                meta.verdict = verdict_t.NOT_JOINED;
                meta.count_drop = true;
                meta.drop_reason = DROP_NOT_JOINED;
                meta.out_reason = RESYNC_NOT_JOINED;
            } else if (refused) {
                meta.verdict = verdict_t.STALE;
                meta.count_drop = true;
                meta.drop_reason = DROP_STALE;
                meta.member_counter = member_counter_t.STALE;
                meta.out_reason = RESYNC_STALE_ROUND;
            } else {
                // A round of its own: write the bank, multicast, move on.
                seq = r;
                seq_ep = meta.epoch;
                has_result = 1;
                meta.verdict = verdict_t.CLOSE;
                meta.member_counter = member_counter_t.CONTRIBUTIONS;
                meta.lane_op = lane_op_t.ACCUMULATE;
                meta.lane_keep = 0;
                meta.out_round = cur;
                meta.out_count = 1;
                meta.out_bitmap = me;
                meta.out_chunk = hdr.hysync.chunk;
                cur = cur + 1;
            }
        } else if (r == cur) {
            // 9. The open round.
            if ((bmp & me) != 0) {
                meta.count_drop = true;
                meta.drop_reason = DROP_DUPLICATE;
                meta.member_counter = member_counter_t.DUPLICATES;
                meta.verdict = verdict_t.DUPLICATE;
                if (cnt >= q) {
                    // The membership shrank under this round (an exclusion): it already
                    // holds every remaining member, so the retransmission closes it with
                    // the lanes it has instead of leaving it to wait for a worker who is gone.
                    meta.verdict = verdict_t.CLOSE;
                    meta.lane_op = lane_op_t.READ;
                    meta.out_round = cur;
                    meta.out_count = cnt;
                    meta.out_bitmap = bmp;
                    meta.out_chunk = chk;
                    cur = cur + 1;
                    cnt = 0;
                    bmp = 0;
                    has_result = 1;
                }
            } else if (join && (cnt == 0 || join_marked)) {
                // A JOIN never opens a round; a copy of one refused so is refused too.
                meta.verdict = verdict_t.NOT_JOINED;
                meta.count_drop = true;
                meta.drop_reason = DROP_NOT_JOINED;
                meta.out_reason = RESYNC_NOT_JOINED;
                if (cnt != 0) {
                    seq_ep = 0;             // the mark is spent
                } else if (!counted) {
                    seq = ~r;
                    seq_ep = ~meta.epoch;
                }
            } else if (cnt != 0 && hdr.hysync.chunk != chk) {
                meta.verdict = verdict_t.CHUNK_MISMATCH;
                meta.count_drop = true;
                meta.drop_reason = DROP_CHUNK_MISMATCH;
                meta.out_reason = RESYNC_CHUNK_MISMATCH;
                seq = r;
                seq_ep = refuse_ep;
            } else {
                // Accept: the first contribution writes the bank and latches the chunk.
                seq = r;
                seq_ep = meta.epoch;
                meta.member_counter = member_counter_t.CONTRIBUTIONS;
                meta.lane_op = lane_op_t.ACCUMULATE;
                if (cnt == 0) {
                    chk = hdr.hysync.chunk;
                    meta.lane_keep = 0;
                }
                cnt = cnt + 1;
                bmp = bmp | me;
                if (cnt >= q) {
                    // The round closes: its header goes out and into res_*.
                    meta.verdict = verdict_t.CLOSE;
                    meta.out_round = cur;
                    meta.out_count = cnt;
                    meta.out_bitmap = bmp;
                    meta.out_chunk = chk;
                    cur = cur + 1;
                    cnt = 0;
                    bmp = 0;
                    has_result = 1;
                } else {
                    meta.verdict = verdict_t.ABSORB;
                }
            }
        } else if (r == cur - 1 && has_result == 1) {
            // 9. The round that closed last: its stored result, to the sender alone.
            // result_read_action fills the header and picks the counter.
            meta.verdict = verdict_t.RESEND;
            meta.lane_op = lane_op_t.READ;
            meta.lane_cell = 2 * s + (cell_index_t) (r & 1);
            meta.out_round = r;
            if ((res_bmp & me) == 0) {
                seq = r;            // late: not counted
                seq_ep = refuse_ep;
            }
        } else {
            // 9. Older, or ahead of the switch.
            meta.verdict = verdict_t.STALE;
            meta.count_drop = true;
            meta.drop_reason = DROP_STALE;
            meta.member_counter = member_counter_t.STALE;
            meta.out_reason = RESYNC_STALE_ROUND;
            seq = r;
            seq_ep = refuse_ep;
            if (counted) {
                meta.out_reason = RESYNC_STALE_COUNTED;   // counted, but its result is gone
            }
        }

        // A RESYNC tells the worker the slot's open round as it stands now.
        if (meta.verdict == verdict_t.CHUNK_MISMATCH || meta.verdict == verdict_t.STALE
                || meta.verdict == verdict_t.NOT_JOINED) {
            meta.out_round = cur;
            meta.out_count = cnt;
            meta.out_bitmap = bmp;
            meta.out_chunk = chk;
        }
        // Every switch packet but a resend carries the latched mode and quorum.
        meta.out_mode = md;
        meta.out_quorum = qr;

        slot_epoch.write(s, ep);
        res_valid.write(s, has_result);
        round.write(s, cur);
        count.write(s, cnt);
        bitmap.write(s, bmp);
        chunk.write(s, chk);
        mode.write(s, md);
        quorum.write(s, qr);
        member_seq.write(seq_cell, seq);
        member_epoch.write(seq_cell, seq_ep);
    }

    // The closed round's header stays readable until the next round closes.
    @hidden action result_write_action() {
        cell_index_t s = (cell_index_t) hdr.hysync.slot;
        res_bitmap.write(s, meta.out_bitmap);
        res_count.write(s, meta.out_count);
        res_chunk.write(s, meta.out_chunk);
        res_mode.write(s, meta.out_mode);
        res_quorum.write(s, meta.out_quorum);
    }

    // A resend carries the stored header; the bitmap says whether the sender is in the
    // sum (it retransmitted: a duplicate) or not (it arrived after the quorum: late).
    @hidden action result_read_action() {
        cell_index_t s = (cell_index_t) hdr.hysync.slot;
        res_bitmap.read(meta.out_bitmap, s);
        res_count.read(meta.out_count, s);
        res_chunk.read(meta.out_chunk, s);
        res_mode.read(meta.out_mode, s);
        res_quorum.read(meta.out_quorum, s);
        bitmap_t me = (bitmap_t) 1 << hdr.hysync.worker_id;
        meta.member_counter = member_counter_t.LATE;
        if ((meta.out_bitmap & me) != 0) {
            meta.member_counter = member_counter_t.DUPLICATES;
        }
    }

#define LANE_APPLY(i) lanes_##i.apply(hdr.lanes[i].value, meta.lane_cell, meta.lane_op, meta.lane_keep);

    apply {
        // 8-10. Latch, classify, update the slot's round state.
        slot_update_action();

        // The closing round's header is kept for resends; a resend reads it back.
        if (meta.verdict == verdict_t.CLOSE) {
            result_write_action();
        } else if (meta.verdict == verdict_t.RESEND) {
            result_read_action();
        }

        // Lanes: write or add into the open round's bank, or read the previous round's.
        if (meta.lane_op != lane_op_t.NONE) {
            FOR_EACH_LANE(LANE_APPLY)
        }
    }

#undef LANE_APPLY
}

#endif  // __HYSYNC_AGGREGATION__
