// Replies on Tofino (protocol.md §4 "Replies", §5, §6): the packet the verdict calls for,
// as on v1model; on Tofino every verdict with a lane op first takes its lane passes through
// the pipe's recirculation port (the lanes act there), and the last one sends it on.
//
//   ABSORB           lane passes (write / add), then nothing goes out
//   CLOSE            RESULT, to the job's group, after its CLOSE lane passes (the last
//                    advances the round); async: an ASYNC pass, then its SEND_GROUP lane
//                    passes (the bank's write)
//   RESEND           RESULT with flag RESEND, back to the sender, after its RESEND lane
//                    passes
//   CHUNK_MISMATCH,  RESYNC, back to the sender, header only
//   STALE, NOT_JOINED
//   ACK              ACK, back to the sender, header only
//   a stale epoch    a reset pass, then a retry pass (aggregation.p4)
//   Tofino 1         an admitted first pass of the slot's install: the DECIDE pass
//   anything else    dropped: nothing goes out
//
// Every reply to the sender keeps the contribution's transmission number (flags bits 7..3).

#ifndef __HYSYNC_TNA_REPLIES__
#define __HYSYNC_TNA_REPLIES__

control Replies(inout headers_t hdr,
                inout ingress_metadata_t meta,
                in ingress_intrinsic_metadata_t ig_intr_md,
                inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    // §5: version, job_id, worker_id and slot stay those of the contribution. Round, chunk,
    // bitmap, count, mode, quorum and reason are already in the header (Counting writes
    // them; a resend's come from ResultHeader). Each outcome is one action of the table
    // below: on Tofino 1 a chain of ifs and small tables took two stages (16 logical
    // tables a stage).

    // Back out of the port the contribution came in on, addresses swapped (§4 Replies).
    @hidden action swap_addresses() {
        mac_addr_t mac = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        ipv4_addr_t addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = addr;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = HYSYNC_UDP_PORT;
        hdr.udp.checksum = 0;
        ig_tm_md.ucast_egress_port = meta.bridge.ingress_port;
    }

    // A RESYNC or an ACK: the 24-byte header alone, with its own flag bits and the
    // transmission number kept (§4 Replies), back to the sender.
    @hidden action reply_header(op_t op) {
        hdr.hysync.op = op;
        hdr.hysync.flags[2:0] = 0;
        hdr.lanes_lo.setInvalid();
        hdr.lanes_hi.setInvalid();
        hdr.ipv4.total_len = REPLY_IPV4_LEN;
        hdr.udp.length = REPLY_UDP_LEN;
        swap_addresses();
    }

    // A resend's RESULT, complete after its last lane pass, back to the sender.
    @hidden action to_sender() {
        swap_addresses();
    }

    // To every active member (§6): sources become the switch's address; egress rewrites
    // each replica's destination.
    @hidden action to_group() {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = HYSYNC_UDP_PORT;
        hdr.udp.checksum = 0;
        ig_tm_md.mcast_grp_a = meta.bridge.mcast_grp;
    }

    // Into the next pass through this pipe's recirculation port; egress is bypassed and
    // the bridge header tells the next pass what to do (with the lane op, if any). The
    // bridge keeps the contribution's port (parser.p4).
    @hidden action recirculate(pass_t pass) {
        meta.bridge.setValid();
        meta.bridge.pass = pass;
        ig_tm_md.bypass_egress = 1;
        ig_tm_md.ucast_egress_port = meta.tf.recirc_port;
    }

    // Another install's slot: the reset pass takes the job's epoch in the contribution's
    // bitmap, a field the switch ignores in a contribution.
    @hidden action reset_slot() {
        hdr.hysync.bitmap = meta.hs.epoch;
        recirculate(pass_t.RESET);
    }

    // Into the first lane pass of a lane op (the op is in the bridge already): on Tofino 2
    // it is the last; Tofino 1 takes the next steps below.
    @hidden action to_lanes(pass_t pass) {
        meta.bridge.half = 0;
        meta.bridge.even = 0;
#if __TARGET_TOFINO__ == 2
        meta.bridge.last = 1;
#else
        meta.bridge.last = 0;
#endif
        recirculate(pass);
    }

    // A RESULT for the job's group: no flags.
    @hidden action result_to_lanes(pass_t pass) {
        hdr.hysync.op = OP_RESULT;
        hdr.hysync.flags = 0;
        to_lanes(pass);
    }

    // A resend's RESULT: flag RESEND, the transmission number kept (§4 Replies).
    @hidden action resend_to_lanes() {
        hdr.hysync.op = OP_RESULT;
        hdr.hysync.flags[2:0] = FLAG_RESEND[2:0];
        to_lanes(pass_t.RESEND);
    }

#if __TARGET_TOFINO__ != 2
    // Tofino 1: the lane pass after this one, the same pass and lane op on the next half, or
    // on the even lanes of this half where the sums go out (a close, a resend).
    @hidden action next_step(bit<1> half, bit<1> even, bit<1> last) {
        meta.bridge.half = half;
        meta.bridge.even = even;
        meta.bridge.last = last;
        ig_tm_md.bypass_egress = 1;
        ig_tm_md.ucast_egress_port = meta.tf.recirc_port;
    }
#endif

    @hidden action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    // First match wins. A later pass's row is chosen by the pass (and on Tofino 1 its lane
    // step); the pass that decides (first, DECIDE) by the stale epoch, Tofino 1's DECIDE,
    // and the verdict.
    @hidden table reply {
        key = {
            meta.bridge.pass       : ternary;
            meta.bridge.half       : ternary;
            meta.bridge.even       : ternary;
            meta.bridge.last       : ternary;
            meta.bridge.mcast_grp  : ternary;
            meta.tf.stale_epoch    : ternary;
            meta.tf.counting       : ternary;
            meta.bridge.async_path : ternary;
            meta.hs.verdict        : ternary;
        }
        actions = {
            to_sender;
            to_group;
            reply_header;
            recirculate;
            reset_slot;
            to_lanes;
            result_to_lanes;
            resend_to_lanes;
#if __TARGET_TOFINO__ != 2
            next_step;
#endif
            drop;
        }
        const entries = {
            // The slot is the new install's now: the contribution again, as a first pass.
            (pass_t.RESET, _, _, _, _, _, _, _, _) : recirculate(pass_t.NONE);
            // An async round's bank is written in its lane pass.
            (pass_t.ASYNC, _, _, _, _, _, _, _, _) : to_lanes(pass_t.SEND_GROUP);
#if __TARGET_TOFINO__ != 2
            // Tofino 1: the lane passes before the last (Stages, docs/tofino.md).
            (pass_t.ABSORB, 0, 0, 0, _, _, _, _, _) : next_step(1, 0, 1);
            (pass_t.SEND_GROUP, 0, 0, 0, _, _, _, _, _) : next_step(1, 0, 1);
            (pass_t.CLOSE, 0, 0, 0, _, _, _, _, _) : next_step(0, 1, 0);
            (pass_t.CLOSE, 0, 1, 0, _, _, _, _, _) : next_step(1, 0, 0);
            (pass_t.CLOSE, 1, 0, 0, _, _, _, _, _) : next_step(1, 1, 1);
            (pass_t.RESEND, 0, 0, 0, _, _, _, _, _) : next_step(0, 1, 0);
            (pass_t.RESEND, 0, 1, 0, _, _, _, _, _) : next_step(1, 0, 0);
            (pass_t.RESEND, 1, 0, 0, _, _, _, _, _) : next_step(1, 1, 1);
#endif
            // The last lane pass: the lanes have absorbed it, or the RESULT is complete.
            // A job without a group (0) sends no result.
            (pass_t.ABSORB, _, _, _, _, _, _, _, _) : drop();
            (pass_t.CLOSE, _, _, _, 0, _, _, _, _) : drop();
            (pass_t.CLOSE, _, _, _, _, _, _, _, _) : to_group();
            (pass_t.SEND_GROUP, _, _, _, 0, _, _, _, _) : drop();
            (pass_t.SEND_GROUP, _, _, _, _, _, _, _, _) : to_group();
            (pass_t.RESEND, _, _, _, _, _, _, _, _) : to_sender();
            // The pass that decides.
            (_, _, _, _, _, true, _, _, _) : reset_slot();
#if __TARGET_TOFINO__ != 2
            (_, _, _, _, _, _, true, _, _) : recirculate(pass_t.DECIDE);
#endif
            (_, _, _, _, _, _, _, 1, verdict_t.CLOSE) : result_to_lanes(pass_t.ASYNC);
            (_, _, _, _, _, _, _, _, verdict_t.CLOSE) : result_to_lanes(pass_t.CLOSE);
            (_, _, _, _, _, _, _, _, verdict_t.ABSORB) : to_lanes(pass_t.ABSORB);
            (_, _, _, _, _, _, _, _, verdict_t.RESEND) : resend_to_lanes();
            (_, _, _, _, _, _, _, _, verdict_t.CHUNK_MISMATCH) : reply_header(OP_RESYNC);
            (_, _, _, _, _, _, _, _, verdict_t.STALE) : reply_header(OP_RESYNC);
            (_, _, _, _, _, _, _, _, verdict_t.NOT_JOINED) : reply_header(OP_RESYNC);
            (_, _, _, _, _, _, _, _, verdict_t.ACK) : reply_header(OP_ACK);
        }
        const default_action = drop();
        size = 32;
    }

    apply {
        reply.apply();
    }
}

#endif  // __HYSYNC_TNA_REPLIES__
