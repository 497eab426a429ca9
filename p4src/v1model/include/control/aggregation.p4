// Aggregation (protocol.md §3 and §4 steps 8-10): the per-slot registers and the state
// machine that decides, for one admitted contribution, whether it opens, joins, closes,
// duplicates or misses a round.
//
// The decision is the decision table of hysync/protocol_spec/decision.py, generated into the
// const entries of `decide` (decide.p4). Around it, per packet:
//   slot_read_action    reads the slot's registers and the sender's member cell, runs
//                       step 8 (a new install's fresh slot, the mode latch), and computes
//                       the facts the table is keyed on
//   decide              the outcome: what goes out, the member cell, the lanes, counters
//   slot_write_action   applies the outcome and writes the registers it read
//   result_write_action res_* (on a close)         } never both
//   result_read_action  res_* (on a resend)        } on one packet
//   Lane.accumulate_action / Lane.read_action      one bank cell per lane
// A register is read in slot_read_action and written in slot_write_action of the same
// packet: BMv2's simple_switch runs its ingress pipeline on one thread, one packet at a
// time, so no other packet's update falls between the two. (A pipelined target needs
// every read-modify-write in one stage: p4src/tna.)

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
    // A spine's hosts in the open round (§11 "The spine"): count[s] counts leaves, the
    // RESULT's count is this, the uplinks' count bytes summed.
    register<count_t>(SLOT_CELLS) weight;

#define LANE_INSTANCE(i) Lane() lanes_##i;
    FOR_EACH_LANE(LANE_INSTANCE)
#undef LANE_INSTANCE

    // Step 8, then the facts, for slot s = hdr.hysync.slot, worker w, round (or
    // sequence) r.
    @hidden action slot_read_action() {
        cell_index_t s = (cell_index_t) hdr.hysync.slot;
        cell_index_t seq_cell = s * MAX_WORKERS + (cell_index_t) hdr.hysync.worker_id;
        round_t r = hdr.hysync.round;
        bitmap_t me = (bitmap_t) 1 << hdr.hysync.worker_id;
        bitmap_t res_bmp;
        slot_epoch.read(meta.slot.epoch, s);
        res_valid.read(meta.slot.has_result, s);
        round.read(meta.slot.cur, s);
        count.read(meta.slot.count, s);
        bitmap.read(meta.slot.bitmap, s);
        chunk.read(meta.slot.chunk, s);
        mode.read(meta.slot.mode, s);
        quorum.read(meta.slot.quorum, s);
        member_seq.read(meta.slot.seq, seq_cell);
        member_epoch.read(meta.slot.seq_epoch, seq_cell);
        res_bitmap.read(res_bmp, s);
        weight.read(meta.weight, s);

        // 8. A slot that another install of a job used last starts afresh: round 0,
        // nothing open, nothing to resend. The lanes need no clearing (the first
        // contribution of a round writes its bank) and member_seq is ignored until
        // rewritten in this epoch.
        if (meta.slot.epoch != meta.epoch) {
            meta.slot.epoch = meta.epoch;
            meta.slot.has_result = 0;
            meta.slot.cur = 0;
            meta.slot.count = 0;
            meta.slot.bitmap = 0;
            meta.slot.chunk = 0;
            meta.weight = 0;
        }
        // 8. Latch the desired mode only when no round is under way...
        if (meta.slot.count == 0) {
            meta.slot.mode = meta.desired_mode;
            meta.slot.quorum = meta.desired_quorum;
        }
        // ...but re-evaluate the effective quorum on every packet, so that excluding a
        // member never leaves a round waiting for a worker who is gone.
        meta.slot.q = meta.members;
        if (meta.slot.quorum != 0 && meta.slot.quorum < meta.members) {
            meta.slot.q = meta.slot.quorum;
        }

        // The facts (hysync/protocol_spec/decision.py, Fact). The member cell holds r counted in
        // this install (epoch), or r answered "not counted" (~epoch, the refusal mark), or
        // ~r under the refusal mark (a JOIN's mark).
        facts_t f = 0;
        if (meta.slot.mode == MODE_ASYNC) { f = f | FACT_ASYNC; }
        if (meta.slot.seq_epoch == meta.epoch && meta.slot.seq == r) { f = f | FACT_COUNTED; }
        if (meta.slot.seq_epoch == ~meta.epoch && meta.slot.seq == r) { f = f | FACT_REFUSED; }
        if (meta.slot.seq_epoch == ~meta.epoch && meta.slot.seq == ~r) {
            f = f | FACT_JOIN_MARKED;
        }
        if ((hdr.hysync.flags & FLAG_JOIN) != 0) { f = f | FACT_JOIN; }
        if (r == meta.slot.cur) { f = f | FACT_OPEN; }
        if (r == meta.slot.cur - 1 && meta.slot.has_result == 1) { f = f | FACT_PREV; }
        if (meta.slot.count == 0) { f = f | FACT_EMPTY; }
        if ((meta.slot.bitmap & me) != 0) { f = f | FACT_HAS_BIT; }
        if (meta.slot.count >= meta.slot.q) { f = f | FACT_FULL; }
        if (meta.slot.count + 1 >= meta.slot.q) { f = f | FACT_CLOSES; }
        if (hdr.hysync.chunk != meta.slot.chunk) { f = f | FACT_CHUNK_DIFFERS; }
        if ((res_bmp & me) != 0) { f = f | FACT_RES_HAS_BIT; }
        // r is 1 .. ASYNC_WINDOW - 1 behind the number the cell counted (serial arithmetic).
        if (meta.slot.seq_epoch == meta.epoch && meta.slot.seq - r - 1 < ASYNC_WINDOW - 1) {
            f = f | FACT_BEHIND;
        }
        meta.facts = f;
    }

