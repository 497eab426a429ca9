// Lanes (protocol.md §3): two banks per slot, selected by round parity, as on v1model; on
// Tofino two lanes share one 64-bit register (SwitchML's pairing), so 64 lanes take 32
// stateful ALUs: 8 stages of 4 on either chip.
//
// The lanes act in the pass after the one that decided (docs/tofino.md, "Stages"): their
// op comes from the bridge header the recirculated packet carries and their bank from the
// header's round (the contribution's, or the one an async pass took), parsed fields that
// nothing before them computes, so they share the stages the first-pass decision takes (in
// the other branch of the test of the pass, hysync.p4).
//
// This is the one control that differs between the chips. A Tofino 2 stateful ALU returns
// both halves of the pair; a Tofino 1 ALU returns one 32-bit word, so the CLOSE (or
// RESEND) pass returns the odd lanes and a SEND_GROUP (SEND_BACK) pass after it reads the
// even lanes (docs/tofino.md, "Differences").

#ifndef __HYSYNC_TNA_LANES__
#define __HYSYNC_TNA_LANES__

control LanePair(inout bit<32> even, inout bit<32> odd,
                 in slot_index_t slot, in bit<1> bank, in tna_lane_op_t op) {
    Register<lane_pair_t, bank_index_t>(LANE_BANK_CELLS) banks;

    // The first contribution of a round writes the bank: there is no clearing pass.
    RegisterAction<lane_pair_t, bank_index_t, bit<32>>(banks) write_register_action = {
        void apply(inout lane_pair_t value) {
            value.even = even;
            value.odd = odd;
        }
    };

    @hidden action write_action() {
        write_register_action.execute(slot ++ bank);
    }

#if __TARGET_TOFINO__ == 2
    // Sums wrap mod 2^32, as the workers expect.
    RegisterAction<lane_pair_t, bank_index_t, bit<32>>(banks) add_register_action = {
        void apply(inout lane_pair_t value, out bit<32> sum_even, out bit<32> sum_odd) {
            value.even = value.even + even;
            value.odd = value.odd + odd;
            sum_even = value.even;
            sum_odd = value.odd;
        }
    };

    RegisterAction<lane_pair_t, bank_index_t, bit<32>>(banks) read_register_action = {
        void apply(inout lane_pair_t value, out bit<32> stored_even, out bit<32> stored_odd) {
            stored_even = value.even;
            stored_odd = value.odd;
        }
    };

    @hidden action add_action() {
        even = add_register_action.execute(slot ++ bank, odd);
    }

    @hidden action read_action() {
        even = read_register_action.execute(slot ++ bank, odd);
    }

    @hidden table op_table {
        key = {
            op : exact;
        }
        actions = {
            write_action;
            add_action;
            read_action;
            @defaultonly NoAction;
        }
        const entries = {
            tna_lane_op_t.WRITE : write_action();
            tna_lane_op_t.ADD : add_action();
            tna_lane_op_t.READ : read_action();
        }
        const default_action = NoAction();
        size = 4;
    }
#else
    // One output word: the sum of the odd lane now, the even one in the next pass.
    RegisterAction<lane_pair_t, bank_index_t, bit<32>>(banks) add_register_action = {
        void apply(inout lane_pair_t value, out bit<32> sum_odd) {
            value.even = value.even + even;
            value.odd = value.odd + odd;
            sum_odd = value.odd;
        }
    };

    RegisterAction<lane_pair_t, bank_index_t, bit<32>>(banks) read_odd_register_action = {
        void apply(inout lane_pair_t value, out bit<32> stored_odd) {
            stored_odd = value.odd;
        }
    };

    RegisterAction<lane_pair_t, bank_index_t, bit<32>>(banks) read_even_register_action = {
        void apply(inout lane_pair_t value, out bit<32> stored_even) {
            stored_even = value.even;
        }
    };

    @hidden action add_action() {
        odd = add_register_action.execute(slot ++ bank);
    }

    @hidden action read_odd_action() {
        odd = read_odd_register_action.execute(slot ++ bank);
    }

    @hidden action read_even_action() {
        even = read_even_register_action.execute(slot ++ bank);
    }

    @hidden table op_table {
        key = {
            op : exact;
        }
        actions = {
            write_action;
            add_action;
            read_odd_action;
            read_even_action;
            @defaultonly NoAction;
        }
        const entries = {
            tna_lane_op_t.WRITE : write_action();
            tna_lane_op_t.ADD : add_action();
            tna_lane_op_t.READ : read_odd_action();
            tna_lane_op_t.READ_EVEN : read_even_action();
        }
        const default_action = NoAction();
        size = 4;
    }
#endif

    // One table per pair, its action chosen by the op: one logical table and one stateful
    // ALU, where a chain of ifs costs a table per action and a gateway per test, and
    // Tofino has 16 logical tables per stage (four pairs would not fit one stage).
    apply {
        op_table.apply();
    }
}

// All 32 pairs, instantiated and applied from the one list of pair indices per half.
control Lanes(inout headers_t hdr, in bridge_h bridge) {
#define PAIR_INSTANCE(p) LanePair() pair_lo_##p; LanePair() pair_hi_##p;
    FOR_EACH_HALF_PAIR(PAIR_INSTANCE)
#undef PAIR_INSTANCE

#define PAIR_APPLY(p) \
    pair_lo_##p.apply(hdr.lanes_lo.even_##p, hdr.lanes_lo.odd_##p, hdr.hysync.slot[12:0], hdr.hysync.round[0:0], bridge.lane_op); \
    pair_hi_##p.apply(hdr.lanes_hi.even_##p, hdr.lanes_hi.odd_##p, hdr.hysync.slot[12:0], hdr.hysync.round[0:0], bridge.lane_op);
    apply {
        FOR_EACH_HALF_PAIR(PAIR_APPLY)
    }
#undef PAIR_APPLY
}

#endif  // __HYSYNC_TNA_LANES__
