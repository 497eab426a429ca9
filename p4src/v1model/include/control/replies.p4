// Replies (protocol.md §4 "Replies", §5, §6): turns a contribution into the packet the
// switch sends for the aggregation's outcome (meta.emit), or into nothing.
//
//   CLOSE, CLOSE_AS_IS  RESULT, multicast to the job's group (egress sets destinations)
//   RESEND              RESULT with flag RESEND, back to the sender, lanes of the stored round
//   RESYNC              RESYNC, back to the sender, header only
//   ACK                 ACK, back to the sender, header only
//   anything else       absorbed or dropped: nothing goes out

#ifndef __HYSYNC_REPLIES__
#define __HYSYNC_REPLIES__

control Replies(inout headers_t hdr,
                in metadata_t meta,
                inout standard_metadata_t standard_metadata) {

    // §5: version, job_id, worker_id and slot stay those of the contribution. A reply to the
    // sender keeps the contribution's transmission number (echo = TX_MASK); a multicast
    // RESULT answers nobody's transmission (echo = 0).
    @hidden action write_hysync(op_t op, flags_t flags, flags_t echo) {
        hdr.hysync.op = op;
        hdr.hysync.flags = flags | (hdr.hysync.flags & echo);
        hdr.hysync.mode = meta.out_mode;
        hdr.hysync.count = meta.out_count;
        hdr.hysync.reason = meta.out_reason;
        hdr.hysync.quorum = meta.out_quorum;
        hdr.hysync.round = meta.out_round;
        hdr.hysync.chunk = meta.out_chunk;
        hdr.hysync.bitmap = meta.out_bitmap;
    }

    // RESYNC and ACK are the 24-byte header alone.
    @hidden action strip_lanes() {
        hdr.lanes.pop_front(LANES);
        hdr.ipv4.total_len = REPLY_IPV4_LEN;
        hdr.udp.length = REPLY_UDP_LEN;
    }

    // Back out of the ingress port: addresses swapped, from the HySync port to the
    // sender's port. IPv4 version/TOS/id/flags/TTL stay; the checksum is recomputed in
    // HySyncComputeChecksum; UDP carries no checksum (Tofino cannot sum the payload at
    // line rate, and BMv2 must give the same bytes).
    @hidden action to_sender() {
        mac_addr_t mac = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = hdr.ethernet.src_addr;
        hdr.ethernet.src_addr = mac;
        ipv4_addr_t addr = hdr.ipv4.dst_addr;
        hdr.ipv4.dst_addr = hdr.ipv4.src_addr;
        hdr.ipv4.src_addr = addr;
        hdr.udp.dst_port = hdr.udp.src_port;
        hdr.udp.src_port = HYSYNC_UDP_PORT;
        hdr.udp.checksum = 0;
        standard_metadata.egress_spec = standard_metadata.ingress_port;
    }

    // To every active member (§6): the sources become the switch's address, that is the
    // contribution's destination; egress rewrites each replica's destination. Marked to
    // drop first, so a job without a group (mcast_grp 0) drops instead of going to port 0:
    // a multicast group takes precedence over the drop in v1model.
    @hidden action to_group() {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ipv4.src_addr = hdr.ipv4.dst_addr;
        hdr.udp.src_port = HYSYNC_UDP_PORT;
        hdr.udp.checksum = 0;
        mark_to_drop(standard_metadata);
        standard_metadata.mcast_grp = meta.mcast_grp;
    }

    // A leaf's uplink (§11 leaf step 1): its CONTRIB from the leaf's address to the spine's,
    // HySync port to HySync port; Forwarding sends it out of the spine MAC's port. (Its
    // worker id becomes the leaf's uplink_id once Stats has counted the host's packet.)
    @hidden action to_spine() {
        hdr.ethernet.src_addr = hdr.ethernet.dst_addr;
        hdr.ethernet.dst_addr = meta.role.spine_mac;
        hdr.ipv4.src_addr = meta.role.leaf_addr;
        hdr.ipv4.dst_addr = meta.role.spine_addr;
        hdr.udp.src_port = HYSYNC_UDP_PORT;
        hdr.udp.dst_port = HYSYNC_UDP_PORT;
        hdr.udp.checksum = 0;
    }

    // A spine's verdict relayed to the leaf's hosts (§11 leaf steps 4-5), by the pass that
    // marked the last of the hosts it refuses: the spine's header with the leaf's bitmap
    // (a RESYNC: flag RELAYED, no count, the chunk of the flight it settles).
    @hidden action relay() {
        hdr.hysync.bitmap = meta.relay_hosts;
        if (meta.relay == RELAY_RESULT) {
            hdr.hysync.flags = 0;
            hdr.ipv4.total_len = CONTRIB_IPV4_LEN;
            hdr.udp.length = CONTRIB_UDP_LEN;
        } else {
            hdr.hysync.flags = FLAG_RETRANSMIT;   // RELAYED: the same bit on a RESYNC
            hdr.hysync.count = 0;
            hdr.hysync.chunk = meta.relay_chunk;
            hdr.ipv4.total_len = REPLY_IPV4_LEN;
            hdr.udp.length = REPLY_UDP_LEN;
        }
    }

    apply {
        if (meta.spine_verdict) {
            if (meta.relay != RELAY_NONE && meta.mark_hosts == 0 && meta.mark_hosts2 == 0) {
                relay();
                to_group();
            } else {
                mark_to_drop(standard_metadata);
            }
        } else if (meta.up.send) {
            flags_t tx = ((flags_t) meta.up.tx) << 3;
            write_hysync(OP_CONTRIB, meta.up.retransmit ? tx | FLAG_RETRANSMIT : tx, 0);
            to_spine();
        } else if (meta.emit == emit_t.CLOSE || meta.emit == emit_t.CLOSE_AS_IS) {
            write_hysync(OP_RESULT, 0, 0);
            to_group();
        } else if (meta.emit == emit_t.RESEND) {
            write_hysync(OP_RESULT, FLAG_RESEND, TX_MASK);
            to_sender();
        } else if (meta.emit == emit_t.RESYNC) {
            write_hysync(OP_RESYNC, 0, TX_MASK);
            strip_lanes();
            to_sender();
        } else if (meta.emit == emit_t.ACK) {
            write_hysync(OP_ACK, 0, TX_MASK);
            strip_lanes();
            to_sender();
        } else {
            mark_to_drop(standard_metadata);
        }
    }
}

#endif  // __HYSYNC_REPLIES__
