// Admission (protocol.md §4 steps 5-7): only members of a configured job, on the job's
// own slots, reach the aggregation state. Tables and metadata only, no extern: shared by
// v1model and TNA as it stands.

#ifndef __HYSYNC_ADMISSION__
#define __HYSYNC_ADMISSION__

control Admission(in headers_t hdr, inout metadata_t meta) {

    // Members: a hit is the whole verdict, the action carries nothing.
    action admit() { }

    @id(0x0296df60)
    table members {
        key = {
            hdr.hysync.job_id    : exact @name("job_id");
            hdr.hysync.worker_id : exact @name("worker_id");
            hdr.ipv4.src_addr    : exact @name("src_addr");
            hdr.udp.src_port     : exact @name("src_port");
        }
        actions = {
            admit;
            @defaultonly NoAction;
        }
        const default_action = NoAction();   // not a member
        size = MEMBERS_TABLE_SIZE;
    }

    // Jobs: slot range, active member count, multicast group and install epoch of the
    // job. The count's P4Info name is "members" (§8); in P4 it would shadow the table
    // above.
    // base - slot is computed here, from the entry's base: on Tofino a separate action
    // would take a stage of its own (and Tofino subtracts action data only from it, never
    // it from a field).
    action set_job(slot_t slot_base, slot_t slot_count, @name("members") count_t n,
                   mcast_group_t mcast_grp, epoch_t epoch) {
        meta.slot_below = slot_base - hdr.hysync.slot;
        meta.slot_count = slot_count;
        meta.members = n;
        meta.mcast_grp = mcast_grp;
        meta.epoch = epoch;
    }

    @id(0x02f5735b)
    table jobs {
        key = {
            hdr.hysync.job_id : exact @name("job_id");
        }
        actions = {
            set_job;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = JOBS_TABLE_SIZE;
    }

    @hidden action reject(drop_reason_t reason) {
        meta.admitted = false;
        meta.count_drop = true;
        meta.drop_reason = reason;
    }

    // base + count - slot. The slot is in the job's range iff base - slot <= 0 and
    // base + count - slot > 0, as signed 16-bit numbers (exact: slot, base and
    // base + count are below NUM_SLOTS there). Written this way because a Tofino gateway
    // compares a field with a constant, or two fields for equality, nothing else; on
    // v1model it is the same test.
    @hidden action slot_room() {
        meta.slot_room = meta.slot_below + meta.slot_count;
    }

    apply {
        meta.admitted = true;
        bool member = true;
#ifdef HYSYNC_TWO_LEVELS
        // A spine's verdict at a leaf (§11) is admitted by its source, the uplink's spine
        // address, not by the members table.
        if (!meta.spine_verdict) {
            member = members.apply().hit;
        }
#else
        member = members.apply().hit;
#endif
        if (!member) {
            reject(DROP_NOT_MEMBER);                           // 5. not a member
        } else if (!jobs.apply().hit) {
            reject(DROP_NO_JOB);                               // 6. no job entry
        } else {
            slot_room();
            if (hdr.hysync.slot >= NUM_SLOTS
                || (meta.slot_below != 0 && meta.slot_below[15:15] == 0)   // slot < base
                || meta.slot_room == 0 || meta.slot_room[15:15] == 1) {    // slot >= base + count
                reject(DROP_SLOT_RANGE);                       // 7. not the job's slot
            }
        }
    }
}

#endif  // __HYSYNC_ADMISSION__
