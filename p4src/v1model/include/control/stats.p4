// Stats (protocol.md §8): the ingress counters the controller's straggler policy reads.
// The other controls decide what to count (metadata); this one only counts, once, at
// the end of ingress.

#ifndef __HYSYNC_STATS__
#define __HYSYNC_STATS__

control Stats(in headers_t hdr, in metadata_t meta) {

    // Per (job, worker), index job * 32 + w.
    counter(MEMBER_COUNTER_CELLS, CounterType.packets_and_bytes) contributions;
    counter(MEMBER_COUNTER_CELLS, CounterType.packets_and_bytes) late;
    counter(MEMBER_COUNTER_CELLS, CounterType.packets_and_bytes) duplicates;
    counter(MEMBER_COUNTER_CELLS, CounterType.packets_and_bytes) stale;
    // Contributions that closed a round: in sync, the last arrival, i.e. the straggler.
    counter(MEMBER_COUNTER_CELLS, CounterType.packets_and_bytes) closes;
    // Per (job, reason), index job * 16 + reason.
    counter(DROP_COUNTER_CELLS, CounterType.packets_and_bytes) drops;
    // Per reason, switch-wide: every drop, whatever job id its bytes carry.
    counter(NUM_DROP_REASONS, CounterType.packets_and_bytes) switch_drops;

    apply {
        if (meta.count_drop) {
            // Job 0 collects drops that cannot be attributed to a job.
            cell_index_t job = 0;
            if (hdr.hysync.isValid() && hdr.hysync.job_id < MAX_JOBS) {
                job = (cell_index_t) hdr.hysync.job_id;
            }
            drops.count(job * NUM_DROP_REASONS + (cell_index_t) meta.drop_reason);
            switch_drops.count((cell_index_t) meta.drop_reason);
        }

        // Only admitted contributions set a member counter: job and worker are valid.
        cell_index_t member = (cell_index_t) hdr.hysync.job_id * MAX_WORKERS
                              + (cell_index_t) hdr.hysync.worker_id;
        if (meta.member_counter == member_counter_t.CONTRIBUTIONS) {
            contributions.count(member);
        } else if (meta.member_counter == member_counter_t.LATE) {
            late.count(member);
        } else if (meta.member_counter == member_counter_t.DUPLICATES) {
            duplicates.count(member);
        } else if (meta.member_counter == member_counter_t.STALE) {
            stale.count(member);
        }
        if (meta.emit == emit_t.CLOSE || meta.emit == emit_t.CLOSE_AS_IS) {
            closes.count(member);
        }
    }
}

#endif  // __HYSYNC_STATS__
