// The per-slot registers of protocol.md §3 on Tofino: one control per register, each
// register touched by one RegisterAction per pass, each RegisterAction within one
// stateful ALU (Tofino 1: two comparisons, two updates per 32-bit half, one 32-bit
// output). v1model reads all of them in one action and writes them in another (simple_switch
// runs one packet at a time through ingress); here
// the decision is spread over the stages in order (docs/tofino.md, "Stages"):
//
//   Round        {round[s], epoch}              first pass: read; a close's last lane
//                                               pass: advance; ASYNC pass: take;
//                                               reset pass: round 0 of a new epoch
//   SlotEpoch    slot_epoch[s]                  first pass: read; reset pass: write
//   ModeLatch    {round tag, packed mode}       latch when a round opens, else read;
//                                               reset pass: clear
//   ChunkLatch   {round + 1 tag, chunk}         the same
//   Bitmap       bitmap[s]                      start / join / read       (Counting)
//   MemberSeq    member_seq[s*32+w], 4 parts    swap (counted) / swap unless behind
//                                               (async) / read; holds round + CRC32
//                                               of the epoch              (Counting)
//   Count        count[s], bit 31 = closing     start / join / duplicate / read
//   ResultHeader res_* (3 registers), per bank  write (a close's decision, an ASYNC
//                                               pass); read (a resend's decision)
//
// Counting runs in the first pass on Tofino 2 and in the DECIDE pass on Tofino 1.
// A latch is tagged with the round it belongs to instead of being cleared when the round
// closes: the round that opens next finds a stale tag, so nothing has to be reset.

#ifndef __HYSYNC_TNA_SLOT_REGISTERS__
#define __HYSYNC_TNA_SLOT_REGISTERS__

