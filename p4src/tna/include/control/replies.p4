// Replies on Tofino (protocol.md §4 "Replies", §5, §6): the packet the verdict calls for,
// as on v1model; on Tofino every verdict with a lane op first goes through the egress of
// the pipe's recirculation port, where the lanes act, and comes back for a pass that sends
// it on.
//
//   ABSORB           the lanes write or add in egress, and nothing goes out
//   CLOSE            RESULT, to the job's group: the sums in egress, then a CLOSE pass
//                    (Tofino 1: and the even lanes on the way to a SEND_GROUP pass); async:
//                    an ASYNC pass, and the bank written on the way to a SEND_GROUP pass
//   RESEND           RESULT with flag RESEND, back to the sender: the stored lanes in
//                    egress, then a RESEND pass (Tofino 1: and a SEND_BACK pass)
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
    // bitmap, count, mode, quorum and reason are already in the header (Aggregation writes
    // them; a resend's from ResultHeader).
    // A RESULT for the job's group: no flags.
    @hidden action write_result() {
        hdr.hysync.op = OP_RESULT;
        hdr.hysync.flags = 0;
    }

    // A reply to the sender: its own flag bits, the transmission number kept (§4 Replies).
    @hidden action write_reply(op_t op, bit<3> own) {
        hdr.hysync.op = op;
        hdr.hysync.flags[2:0] = own;
    }

    // RESYNC and ACK are the 24-byte header alone.
    @hidden action strip_lanes() {
        hdr.lanes_lo.setInvalid();
        hdr.lanes_hi.setInvalid();
        hdr.ipv4.total_len = REPLY_IPV4_LEN;
        hdr.udp.length = REPLY_UDP_LEN;
    }

    // Back out of the port the contribution came in on, addresses swapped (§4 Replies).
    @hidden action to_sender(PortId_t port) {
        mac_addr_t mac = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        ipv4_addr_t addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = addr;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = HYSYNC_UDP_PORT;
        hdr.udp.checksum = 0;
        ig_tm_md.ucast_egress_port = port;
    }

    // To every active member (§6): sources become the switch's address; egress rewrites
    // each replica's destination. A job without a group (0) sends no result.
    @hidden action to_group(mcast_group_t group) {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = HYSYNC_UDP_PORT;
        hdr.udp.checksum = 0;
        ig_tm_md.mcast_grp_a = group;
    }

    // Into the next pass through this pipe's recirculation port; egress is bypassed and
    // the bridge header tells the next pass what to do (with the lane op, if any).
    // The bridge keeps the contribution's port (parser.p4).
    @hidden action recirculate(pass_t pass) {
        meta.bridge.setValid();
        meta.bridge.pass = pass;
        ig_tm_md.bypass_egress = 1;
        ig_tm_md.ucast_egress_port = meta.tf.recirc_port;
    }

    // Into the first lane pass of a lane op (the op is in the bridge already): on Tofino 2
    // it is the last; Tofino 1 takes the steps of LaneSteps.
    @hidden action to_lanes(pass_t pass) {
        meta.bridge.setValid();
        meta.bridge.pass = pass;
        meta.bridge.half = 0;
        meta.bridge.even = 0;
#if __TARGET_TOFINO__ == 2
        meta.bridge.last = 1;
#else
        meta.bridge.last = 0;
#endif
        ig_tm_md.bypass_egress = 1;
        ig_tm_md.ucast_egress_port = meta.tf.recirc_port;
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

    @hidden table lane_steps {
        key = {
            meta.bridge.pass : exact;
            meta.bridge.half : exact;
            meta.bridge.even : exact;
        }
        actions = {
            next_step;
        }
        const entries = {
            (pass_t.ABSORB, 0, 0) : next_step(1, 0, 1);
            (pass_t.SEND_GROUP, 0, 0) : next_step(1, 0, 1);
            (pass_t.CLOSE, 0, 0) : next_step(0, 1, 0);
            (pass_t.CLOSE, 0, 1) : next_step(1, 0, 0);
            (pass_t.CLOSE, 1, 0) : next_step(1, 1, 1);
            (pass_t.RESEND, 0, 0) : next_step(0, 1, 0);
            (pass_t.RESEND, 0, 1) : next_step(1, 0, 0);
            (pass_t.RESEND, 1, 0) : next_step(1, 1, 1);
        }
        size = 8;
    }
#endif

    // Another install's slot: the reset pass takes the job's epoch in the contribution's
    // bitmap, a field the switch ignores in a contribution.
    @hidden action carry_epoch() {
        hdr.hysync.bitmap = meta.hs.epoch;
    }

    @hidden action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    apply {
        // Replies go to the bridge's port: a later pass comes from the recirculation port.
        if (meta.bridge.pass == pass_t.RESET) {
            // The slot is the new install's now: the contribution again, as a first pass.
            recirculate(pass_t.NONE);
        } else if (meta.bridge.pass == pass_t.ASYNC) {
            // Its bank is written in its lane pass.
            to_lanes(pass_t.SEND_GROUP);
        } else if (meta.bridge.pass != pass_t.NONE && meta.bridge.pass != pass_t.DECIDE
                   && meta.bridge.last == 0) {
#if __TARGET_TOFINO__ != 2
            // Tofino 1: a lane pass before the last.
            lane_steps.apply();
#endif
        } else if (meta.bridge.pass == pass_t.ABSORB) {
            drop();   // the lanes have absorbed it
        } else if (meta.bridge.pass == pass_t.CLOSE || meta.bridge.pass == pass_t.SEND_GROUP) {
            // The RESULT is complete; send it on as the deciding pass would have.
            to_group(meta.bridge.mcast_grp);
            if (meta.bridge.mcast_grp == 0) {
                drop();
            }
        } else if (meta.bridge.pass == pass_t.RESEND) {
            to_sender(meta.bridge.ingress_port);
        } else if (meta.tf.stale_epoch) {
            carry_epoch();
            recirculate(pass_t.RESET);
#if __TARGET_TOFINO__ != 2
        } else if (meta.tf.counting) {
            // Admitted and latched: counted in the DECIDE pass.
            recirculate(pass_t.DECIDE);
#endif
        } else if (meta.hs.verdict == verdict_t.CLOSE) {
            write_result();
            if (meta.bridge.async_path == 1) {
                recirculate(pass_t.ASYNC);
            } else {
                to_lanes(pass_t.CLOSE);
            }
        } else if (meta.hs.verdict == verdict_t.ABSORB) {
            to_lanes(pass_t.ABSORB);
        } else if (meta.hs.verdict == verdict_t.RESEND) {
            write_reply(OP_RESULT, FLAG_RESEND[2:0]);
            to_lanes(pass_t.RESEND);
        } else if (meta.hs.verdict == verdict_t.CHUNK_MISMATCH
                   || meta.hs.verdict == verdict_t.STALE
                   || meta.hs.verdict == verdict_t.NOT_JOINED) {
            write_reply(OP_RESYNC, 0);
            strip_lanes();
            to_sender(meta.bridge.ingress_port);
        } else if (meta.hs.verdict == verdict_t.ACK) {
            write_reply(OP_ACK, 0);
            strip_lanes();
            to_sender(meta.bridge.ingress_port);
        } else {
            drop();
        }
    }
}

#endif  // __HYSYNC_TNA_REPLIES__