#include "decide.p4"

    // The outcome `decide` chose, applied in the order of hysync/protocol_spec/decision.py: the
    // member cell, the lanes, then the slot and the packet out; then every register
    // slot_read_action read is written back.
    @hidden action slot_write_action() {
        cell_index_t s = (cell_index_t) hdr.hysync.slot;
        cell_index_t seq_cell = s * MAX_WORKERS + (cell_index_t) hdr.hysync.worker_id;
        round_t r = hdr.hysync.round;
        bitmap_t me = (bitmap_t) 1 << hdr.hysync.worker_id;
        bool counted = (meta.facts & FACT_COUNTED) != 0;

        // The member cell. A mark is never written over r counted in this install; at a
        // leaf or a spine (§11, step 6) not over a later round counted either, rounds
        // compared as 32-bit serial numbers.
        bool refusable = !counted;
        if (meta.role.level != LEVEL_SINGLE) {
            round_t ahead = r - meta.slot.seq;
            refusable = meta.slot.seq_epoch != meta.epoch || (ahead != 0 && ahead[31:31] == 0);
        }
        if (meta.cell_op == member_cell_op_t.RECORD) {
            meta.slot.seq = r;
            meta.slot.seq_epoch = meta.epoch;
        } else if (meta.cell_op == member_cell_op_t.REFUSE && refusable) {
            meta.slot.seq = r;
            meta.slot.seq_epoch = ~meta.epoch;
        } else if (meta.cell_op == member_cell_op_t.JOIN_MARK && !counted) {
            meta.slot.seq = ~r;
            meta.slot.seq_epoch = ~meta.epoch;
        } else if (meta.cell_op == member_cell_op_t.JOIN_SPEND) {
            meta.slot.seq_epoch = 0;
        }

        // The lanes of the open bank. There is no clearing pass: keep = 0 makes a write
        // overwrite the bank, keep = ~0 makes an add.
        meta.lane_op = lane_op_t.NONE;
        meta.lane_cell = 2 * s + (cell_index_t) (meta.slot.cur & 1);
        meta.lane_keep = 0xFFFFFFFF;
        if (meta.lane_write == lane_write_t.WRITE || meta.lane_write == lane_write_t.WRITE_OPEN) {
            meta.lane_op = lane_op_t.ACCUMULATE;
            meta.lane_keep = 0;
        } else if (meta.lane_write == lane_write_t.ADD) {
            meta.lane_op = lane_op_t.ACCUMULATE;
        }
        if (meta.lane_write == lane_write_t.WRITE_OPEN) {
            meta.slot.chunk = hdr.hysync.chunk;
        }

        // The slot and the packet out. A RESULT or an ACK carries the install tag (the
        // epoch's low byte, §2) where a RESYNC its reason; every switch packet but a
        // resend carries the latched mode and quorum (result_read_action gives a resend
        // the stored ones).
        meta.out_reason = meta.epoch[7:0];
        meta.out_mode = meta.slot.mode;
        meta.out_quorum = meta.slot.quorum;
        bool spine = meta.role.level == LEVEL_SPINE;
        if (meta.emit == emit_t.ABSORB) {
            meta.slot.count = meta.slot.count + 1;
            meta.slot.bitmap = meta.slot.bitmap | me;
            if (spine) {
                meta.weight = meta.weight + hdr.hysync.count;
            }
        } else if (meta.emit == emit_t.CLOSE || meta.emit == emit_t.CLOSE_AS_IS) {
            // The round closes, with w counted now or (as is) before: its header goes out
            // and into res_*; the lanes are the sums (as is: read back).
            meta.out_round = meta.slot.cur;
            meta.out_count = meta.slot.count;
            meta.out_bitmap = meta.slot.bitmap;
            meta.out_chunk = meta.slot.chunk;
            if (meta.emit == emit_t.CLOSE) {
                meta.out_count = meta.slot.count + 1;
                meta.out_bitmap = meta.slot.bitmap | me;
                meta.out_chunk = hdr.hysync.chunk;
            } else {
                meta.lane_op = lane_op_t.READ;
            }
            // A spine's RESULT counts hosts, not leaves: the divisor every host uses. It
            // wraps at 8 bits (a two-level job has at most 255 hosts).
            if (spine) {
                meta.out_count = meta.weight;
                if (meta.emit == emit_t.CLOSE) {
                    meta.out_count = meta.weight + hdr.hysync.count;
                }
            }
            meta.weight = 0;
            meta.slot.cur = meta.slot.cur + 1;
            meta.slot.count = 0;
            meta.slot.bitmap = 0;
            meta.slot.has_result = 1;
        } else if (meta.emit == emit_t.RESEND) {
            // The round that closed last, to the sender alone: result_read_action fills
            // the header, the lanes are read from r's bank.
            meta.lane_op = lane_op_t.READ;
            meta.lane_cell = 2 * s + (cell_index_t) (r & 1);
            meta.out_round = r;
        } else if (meta.emit == emit_t.ACK) {
            meta.out_round = r;
            meta.out_count = 0;
            meta.out_bitmap = 0;
            meta.out_chunk = hdr.hysync.chunk;
        } else if (meta.emit == emit_t.RESYNC) {
            // The slot's open round as it stands now.
            meta.out_reason = meta.resync_reason;
            meta.out_round = meta.slot.cur;
            meta.out_count = meta.slot.count;
            meta.out_bitmap = meta.slot.bitmap;
            meta.out_chunk = meta.slot.chunk;
        }

        slot_epoch.write(s, meta.slot.epoch);
        res_valid.write(s, meta.slot.has_result);
        round.write(s, meta.slot.cur);
        count.write(s, meta.slot.count);
        bitmap.write(s, meta.slot.bitmap);
        chunk.write(s, meta.slot.chunk);
        mode.write(s, meta.slot.mode);
        quorum.write(s, meta.slot.quorum);
        member_seq.write(seq_cell, meta.slot.seq);
        member_epoch.write(seq_cell, meta.slot.seq_epoch);
        weight.write(s, meta.weight);
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

    // A resend carries the stored header.
    @hidden action result_read_action() {
        cell_index_t s = (cell_index_t) hdr.hysync.slot;
        res_bitmap.read(meta.out_bitmap, s);
        res_count.read(meta.out_count, s);
        res_chunk.read(meta.out_chunk, s);
        res_mode.read(meta.out_mode, s);
        res_quorum.read(meta.out_quorum, s);
    }

#define LANE_APPLY(i) lanes_##i.apply(hdr.lanes[i].value, meta.lane_cell, meta.lane_op, meta.lane_keep);

    apply {
        // 8-10. Read and latch the slot, decide, apply the outcome.
        slot_read_action();
        decide.apply();
        slot_write_action();

        // The closing round's header is kept for resends; a resend reads it back.
        if (meta.emit == emit_t.CLOSE || meta.emit == emit_t.CLOSE_AS_IS) {
            result_write_action();
        } else if (meta.emit == emit_t.RESEND) {
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
