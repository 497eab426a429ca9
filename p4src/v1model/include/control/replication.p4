// Replication (protocol.md §6, §7), in egress: addresses each replica of a job's RESULT
// to its member, counts every RESULT that leaves the switch, and prunes the flooded
// copy of an L2 frame on the port it came in on.

#ifndef __HYSYNC_REPLICATION__
#define __HYSYNC_REPLICATION__

control Replication(inout headers_t hdr,
                    in metadata_t meta,
                    inout standard_metadata_t standard_metadata) {

    // Index job * 32 + w' where w' is the recipient: a replica's rid - 1, or the sender
    // of a resend.
    counter(MEMBER_COUNTER_CELLS, CounterType.packets_and_bytes) results;

    // The controller installs one entry per replica, rid = job * 32 + worker + 1.
    action rewrite_dst(mac_addr_t dst_mac, ipv4_addr_t dst_addr, l4_port_t dst_port) {
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.dst_addr = dst_addr;
        hdr.udp.dst_port = dst_port;
    }

    table rewrite {
        key = {
            standard_metadata.egress_rid : exact @name("egress_rid");
        }
        actions = {
            rewrite_dst;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = REWRITE_TABLE_SIZE;
    }

    apply {
        // A packet the switch made is its headers alone: what a verdict it relays carried
        // beyond them is not sent on.
        if (hdr.hysync.isValid()) {
            truncate((bit<32>) hdr.ipv4.total_len + 14);
        }
        if (meta.flooded) {
            // An L2 flood (the flood group's replicas have rid 0, §7; a replica with
            // another rid is flooded as it is, never rewritten): not back where it came in.
            if (standard_metadata.egress_port == standard_metadata.ingress_port) {
                mark_to_drop(standard_metadata);
            }
        } else if (standard_metadata.egress_rid != 0 && hdr.hysync.op == OP_RESYNC
                   && ((hdr.hysync.bitmap >> (bit<8>) ((standard_metadata.egress_rid - 1)
                                                       & (MAX_WORKERS - 1))) & 1) == 0) {
            // A leaf's relayed RESYNC (§11 leaf step 5) reaches the hosts it concerns only.
            mark_to_drop(standard_metadata);
        } else if (standard_metadata.egress_rid != 0) {
            // A replica of a job's RESULT. Without its rewrite it would reach the member
            // addressed to the switch: the controller installs both together, so a
            // replica without one is dropped.
            if (rewrite.apply().hit) {
                results.count((cell_index_t) (standard_metadata.egress_rid - 1));
            } else {
                mark_to_drop(standard_metadata);
            }
        } else if (standard_metadata.instance_type == BMV2_REPLICATION) {
            // A replica of a job's group without a member's rid: it has no rewrite either.
            mark_to_drop(standard_metadata);
        } else if (hdr.hysync.isValid() && hdr.hysync.op == OP_RESULT) {
            // A resend, unicast to its sender.
            results.count((cell_index_t) hdr.hysync.job_id * MAX_WORKERS
                          + (cell_index_t) hdr.hysync.worker_id);
        }
    }
}

#endif  // __HYSYNC_REPLICATION__