// round[s], with the epoch it counts in: read in the first pass. A close's last CLOSE lane
// pass advances it, only if it still holds the round that closed; an async contribution's
// ASYNC pass takes the next round number (fetch and increment), so concurrent
// async rounds never share one. A reset pass (docs/tofino.md, "The install epoch") starts
// round 0 of the new epoch unless an earlier reset pass of the same install already did,
// and answers with the epoch it found: the latches are cleared only by the first.
control Round(inout headers_t hdr, inout tna_metadata_t tf, in pass_t pass, in bit<1> last,
              in epoch_t epoch) {
    Register<round_epoch_t, slot_index_t>(SLOT_CELLS) round;

    RegisterAction<round_epoch_t, slot_index_t, round_t>(round) read_register_action = {
        void apply(inout round_epoch_t value, out round_t read_value) {
            read_value = value.round;
        }
    };

    RegisterAction<round_epoch_t, slot_index_t, round_t>(round) advance_register_action = {
        void apply(inout round_epoch_t value) {
            if (value.round == hdr.hysync.round) {
                value.round = value.round + 1;
            }
        }
    };

    RegisterAction<round_epoch_t, slot_index_t, round_t>(round) take_register_action = {
        void apply(inout round_epoch_t value, out round_t taken) {
            taken = value.round;
            value.round = value.round + 1;
        }
    };

    RegisterAction<round_epoch_t, slot_index_t, bit<8>>(round) reset_register_action = {
        void apply(inout round_epoch_t value, out bit<8> differs) {
            differs = 0;
            if (value.epoch != epoch) {
                value.epoch = epoch;
                value.round = 0;
                differs = 1;
            }
        }
    };

    @hidden action read_action() {
        tf.cur = read_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action advance_action() {
        advance_register_action.execute(hdr.hysync.slot[12:0]);
    }

    // The taken number goes into the header in AsyncPass (aggregation.p4). Written here,
    // it moved Tofino 1's placement to 13 stages (docs/tofino.md, How Tofino 1 fits).
    @hidden action take_action() {
        tf.cur = take_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action reset_action() {
        tf.epoch_differs = reset_register_action.execute(hdr.hysync.slot[12:0]);
    }

    apply {
        if (pass == pass_t.CLOSE && last == 1) {
            advance_action();
        } else if (pass == pass_t.ASYNC) {
            take_action();
        } else if (pass == pass_t.RESET) {
            reset_action();
        } else if (pass == pass_t.NONE) {
            read_action();
        }
    }
}

// slot_epoch[s]: the install that used the slot last (protocol.md §4 step 8). Read by
// every first pass, which learns whether it differs from the job's epoch; written by a reset
// pass. It mirrors the round register's epoch half, which the first pass cannot compare:
// the round is read in the stage where the jobs table, which knows the epoch, is looked up.
control SlotEpoch(in headers_t hdr, inout tna_metadata_t tf, in pass_t pass, in epoch_t epoch) {
    Register<epoch_t, slot_index_t>(SLOT_CELLS) slot_epoch;

    RegisterAction<epoch_t, slot_index_t, bit<8>>(slot_epoch) read_register_action = {
        void apply(inout epoch_t value, out bit<8> differs) {
            differs = 0;
            if (value != epoch) {
                differs = 1;
            }
        }
    };

    RegisterAction<epoch_t, slot_index_t, epoch_t>(slot_epoch) write_register_action = {
        void apply(inout epoch_t value) {
            value = epoch;
        }
    };

    @hidden action read_action() {
        tf.epoch_differs = read_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action write_action() {
        write_register_action.execute(hdr.hysync.slot[12:0]);
    }

    apply {
        if (pass == pass_t.RESET) {
            write_action();
        } else if (pass == pass_t.NONE) {
            read_action();
        }
    }
}

// mode[s], quorum[s]: latched by the contribution that opens a round (tag = its round);
// read by every other packet (0 = no round under way: the desired mode applies).
control ModeLatch(in headers_t hdr, inout tna_metadata_t tf, in pass_t pass, in epoch_t epoch) {
    Register<tagged_t, slot_index_t>(SLOT_CELLS) mode;

    // Only the contribution to the open round latches (r == cur), so both actions compare
    // the tag with cur: a stateful ALU takes at most two PHV words (here cur and desired).
    // A latched value always has the LATCHED bit (set here, in the stateful ALU), so the
    // zero the register starts with (tag 0, value 0) is "nothing latched", not "latched
    // for round 0".
    RegisterAction<tagged_t, slot_index_t, packed_mode_t>(mode) latch_register_action = {
        void apply(inout tagged_t value, out packed_mode_t latched_before) {
            latched_before = 0;
            if (value.tag == tf.cur && value.value != 0) {
                latched_before = value.value;
            } else {
                value.tag = tf.cur;
                value.value = tf.desired | LATCHED;
            }
        }
    };

    RegisterAction<tagged_t, slot_index_t, packed_mode_t>(mode) read_register_action = {
        void apply(inout tagged_t value, out packed_mode_t latched) {
            latched = 0;
            if (value.tag == tf.cur && value.value != 0) {
                latched = value.value;
            }
        }
    };

    RegisterAction<tagged_t, slot_index_t, packed_mode_t>(mode) clear_register_action = {
        void apply(inout tagged_t value) {
            value.tag = 0;
            value.value = 0;
        }
    };

    @hidden action latch_action() {
        tf.latched = latch_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action read_action() {
        tf.latched = read_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action clear_action() {
        clear_register_action.execute(hdr.hysync.slot[12:0]);
    }

    apply {
        if (pass == pass_t.RESET) {
            // The first reset pass of an install: nothing latched in the new epoch.
            if (tf.epoch_differs == 1) {
                clear_action();
            }
        } else if (tf.open && !tf.desired_async && !tf.join) {
            // Only a contribution to the open round can open it, never a JOIN, and never
            // in async: async never latches, so a swap away from async applies at the next
            // contribution.
            latch_action();
        } else {
            read_action();
        }
    }
}

// chunk[s]: latched by the contribution that opens a round; it is never cleared, so a
// RESYNC reports the last latched chunk as on v1model. Any chunk value is valid, so the tag
// is the round + 1: the zero the register starts with matches no round (but 2^32 - 1).
control ChunkLatch(in headers_t hdr, inout tna_metadata_t tf, in pass_t pass, in epoch_t epoch) {
    Register<tagged_t, slot_index_t>(SLOT_CELLS) chunk;

    RegisterAction<tagged_t, slot_index_t, chunk_t>(chunk) latch_register_action = {
        void apply(inout tagged_t value, out chunk_t before) {
            before = value.value;
            if (value.tag != tf.r_plus_1) {
                value.tag = tf.r_plus_1;
                value.value = hdr.hysync.chunk;
            }
        }
    };

    RegisterAction<tagged_t, slot_index_t, chunk_t>(chunk) read_register_action = {
        void apply(inout tagged_t value, out chunk_t before) {
            before = value.value;
        }
    };

    // Chunk 0 in the new epoch, as v1model's reset writes it; tag 0 matches no round + 1.
    RegisterAction<tagged_t, slot_index_t, chunk_t>(chunk) clear_register_action = {
        void apply(inout tagged_t value) {
            value.tag = 0;
            value.value = 0;
        }
    };

    @hidden action latch_action() {
        tf.stored_chunk = latch_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action read_action() {
        tf.stored_chunk = read_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action clear_action() {
        clear_register_action.execute(hdr.hysync.slot[12:0]);
    }

    // The same packets as ModeLatch's latch and clear: both tags always name the same round.
    apply {
        if (pass == pass_t.RESET) {
            if (tf.epoch_differs == 1) {
                clear_action();
            }
        } else if (tf.open && !tf.desired_async && !tf.join) {
            latch_action();
        } else {
            read_action();
        }
    }
}

// bitmap[s]: the opening contribution writes its bit, later ones OR theirs in (a duplicate
// ORs a bit that is already set: no change). Its tag is the mode latch's.
control Bitmap(in headers_t hdr, inout tna_metadata_t tf, in bridge_h b) {
    Register<bitmap_t, slot_index_t>(SLOT_CELLS) bitmap;

    RegisterAction<bitmap_t, slot_index_t, bitmap_t>(bitmap) start_register_action = {
        void apply(inout bitmap_t value) {
            value = tf.me;
        }
    };

    RegisterAction<bitmap_t, slot_index_t, bitmap_t>(bitmap) join_register_action = {
        void apply(inout bitmap_t value, out bitmap_t before) {
            before = value;
            value = value | tf.me;
        }
    };

    RegisterAction<bitmap_t, slot_index_t, bitmap_t>(bitmap) read_register_action = {
        void apply(inout bitmap_t value, out bitmap_t before) {
            before = value;
        }
    };

    @hidden action start_action() {
        start_register_action.execute(hdr.hysync.slot[12:0]);
        tf.stored_bits = 0;
    }

    @hidden action join_action() {
        tf.stored_bits = join_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action read_action() {
        tf.stored_bits = read_register_action.execute(hdr.hysync.slot[12:0]);
    }

    apply {
        if (b.fresh == 1) {
            start_action();
        } else if (b.open_sync == 1 && b.chunk_ok == 1) {
            join_action();
        } else {
            read_action();
        }
    }
}

// member_seq[s*32 + w]: the round (or sequence number) of the contribution w was last
// counted with plus the CRC32 of the epoch (tf.seq_key), where v1model keeps the round and the
// epoch it was written in (member_seq, member_epoch): a cell of another install matches with
// probability 2^-32, and the zero every register starts with means "never counted" but for
// that chance. Within an install two keys differ as their numbers do, so the async path's
// swap can tell a number 1 .. ASYNC_WINDOW - 1 behind the one counted (protocol.md §4 step
// 10) and keeps the cell then. A swap both tests and records: the old value equal to the key
// means this contribution was counted before (a duplicate in sync/partial, an ACK in async).
//
// Four registers of eight workers each (`part` = worker_id / 8), of which a packet uses
// its worker's: 8192 x 32 cells of 32 bits are 64 unit RAMs, and one stateful ALU
// addresses at most 23 (the compiler's Memories::MAX_METERS_RAM_PER_ALU, less the spare).
control MemberSeq(in headers_t hdr, inout tna_metadata_t tf, in bridge_h b)(bit<2> part) {
    Register<bit<32>, member_index_t>(MEMBER_SEQ_PART_CELLS) member_seq;

    // Each answers 1 if the cell held the key (counted before), else 0: a flag, where the
    // old value would take a 32-bit PHV container for one comparison.
    RegisterAction<bit<32>, member_index_t, bit<8>>(member_seq) swap_register_action = {
        void apply(inout bit<32> value, out bit<8> counted) {
            counted = 0;
            if (value == b.seq_key) {
                counted = 1;
            }
            value = b.seq_key;
        }
    };

    // The async path's: 1 if the cell held the key, 2 if it held a key 1 .. ASYNC_WINDOW - 1
    // after it (an older copy: the cell keeps the newer one), else 0. Tofino 1's stateful ALU
    // has two comparisons: value - key below ASYNC_WINDOW (unsigned: 0 .. ASYNC_WINDOW - 1
    // modulo 2^32) and value == key tell the three apart.
    RegisterAction<bit<32>, member_index_t, bit<8>>(member_seq) async_swap_register_action = {
        void apply(inout bit<32> value, out bit<8> counted) {
            if (value - b.seq_key < ASYNC_WINDOW) {
                counted = 2;
                if (value == b.seq_key) {
                    counted = 1;
                }
            } else {
                counted = 0;
                value = b.seq_key;
            }
        }
    };

    RegisterAction<bit<32>, member_index_t, bit<8>>(member_seq) read_register_action = {
        void apply(inout bit<32> value, out bit<8> counted) {
            counted = 0;
            if (value == b.seq_key) {
                counted = 1;
            }
        }
    };

    @hidden action swap_action() {
        tf.counted = swap_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.worker_id[2:0]);
    }

    @hidden action async_swap_action() {
        tf.counted = async_swap_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.worker_id[2:0]);
    }

    @hidden action read_action() {
        tf.counted = read_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.worker_id[2:0]);
    }

    apply {
        if (hdr.hysync.worker_id[4:3] == part) {
            // A JOIN in async is never counted: it is read, for the ACK of a counted one.
            if (b.async_path == 1 && b.join == 0) {
                async_swap_action();
            } else if (b.open_sync == 1 && (b.fresh == 1 || b.chunk_ok == 1)) {
                swap_action();
            } else {
                read_action();
            }
        }
    }
}

// count[s] and the close guard. A contribution whose count reaches the quorum adds
// CLOSING (bit 31) with its increment: until its last CLOSE pass advances the round, every
// later contribution to it reads a negative count and is refused, so a round closes once
// and no lane op of it follows the close's in the recirculation queue.
//
// Every action answers with the count after the packet, or 0 when it changed nothing
// (a refused or uncounted packet): the verdict tests that answer's sign and zero, which a
// gateway can, instead of comparing a count with the quorum, which it cannot.
control Count(in headers_t hdr, inout tna_metadata_t tf, in bridge_h b) {
    Register<int<32>, slot_index_t>(SLOT_CELLS) count;

    RegisterAction<int<32>, slot_index_t, int<32>>(count) start_register_action = {
        void apply(inout int<32> value, out int<32> after) {
            if (tf.q == 1) {
                value = CLOSING + 1;
            } else {
                value = 1;
            }
            after = value;
        }
    };

    RegisterAction<int<32>, slot_index_t, int<32>>(count) join_register_action = {
        void apply(inout int<32> value, out int<32> after) {
            after = 0;
            if (value >= 0) {
                if (value + 1 >= tf.q) {
                    value = value + (CLOSING + 1);
                } else {
                    value = value + 1;
                }
                after = value;
            }
        }
    };

    // A duplicate closes the round with the lanes it holds if the quorum shrank under it
    // (an exclusion) and nobody closes it already.
    RegisterAction<int<32>, slot_index_t, int<32>>(count) duplicate_register_action = {
        void apply(inout int<32> value, out int<32> after) {
            after = 0;
            if (value >= tf.q) {
                value = value + CLOSING;
                after = value;
            }
        }
    };

    RegisterAction<int<32>, slot_index_t, int<32>>(count) read_register_action = {
        void apply(inout int<32> value, out int<32> after) {
            after = value;
        }
    };

    @hidden action start_action() {
        tf.count_out = start_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action join_action() {
        tf.count_out = join_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action duplicate_action() {
        tf.count_out = duplicate_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action read_action() {
        tf.count_out = read_register_action.execute(hdr.hysync.slot[12:0]);
    }

    apply {
        if (b.open_sync == 1 && b.fresh == 1) {
            start_action();
        } else if (b.open_sync == 1 && b.chunk_ok == 1) {
            if (tf.counted == 1) {
                duplicate_action();
            } else {
                join_action();
            }
        } else {
            read_action();
        }
    }
}

#ifdef HYSYNC_ROLES
// weight[s] (protocol.md §11, "The spine"): the hosts in the open round's sum. Count
// counts members (a spine's leaves: its quorum counts leaves); Weight adds each counted
// contribution's weight_inc (the uplink's count byte at a spine, 1 elsewhere, so that at a
// single switch it is count[s]'s low byte). A RESULT's count is its answer. After Count:
// whether the contribution was counted is Count's answer (0: its guard refused it). Eight
// bits, so that it wraps as the RESULT's count byte does.
control Weight(in headers_t hdr, inout tna_metadata_t tf, in bridge_h b) {
    Register<count_t, slot_index_t>(SLOT_CELLS) weight;

    RegisterAction<count_t, slot_index_t, count_t>(weight) start_register_action = {
        void apply(inout count_t value, out count_t after) {
            value = b.weight_inc;
            after = value;
        }
    };

    RegisterAction<count_t, slot_index_t, count_t>(weight) add_register_action = {
        void apply(inout count_t value, out count_t after) {
            value = value + b.weight_inc;
            after = value;
        }
    };

    RegisterAction<count_t, slot_index_t, count_t>(weight) read_register_action = {
        void apply(inout count_t value, out count_t after) {
            after = value;
        }
    };

    @hidden action start_action() {
        tf.weight_out = start_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action add_action() {
        tf.weight_out = add_register_action.execute(hdr.hysync.slot[12:0]);
    }

    @hidden action read_action() {
        tf.weight_out = read_register_action.execute(hdr.hysync.slot[12:0]);
    }

    apply {
        if (b.open_sync == 1 && b.fresh == 1) {
            start_action();
        } else if (b.open_sync == 1 && b.chunk_ok == 1 && tf.counted == 0
                   && tf.count_out != 0) {
            add_action();
        } else {
            read_action();
        }
    }
}
#endif

// res_bitmap, res_count/res_mode/res_quorum (packed) and res_chunk, per bank like the lanes
// (cell 2s + b, the round's parity): written by the pass that decides a close (or by an
// async contribution's ASYNC pass, which takes its round), read by the pass that decides a
// resend. A resend of round r reads bank r & 1, which only the close of round r + 2 writes
// again: that close is decided after every pass that could still decide to resend r.
control ResultHeader(inout headers_t hdr, inout tna_metadata_t tf, inout bridge_h bridge) {
    Register<bitmap_t, bank_index_t>(RESULT_CELLS) res_bitmap;
    Register<bit<32>, bank_index_t>(RESULT_CELLS) res_meta;      // count << 16 | mode << 8 | quorum
    Register<chunk_t, bank_index_t>(RESULT_CELLS) res_chunk;

    RegisterAction<bitmap_t, bank_index_t, bitmap_t>(res_bitmap) bitmap_write_register_action = {
        void apply(inout bitmap_t value) { value = hdr.hysync.bitmap; }
    };
    RegisterAction<bitmap_t, bank_index_t, bitmap_t>(res_bitmap) bitmap_read_register_action = {
        void apply(inout bitmap_t value, out bitmap_t read_value) { read_value = value; }
    };
    RegisterAction<bit<32>, bank_index_t, bit<32>>(res_meta) meta_write_register_action = {
        void apply(inout bit<32> value) {
            value = tf.res_packed;
        }
    };
    RegisterAction<bit<32>, bank_index_t, bit<32>>(res_meta) meta_read_register_action = {
        void apply(inout bit<32> value, out bit<32> read_value) { read_value = value; }
    };
    RegisterAction<chunk_t, bank_index_t, chunk_t>(res_chunk) chunk_write_register_action = {
        void apply(inout chunk_t value) { value = hdr.hysync.chunk; }
    };
    RegisterAction<chunk_t, bank_index_t, chunk_t>(res_chunk) chunk_read_register_action = {
        void apply(inout chunk_t value, out chunk_t read_value) { read_value = value; }
    };

    // One register per action: a stateful ALU is addressed once per action.
    @hidden action bitmap_write_action() {
        bitmap_write_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.round[0:0]);
    }
    @hidden action meta_write_action() {
        meta_write_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.round[0:0]);
    }
    @hidden action chunk_write_action() {
        chunk_write_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.round[0:0]);
    }
    @hidden action bitmap_read_action() {
        hdr.hysync.bitmap = bitmap_read_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.round[0:0]);
    }
    @hidden action meta_read_action() {
        bridge.res_packed = meta_read_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.round[0:0]);
    }
    @hidden action chunk_read_action() {
        hdr.hysync.chunk = chunk_read_register_action.execute(hdr.hysync.slot[12:0] ++ hdr.hysync.round[0:0]);
    }

    apply {
        if (tf.result_op == result_op_t.WRITE) {
            bitmap_write_action();
            meta_write_action();
            chunk_write_action();
        } else if (tf.result_op == result_op_t.READ) {
            bitmap_read_action();
            meta_read_action();
            chunk_read_action();
        }
    }
}

#endif  // __HYSYNC_TNA_SLOT_REGISTERS__
