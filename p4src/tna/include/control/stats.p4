// Stats on Tofino (protocol.md §8): the v1model counters, as TNA Counter externs with the
// same names, sizes and indexes. Counted once, at the end of a packet's first pass.

#ifndef __HYSYNC_TNA_STATS__
#define __HYSYNC_TNA_STATS__

control Stats(in headers_t hdr, in metadata_t meta) {

    // Per (job, worker), index job * 32 + w.
    Counter<bit<64>, member_cell_t>(MEMBER_COUNTER_CELLS,
                                    CounterType_t.PACKETS_AND_BYTES) contributions;
    Counter<bit<64>, member_cell_t>(MEMBER_COUNTER_CELLS,
                                    CounterType_t.PACKETS_AND_BYTES) late;
    Counter<bit<64>, member_cell_t>(MEMBER_COUNTER_CELLS,
                                    CounterType_t.PACKETS_AND_BYTES) duplicates;
    Counter<bit<64>, member_cell_t>(MEMBER_COUNTER_CELLS,
                                    CounterType_t.PACKETS_AND_BYTES) stale;
    // Contributions that closed a round: in sync, the last arrival, i.e. the straggler.
    Counter<bit<64>, member_cell_t>(MEMBER_COUNTER_CELLS,
                                    CounterType_t.PACKETS_AND_BYTES) closes;
    // Per (job, reason), index job * 16 + reason.
    Counter<bit<64>, drop_counter_index_t>(DROP_COUNTER_CELLS,
                                          CounterType_t.PACKETS_AND_BYTES) drops;
    // Per reason, switch-wide: every drop, whatever job id its bytes carry.
    Counter<bit<64>, bit<4>>(NUM_DROP_REASONS, CounterType_t.PACKETS_AND_BYTES) switch_drops;

    apply {
        if (meta.count_drop) {
            // Job 0 collects drops that cannot be attributed to a job.
            bit<8> job = 0;
            if (hdr.hysync.isValid() && hdr.hysync.job_id < MAX_JOBS) {
                job = hdr.hysync.job_id[7:0];
            }
            drops.count(job ++ meta.drop_reason[3:0]);
            switch_drops.count(meta.drop_reason[3:0]);
        }

        // Only admitted contributions set a member counter: job and worker are valid.
        member_cell_t member = hdr.hysync.job_id[7:0] ++ hdr.hysync.worker_id[4:0];
        if (meta.member_counter == member_counter_t.CONTRIBUTIONS) {
            contributions.count(member);
        } else if (meta.member_counter == member_counter_t.LATE) {
            late.count(member);
        } else if (meta.member_counter == member_counter_t.DUPLICATES) {
            duplicates.count(member);
        } else if (meta.member_counter == member_counter_t.STALE) {
            stale.count(member);
        }
        if (meta.verdict == verdict_t.CLOSE) {
            closes.count(member);
        }
    }
}

#endif  // __HYSYNC_TNA_STATS__
