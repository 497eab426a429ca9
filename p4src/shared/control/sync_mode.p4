// SyncMode (protocol.md §4 step 8): the mode and quorum the controller wants for a
// slot range of a job. Aggregation latches them into the slot's registers only when a
// round starts, so a hot swap (one entry modify) never changes a round under way.
// A table and metadata only: shared by v1model and TNA.

#ifndef __HYSYNC_SYNC_MODE__
#define __HYSYNC_SYNC_MODE__

control SyncMode(in headers_t hdr, inout metadata_t meta) {

    action set_mode(sync_mode_t mode, quorum_t quorum) {
        meta.desired_mode = (mode_t) mode;
        meta.desired_quorum = quorum;
    }

    // Ranges of one job may overlap: the highest priority wins.
    @id(0x02ed08dc)
    table modes {
        key = {
            hdr.hysync.job_id : exact @name("job_id");
            hdr.hysync.slot   : range @name("slot");
        }
        actions = {
            set_mode;
            @defaultonly NoAction;
        }
        const default_action = NoAction();   // sync, quorum 0 (below)
        size = MODES_TABLE_SIZE;
    }

    apply {
        // The lookup has no side effect, so it is made for every contribution and its
        // result used only when the slot latches (count == 0), as the spec says.
        meta.desired_mode = MODE_SYNC;
        meta.desired_quorum = 0;            // 0 = every active member
        modes.apply();
    }
}

#endif  // __HYSYNC_SYNC_MODE__
