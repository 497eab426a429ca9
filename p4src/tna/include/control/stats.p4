// Stats on Tofino (protocol.md §8): the v1model counters, as TNA Counter externs with the
// same names, sizes and indexes. Counted once, by the pass that decided (a resend's member
// counter by its last lane pass).

#ifndef __HYSYNC_TNA_STATS__
#define __HYSYNC_TNA_STATS__

control Stats(in headers_t hdr, in metadata_t meta, in bit<8> drop_job) {

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

    // One table per counter, keyed on what decides it: they share one stage, where a chain
    // of ifs costs a gateway and mostly a stage per level on Tofino 1. (A table addresses
    // all its counters in every action, with one index: so one counter each.)
#define COUNT_TABLE(counter, key_field, key_value, index) \
    @hidden action count_##counter() { \
        counter.count(index); \
    } \
    @hidden table counter##_stats { \
        key = { \
            key_field : exact; \
        } \
        actions = { \
            count_##counter; \
            @defaultonly NoAction; \
        } \
        const entries = { \
            key_value : count_##counter(); \
        } \
        const default_action = NoAction(); \
        size = 1; \
    }

    // Drops: per (job, reason), job 0 for drops without a job (drop_job, hysync.p4).
    COUNT_TABLE(drops, meta.count_drop, true, drop_job ++ meta.drop_reason[3:0])
    COUNT_TABLE(switch_drops, meta.count_drop, true, meta.drop_reason[3:0])
    // Only admitted contributions set a member counter: job and worker are valid.
    COUNT_TABLE(contributions, meta.member_counter, member_counter_t.CONTRIBUTIONS,
                hdr.hysync.job_id[7:0] ++ hdr.hysync.worker_id[4:0])
    COUNT_TABLE(late, meta.member_counter, member_counter_t.LATE,
                hdr.hysync.job_id[7:0] ++ hdr.hysync.worker_id[4:0])
    COUNT_TABLE(duplicates, meta.member_counter, member_counter_t.DUPLICATES,
                hdr.hysync.job_id[7:0] ++ hdr.hysync.worker_id[4:0])
    COUNT_TABLE(stale, meta.member_counter, member_counter_t.STALE,
                hdr.hysync.job_id[7:0] ++ hdr.hysync.worker_id[4:0])
    COUNT_TABLE(closes, meta.verdict, verdict_t.CLOSE,
                hdr.hysync.job_id[7:0] ++ hdr.hysync.worker_id[4:0])
#undef COUNT_TABLE

    apply {
        drops_stats.apply();
        switch_drops_stats.apply();
        contributions_stats.apply();
        late_stats.apply();
        duplicates_stats.apply();
        stale_stats.apply();
        closes_stats.apply();
    }
}

#endif  // __HYSYNC_TNA_STATS__
