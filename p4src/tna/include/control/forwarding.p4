// Forwarding on Tofino (protocol.md §7): plain L2 for everything that is not HySync, the
// v1model table with TNA's traffic-manager metadata.

#ifndef __HYSYNC_TNA_FORWARDING__
#define __HYSYNC_TNA_FORWARDING__

control Forwarding(in headers_t hdr,
                   inout ingress_metadata_t meta,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    action set_egress_port(port_num_t port) {
        ig_tm_md.ucast_egress_port = port;
    }

    // Broadcast or unknown unicast: every port of the flood group; egress prunes the copy
    // on the ingress port (replication.p4).
    action flood() {
        ig_tm_md.mcast_grp_a = FLOOD_MCAST_GROUP;
        meta.hs.flooded = true;
    }

    @id(0x027ad4d3)
    table l2 {
        key = {
            hdr.ethernet.dst_addr : exact @name("dst_addr");
        }
        actions = {
            set_egress_port;
            flood;
        }
        const default_action = flood();
        size = L2_TABLE_SIZE;
    }

    apply {
        l2.apply();
    }
}

#endif  // __HYSYNC_TNA_FORWARDING__
