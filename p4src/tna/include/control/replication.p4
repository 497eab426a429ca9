// Replication on Tofino (protocol.md §6, §7), in egress: addresses each replica of a job's
// RESULT to its member, counts every RESULT that leaves the switch, and prunes the flooded
// copy of an L2 frame on the port it came in on. The v1model table and counter with TNA's
// egress metadata; the ingress port comes in the bridge header.

#ifndef __HYSYNC_TNA_REPLICATION__
#define __HYSYNC_TNA_REPLICATION__

control Replication(inout headers_t hdr,
                    inout egress_metadata_t meta,
                    in egress_intrinsic_metadata_t eg_intr_md,
                    inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {

    // Index job * 32 + w' where w' is the recipient: a replica's rid - 1, or the sender
    // of a resend.
    Counter<bit<64>, member_cell_t>(MEMBER_COUNTER_CELLS,
                                    CounterType_t.PACKETS_AND_BYTES) results;

    // The controller installs one entry per replica, rid = job * 32 + worker + 1.
    action rewrite_dst(mac_addr_t dst_mac, ipv4_addr_t dst_addr, l4_port_t dst_port) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.dst_addr = dst_addr;
        hdr.udp.dst_port = dst_port;
    }

    @id(0x024eebbc)
    table rewrite {
        key = {
            eg_intr_md.egress_rid : exact @name("egress_rid");
        }
        actions = {
            rewrite_dst;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = REWRITE_TABLE_SIZE;
    }

    // A counter's index must be a field, not an expression: a table computes it first
    // (the compiler folds a plain assignment back into the index).
    @hidden action set_recipient() {
        meta.recipient = eg_intr_md.egress_rid - 1;
    }

    @hidden table recipient {
        actions = {
            set_recipient;
        }
        const default_action = set_recipient();
        size = 1;
    }

    apply {
        if (meta.bridge.flooded == 1) {
            // An L2 flood, never rewritten (as v1model): not back where it came in.
            if (eg_intr_md.egress_port == meta.bridge.ingress_port) {
                eg_dprsr_md.drop_ctl = 1;
            }
        } else if (eg_intr_md.egress_rid != 0) {
            // A replica of a job's RESULT; without its rewrite entry it is dropped.
            if (rewrite.apply().hit) {
                recipient.apply();
                results.count(meta.recipient[12:0]);
            } else {
                eg_dprsr_md.drop_ctl = 1;
            }
        } else if (hdr.hysync.isValid() && hdr.hysync.op == OP_RESULT) {
            // A resend, unicast to its sender.
            results.count(hdr.hysync.job_id[7:0] ++ hdr.hysync.worker_id[4:0]);
        }
    }
}

#endif  // __HYSYNC_TNA_REPLICATION__
