// Lanes (protocol.md §3): two banks per slot, selected by round parity, as on v1model.
//
// The lanes act in a lane pass, the pass after the one that decided (docs/tofino.md,
// "Stages"): their op comes from the bridge header the recirculated packet carries and
// their bank from the header's round (the contribution's, or the one an async pass took),
// parsed fields that nothing before them computes, so they share the stages of the other
// passes (the branches of ingress's test of the pass, hysync.p4).
//
// This is the one control that differs between the chips:
//   Tofino 2  two lanes share one 64-bit register (SwitchML's pairing), and a stateful ALU
//             returns both halves: 32 pair registers, all 64 lanes in one lane pass.
//   Tofino 1  ingress PHV does not hold 64 lanes beside the decision, nor its stages 32
//             more stateful ALUs: 16 pair registers, each holding pair p of both halves
//             (cell 4s + 2b + half), one half per lane pass; and a stateful ALU returns one
//             32-bit word, so a pass that needs the sums (a close, a resend) reads the even
//             lanes in a second pass of the half.

#ifndef __HYSYNC_TNA_LANES__
#define __HYSYNC_TNA_LANES__

#if __TARGET_TOFINO__ == 2
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

    @hidden action write_action() {
        write_register_action.execute(slot ++ bank);
    }

    @hidden action add_action() {
        even = add_register_action.execute(slot ++ bank, odd);
    }

    @hidden action read_action() {
        even = read_register_action.execute(slot ++ bank, odd);
    }

    // One table per pair, its action chosen by the op: one logical table and one stateful
    // ALU, where a chain of ifs costs a table per action and a gateway per test.
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

#else

// Lanes 2p and 2p + 1 of both halves: cell 4s + 2b + half. One output word per pass: the
// odd lane's sum (or stored value) now, the even lane's in a second pass (bridge.even).
control LanePair(inout bit<32> even, inout bit<32> odd, in slot_index_t slot,
                 in bit<1> bank, in bit<1> half, in tna_lane_op_t op, in bit<1> even_step) {
    Register<lane_pair_t, half_bank_index_t>(HALF_BANK_CELLS) banks;

    // The first contribution of a round writes the bank: there is no clearing pass.
    RegisterAction<lane_pair_t, half_bank_index_t, bit<32>>(banks) write_register_action = {
        void apply(inout lane_pair_t value) {
            value.even = even;
            value.odd = odd;
        }
    };

    // Sums wrap mod 2^32, as the workers expect.
    RegisterAction<lane_pair_t, half_bank_index_t, bit<32>>(banks) add_register_action = {
        void apply(inout lane_pair_t value, out bit<32> sum_odd) {
            value.even = value.even + even;
            value.odd = value.odd + odd;
            sum_odd = value.odd;
        }
    };

    RegisterAction<lane_pair_t, half_bank_index_t, bit<32>>(banks) read_odd_register_action = {
        void apply(inout lane_pair_t value, out bit<32> stored_odd) {
            stored_odd = value.odd;
        }
    };

    RegisterAction<lane_pair_t, half_bank_index_t, bit<32>>(banks) read_even_register_action = {
        void apply(inout lane_pair_t value, out bit<32> stored_even) {
            stored_even = value.even;
        }
    };

    @hidden action write_action() {
        write_register_action.execute(slot ++ bank ++ half);
    }

    @hidden action add_action() {
        odd = add_register_action.execute(slot ++ bank ++ half);
    }

    @hidden action read_odd_action() {
        odd = read_odd_register_action.execute(slot ++ bank ++ half);
    }

    @hidden action read_even_action() {
        even = read_even_register_action.execute(slot ++ bank ++ half);
    }

    // One table per pair, its action chosen by the op and the step (one logical table and
    // one stateful ALU, where a chain of ifs costs a table per action and a gateway per
    // test).
    @hidden table op_table {
        key = {
            op        : exact;
            even_step : exact;
        }
        actions = {
            write_action;
            add_action;
            read_odd_action;
            read_even_action;
            @defaultonly NoAction;
        }
        const entries = {
            (tna_lane_op_t.WRITE, 0) : write_action();
            (tna_lane_op_t.ADD, 0) : add_action();
            (tna_lane_op_t.READ, 0) : read_odd_action();
            (tna_lane_op_t.WRITE, 1) : read_even_action();
            (tna_lane_op_t.ADD, 1) : read_even_action();
            (tna_lane_op_t.READ, 1) : read_even_action();
        }
        const default_action = NoAction();
        size = 8;
    }

    apply {
        op_table.apply();
    }
}

// The 16 pairs of the half in hdr.lanes.
control Lanes(inout headers_t hdr, in bridge_h bridge) {
#define PAIR_INSTANCE(p) LanePair() pair_##p;
    FOR_EACH_HALF_PAIR(PAIR_INSTANCE)
#undef PAIR_INSTANCE

#define PAIR_APPLY(p) \
    pair_##p.apply(hdr.lanes.even_##p, hdr.lanes.odd_##p, hdr.hysync.slot[12:0], hdr.hysync.round[0:0], bridge.half, bridge.lane_op, bridge.even);
    apply {
        FOR_EACH_HALF_PAIR(PAIR_APPLY)
    }
#undef PAIR_APPLY
}

#endif

#endif  // __HYSYNC_TNA_LANES__
