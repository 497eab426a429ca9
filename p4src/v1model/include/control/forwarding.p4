// Forwarding (protocol.md §7): plain L2 for everything that is not HySync, so hosts
// behind the switch can ARP, ping and run TCP (the gloo baseline).

#ifndef __HYSYNC_FORWARDING__
#define __HYSYNC_FORWARDING__

control Forwarding(in headers_t hdr,
                   inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {

    action set_egress_port(port_num_t port) {
        standard_metadata.egress_spec = port;
    }

    // Broadcast or unknown unicast: every port of the flood group; egress prunes the
    // copy on the ingress port (replication.p4).
    action flood() {
        standard_metadata.mcast_grp = FLOOD_MCAST_GROUP;
        meta.flooded = true;
    }

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
        // A leaf's uplink goes out of the spine MAC's port only: the controller installs
        // that L2 entry with the role, and an uplink is never flooded.
        if (!l2.apply().hit && meta.up.send) {
            standard_metadata.mcast_grp = 0;
            meta.flooded = false;
            mark_to_drop(standard_metadata);
        }
    }
}

#endif  // __HYSYNC_FORWARDING__
