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
    // A leaf's uplink (§11 "The leaf"): its sum of round up_round[s] is at the spine and no
    // verdict has come back (up_pending), the hosts in it, its count and chunk, and the
    // transmission number of its latest uplink.
    register<bit<1>>(SLOT_CELLS) up_pending;
    register<round_t>(SLOT_CELLS) up_round;
    register<bitmap_t>(SLOT_CELLS) up_bitmap;
    register<count_t>(SLOT_CELLS) up_count;
    register<chunk_t>(SLOT_CELLS) up_chunk;
    register<bit<5>>(SLOT_CELLS) up_tx;

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
        up_pending.read(meta.up.pending, s);
        up_round.read(meta.up.round, s);
        up_bitmap.read(meta.up.bitmap, s);
        up_count.read(meta.up.count, s);
        up_chunk.read(meta.up.chunk, s);
        up_tx.read(meta.up.tx, s);
        meta.up.send = false;
        meta.up.retransmit = false;

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
            meta.up.pending = 0;
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

    // §11 leaf step 3: a host's packet for the round whose sum is at the spine. From a host
    // in the sum it asks again (its result or the uplink was lost): the uplink goes again,
    // the uplink's only retransmission (switches have no timers). From any other host it is
    // late: answered as §4 answers a contribution it does not count.
    @hidden action pending_round_action() {
        bitmap_t me = (bitmap_t) 1 << hdr.hysync.worker_id;
        meta.member_counter = member_counter_t.NONE;
        meta.cell_op = member_cell_op_t.NONE;
        meta.lane_write = lane_write_t.NONE;
        meta.resync_reason = RESYNC_NONE;
        meta.count_drop = true;
        if ((meta.up.bitmap & me) != 0) {
            meta.verdict = verdict_t.DUPLICATE;
            meta.emit = emit_t.NONE;
            meta.drop_reason = DROP_UPLINK_RESENT;
            meta.up.send = true;
            meta.up.retransmit = true;
        } else {
            meta.verdict = verdict_t.STALE;
            meta.emit = emit_t.RESYNC;
            meta.drop_reason = DROP_STALE;
            meta.member_counter = member_counter_t.STALE;
            meta.cell_op = member_cell_op_t.REFUSE;
            meta.resync_reason = RESYNC_STALE_ROUND;
        }
    }

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
        bool leaf = meta.role.level == LEVEL_LEAF;
        // §11 leaf step 2: while a sum is at the spine the open round absorbs and waits; it
        // closes on a member's first packet after the verdict (the close on a
        // retransmission).
        if (leaf && meta.up.pending == 1) {
            if (meta.emit == emit_t.CLOSE) {
                meta.emit = emit_t.ABSORB;
            } else if (meta.emit == emit_t.CLOSE_AS_IS) {
                meta.emit = emit_t.NONE;
            }
        }
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
            meta.slot.cur = meta.slot.cur + 1;
            meta.slot.count = 0;
            meta.slot.bitmap = 0;
            if (leaf) {
                // §11 leaf step 1: the close goes up, not down. The sum stays in the bank
                // of its round; there is no result to resend until the spine's verdict.
                meta.up.pending = 1;
                meta.up.round = meta.out_round;
                meta.up.bitmap = meta.out_bitmap;
                meta.up.count = meta.out_count;
                meta.up.chunk = meta.out_chunk;
                meta.up.send = true;
                meta.slot.has_result = 0;
            } else {
                meta.weight = 0;
                meta.slot.has_result = 1;
            }
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
        } else if (meta.up.retransmit) {
            // The pending sum again, from its bank.
            meta.lane_op = lane_op_t.READ;
            meta.lane_cell = 2 * s + (cell_index_t) (meta.up.round & 1);
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

        // The uplink's header: the leaf's CONTRIB of its sum, transmission number up_tx + 1.
        if (meta.up.send) {
            meta.up.tx = meta.up.tx + 1;
            meta.out_mode = meta.slot.mode;
            meta.out_quorum = meta.slot.quorum;
            meta.out_reason = 0;
            meta.out_round = meta.up.round;
            meta.out_count = meta.up.count;
            meta.out_chunk = meta.up.chunk;
            meta.out_bitmap = 0;
        }
        up_pending.write(s, meta.up.pending);
        up_round.write(s, meta.up.round);
        up_bitmap.write(s, meta.up.bitmap);
        up_count.write(s, meta.up.count);
        up_chunk.write(s, meta.up.chunk);
        up_tx.write(s, meta.up.tx);
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

    // ------------------------------------------------ a spine's verdict at a leaf (§11)
    // Steps 4-5, on the first pass of a spine's RESULT or RESYNC: what it settles, the
    // slot's registers after it, the hosts to mark refused and what to relay.
    @hidden action verdict_action() {
        cell_index_t s = (cell_index_t) hdr.hysync.slot;
        round_t r = hdr.hysync.round;
        slot_epoch.read(meta.slot.epoch, s);
        res_valid.read(meta.slot.has_result, s);
        round.read(meta.slot.cur, s);
        count.read(meta.slot.count, s);
        bitmap.read(meta.slot.bitmap, s);
        chunk.read(meta.slot.chunk, s);
        weight.read(meta.weight, s);
        up_pending.read(meta.up.pending, s);
        up_round.read(meta.up.round, s);
        up_bitmap.read(meta.up.bitmap, s);
        up_tx.read(meta.up.tx, s);
        if (meta.slot.epoch != meta.epoch) {   // step 8's fresh slot
            meta.slot.epoch = meta.epoch;
            meta.slot.has_result = 0;
            meta.slot.cur = 0;
            meta.slot.count = 0;
            meta.slot.bitmap = 0;
            meta.slot.chunk = 0;
            meta.weight = 0;
            meta.up.pending = 0;
        }
        meta.relay = RELAY_NONE;
        meta.mark_hosts = 0;
        meta.mark_hosts2 = 0;
        meta.lane_op = lane_op_t.NONE;
        meta.lane_cell = 2 * s + (cell_index_t) (r & 1);
        meta.lane_keep = 0;
        round_t behind = meta.slot.cur - r;     // cur after r, as serial numbers: > 0
        bool cur_after = behind != 0 && behind[31:31] == 0;
        if (hdr.hysync.op == OP_RESULT) {
            bool counted = ((hdr.hysync.bitmap >> meta.role.uplink_id) & 1) == 1;
            if (hdr.hysync.reason != meta.epoch[7:0]) {
                // Another install's result (a spine restarted, the job added again).
                meta.count_drop = true;
                meta.drop_reason = DROP_STALE;
            } else if (meta.up.pending == 1 && r == meta.up.round) {
                // The answer to the sum: the hosts' bits go down only with the leaf's own.
                meta.up.pending = 0;
                meta.relay = RELAY_RESULT;
                meta.relay_hosts = meta.up.bitmap;
                if (!counted) {
                    meta.mark_hosts = meta.up.bitmap;
                    meta.mark_round = r;
                    meta.relay_hosts = 0;
                }
            } else if (!cur_after) {
                // A round the spine closed without this rack: what the leaf had open can
                // no longer reach the spine. A sum pending for an earlier round stays.
                meta.mark_hosts = meta.slot.bitmap;
                meta.mark_round = meta.slot.cur;
                meta.slot.cur = r + 1;
                meta.slot.count = 0;
                meta.slot.bitmap = 0;
                meta.relay = RELAY_RESULT;
                meta.relay_hosts = 0;
            } else {
                meta.count_drop = true;
                meta.drop_reason = DROP_DUPLICATE;
            }
            // Only the last round's result is kept for RESENDs: a verdict delivered behind
            // a later round's is relayed, not stored.
            if (meta.relay == RELAY_RESULT && r == meta.slot.cur - 1) {
                meta.lane_op = lane_op_t.ACCUMULATE;
                meta.slot.has_result = 1;
                res_bitmap.write(s, meta.relay_hosts);
                res_count.write(s, hdr.hysync.count);
                res_chunk.write(s, hdr.hysync.chunk);
                res_mode.write(s, hdr.hysync.mode);
                res_quorum.write(s, hdr.hysync.quorum);
            }
        } else if (meta.up.pending == 0
                   || (hdr.hysync.flags & TX_MASK) != ((flags_t) meta.up.tx) << 3) {
            // A RESYNC that answers no pending uplink, or not the latest one.
            meta.count_drop = true;
            meta.drop_reason = DROP_STALE;
        } else {
            meta.up.pending = 0;
            if (hdr.hysync.reason != RESYNC_STALE_COUNTED) {
                // Not counted: its hosts are marked refused and told, the flight named by
                // the sum's chunk (a CHUNK_MISMATCH: by its round, with the spine's chunk).
                meta.mark_hosts = meta.up.bitmap;
                meta.mark_round = meta.up.round;
                meta.relay = RELAY_RESYNC;
                meta.relay_hosts = meta.up.bitmap;
                up_chunk.read(meta.relay_chunk, s);
                if (hdr.hysync.reason == RESYNC_CHUNK_MISMATCH) {
                    meta.relay_chunk = hdr.hysync.chunk;
                }
            }
            round_t ahead = r - meta.slot.cur;
            if (ahead != 0 && ahead[31:31] == 0) {
                // Forward only: a RESYNC delayed behind later results must not take the
                // leaf back to a round its hosts are past.
                meta.mark_hosts2 = meta.slot.bitmap;
                meta.mark_round2 = meta.slot.cur;
                meta.slot.cur = r;
                meta.slot.count = 0;
                meta.slot.bitmap = 0;
                meta.slot.has_result = 0;
            }
        }
        slot_epoch.write(s, meta.slot.epoch);
        res_valid.write(s, meta.slot.has_result);
        round.write(s, meta.slot.cur);
        count.write(s, meta.slot.count);
        bitmap.write(s, meta.slot.bitmap);
        weight.write(s, meta.weight);
        up_pending.write(s, meta.up.pending);
    }

    // Step 6, one host per pass: the lowest host still to mark reads "not counted in the
    // round" from now on, over the leaf's own "counted", unless its cell is about a later
    // round of this install.
    @hidden action mark_action() {
        bitmap_t hosts = meta.mark_hosts;
        round_t r = meta.mark_round;
        if (hosts == 0) {
            hosts = meta.mark_hosts2;
            r = meta.mark_round2;
        }
        bitmap_t low = hosts & (~hosts + 1);
        cell_index_t h = 0;
        if (low[15:0] == 0) { h = h + 16; low = low >> 16; }
        if (low[7:0] == 0) { h = h + 8; low = low >> 8; }
        if (low[3:0] == 0) { h = h + 4; low = low >> 4; }
        if (low[1:0] == 0) { h = h + 2; low = low >> 2; }
        if (low[0:0] == 0) { h = h + 1; }
        cell_index_t cell = (cell_index_t) hdr.hysync.slot * MAX_WORKERS + h;
        round_t seq;
        epoch_t seq_epoch;
        member_seq.read(seq, cell);
        member_epoch.read(seq_epoch, cell);
        round_t later = seq - r;
        if ((seq_epoch != meta.epoch && seq_epoch != ~meta.epoch)
            || later == 0 || later[31:31] == 1) {
            seq = r;
            seq_epoch = ~meta.epoch;
        }
        member_seq.write(cell, seq);
        member_epoch.write(cell, seq_epoch);
        if (meta.mark_hosts != 0) {
            meta.mark_hosts = meta.mark_hosts & (meta.mark_hosts - 1);
        } else {
            meta.mark_hosts2 = meta.mark_hosts2 & (meta.mark_hosts2 - 1);
        }
    }

#define LANE_APPLY(i) lanes_##i.apply(hdr.lanes[i].value, meta.lane_cell, meta.lane_op, meta.lane_keep);

    apply {
        if (meta.spine_verdict) {
            // §11: a spine's verdict at a leaf, then its hosts marked, one per pass.
            if (!meta.resubmitted) {
                verdict_action();
                if (meta.lane_op != lane_op_t.NONE) {
                    FOR_EACH_LANE(LANE_APPLY)
                }
            }
            if (meta.mark_hosts != 0 || meta.mark_hosts2 != 0) {
                mark_action();
            }
            return;
        }

        // 8-10. Read and latch the slot, decide, apply the outcome.
        slot_read_action();
        if (meta.role.level == LEVEL_LEAF && meta.up.pending == 1
            && hdr.hysync.round == meta.up.round) {
            pending_round_action();
        } else {
            decide.apply();
        }
        slot_write_action();

        // The closing round's header is kept for resends (a leaf's waits for the spine's
        // verdict); a resend reads it back.
        if ((meta.emit == emit_t.CLOSE || meta.emit == emit_t.CLOSE_AS_IS) && !meta.up.send) {
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
