// Roles (protocol.md §11): a job's level on this switch, single (§4), leaf or spine, and a
// leaf's uplink to its spine. One entry per job, written before the job's entry in the same
// P4Runtime Write, so that the role reaches packets with the job; no entry: single.
//
// The table belongs to admission in the control-plane contract (§8), so its P4Info names
// are admission's. A program includes it where it runs a level other than single
// (HYSYNC_ROLES): the v1model program runs leaves and spines (HYSYNC_TWO_LEVELS), the TNA
// program on Tofino 2 spines only, and reads the level alone (docs/tofino.md, "Two
// levels"). The action's parameters are the same in both, so the P4Info is one source.

#ifndef __HYSYNC_ROLES__
#define __HYSYNC_ROLES__

control Roles(in headers_t hdr, inout metadata_t meta) {

    @name(".HySyncIngress.admission.set_role")
    action set_role(level_t level, bit<8> uplink_id, ipv4_addr_t spine_addr,
                    mac_addr_t spine_mac, ipv4_addr_t leaf_addr) {
        meta.role.level = level;
#ifdef HYSYNC_TWO_LEVELS
        meta.role.uplink_id = uplink_id;
        meta.role.spine_addr = spine_addr;
        meta.role.spine_mac = spine_mac;
        meta.role.leaf_addr = leaf_addr;
#endif
    }

    // The id v1model's compiler gives it, pinned so that bf-p4c gives it too (§8: one
    // P4Info contract on every target).
    @id(0x02bb468b)
    @name(".HySyncIngress.admission.roles")
    table roles {
        key = {
            hdr.hysync.job_id : exact @name("job_id");
        }
        actions = {
            set_role;
            @defaultonly NoAction;
        }
        const default_action = NoAction();   // single
        size = ROLES_TABLE_SIZE;
    }

    apply {
        meta.role.level = LEVEL_SINGLE;
        roles.apply();
    }
}

#endif  // __HYSYNC_ROLES__
