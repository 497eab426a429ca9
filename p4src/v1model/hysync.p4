// HySync for BMv2 simple_switch (v1model): in-network gradient aggregation whose
// synchronization mode (sync, partial(q), async) the controller hot-swaps per slot range.
//
// docs/protocol.md is the specification; softswitch/ is its reference model and the
// conformance suite holds the two to the same bytes. Every control-plane input is a
// table entry, a multicast group or a counter (BMv2's P4Runtime server cannot touch
// registers); registers are data-plane state only.

#include <core.p4>
#include <v1model.p4>

// This program runs a job at two levels, leaf and spine (protocol.md §11), set per job by
// the roles table.
#define HYSYNC_TWO_LEVELS
#define HYSYNC_ROLES
// standard_metadata.instance_type of a multicast replica and of a resubmitted packet
// (BMv2 simple_switch).
#define BMV2_REPLICATION 5
#define BMV2_RESUBMIT 6

#include "../shared/defines.p4"
#include "../shared/sizes.p4"
#include "../shared/headers.p4"

#include "include/parser.p4"
#include "../shared/control/roles.p4"
#include "../shared/control/admission.p4"
#include "../shared/control/sync_mode.p4"
#include "include/control/aggregation.p4"
#include "include/control/replies.p4"
#include "include/control/forwarding.p4"
#include "include/control/stats.p4"
#include "include/control/replication.p4"

control HySyncIngress(inout headers_t hdr,
                      inout metadata_t meta,
                      inout standard_metadata_t standard_metadata) {

    Roles() roles;
    Admission() admission;
    SyncMode() sync_mode;
    Aggregation() aggregation;
    Replies() replies;
    Forwarding() forwarding;
    Stats() stats;

    @hidden action drop(drop_reason_t reason) {
        meta.count_drop = true;
        meta.drop_reason = reason;
        mark_to_drop(standard_metadata);
    }

    apply {
        // §11. The job's level here, for every packet that names a job: at a leaf, a
        // spine's RESULT or RESYNC is a verdict on the leaf's sum (resubmitted to mark the
        // hosts of a refused one, one per pass).
        meta.up.send = false;
        meta.spine_verdict = false;
        meta.resubmitted = standard_metadata.instance_type == BMV2_RESUBMIT;
        if (hdr.hysync.isValid()) {
            roles.apply(hdr, meta);
            meta.spine_verdict = meta.role.level == LEVEL_LEAF
                           && (hdr.hysync.op == OP_RESULT || hdr.hysync.op == OP_RESYNC);
        }
        bool admit = false;
        if (meta.spine_verdict) {
            // §11 leaf step 4: from the uplink's spine address only, then §4's checks
            // that apply to a RESULT or RESYNC.
            if (hdr.ipv4.src_addr != meta.role.spine_addr) {
                drop(DROP_NOT_MEMBER);
            } else if (standard_metadata.parser_error != error.NoError) {
                drop(DROP_MALFORMED);
            } else if (hdr.hysync.version != HYSYNC_VERSION) {
                drop(DROP_BAD_VERSION);
            } else {
                admit = true;
            }
        } else if (standard_metadata.parser_error != error.NoError) {
            // 1. Truncated: changes no state, counted.
            drop(DROP_MALFORMED);
        } else if (!hdr.hysync.isValid()) {
            // §7. Not HySync: L2 (below).
        } else if (hdr.hysync.version != HYSYNC_VERSION) {
            drop(DROP_BAD_VERSION);                                 // 2.
        } else if (hdr.hysync.op != OP_CONTRIB) {
            drop(DROP_BAD_OP);                                      // 3.
        } else if (hdr.ipv4.total_len != CONTRIB_IPV4_LEN
                   || hdr.udp.length != CONTRIB_UDP_LEN
                   || standard_metadata.packet_length != CONTRIB_FRAME_LEN) {
            drop(DROP_BAD_LENGTH);                                  // 4.
        } else {
            admit = true;
        }
        if (admit) {
            // 5-7. A member of a configured job (a verdict: its job), on the job's slots.
            admission.apply(hdr, meta);
            if (!meta.admitted) {
                mark_to_drop(standard_metadata);
            } else {
                // 8. The mode the controller wants for this slot now.
                if (!meta.spine_verdict) {
                    sync_mode.apply(hdr, meta);
                }
                // 8-10. Latch it if no round is under way; open, join, close or miss
                // the slot's round; accumulate or read the lanes. (§11: a verdict.)
                aggregation.apply(hdr, meta);
                // Make the RESULT / RESYNC / ACK the outcome calls for, an uplink, a
                // relayed verdict, or nothing.
                replies.apply(hdr, meta, standard_metadata);
                if (meta.spine_verdict && (meta.mark_hosts != 0 || meta.mark_hosts2 != 0)) {
                    resubmit_preserving_field_list(1);
                }
            }
        }

        // §7. L2 for what is not HySync's, and for a leaf's uplink to its spine (§11).
        if (standard_metadata.parser_error == error.NoError
            && (!hdr.hysync.isValid() || meta.up.send)) {
            forwarding.apply(hdr, meta, standard_metadata);
        }

        // §8. Count what the controls above decided to count.
        stats.apply(hdr, meta);

        // §11. An uplink is the leaf's own contribution at the spine: its member id there.
        if (meta.up.send) {
            hdr.hysync.worker_id = meta.role.uplink_id;
        }
    }
}

control HySyncEgress(inout headers_t hdr,
                     inout metadata_t meta,
                     inout standard_metadata_t standard_metadata) {

    Replication() replication;

    apply {
        // §6-7. Address each replica of a RESULT, count RESULTs, prune L2 floods.
        replication.apply(hdr, meta, standard_metadata);
    }
}

V1Switch(HySyncParser(),
         HySyncVerifyChecksum(),
         HySyncIngress(),
         HySyncEgress(),
         HySyncComputeChecksum(),
         HySyncDeparser()) main;
