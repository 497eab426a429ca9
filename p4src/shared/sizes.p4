// Sizes of every table, register and counter, with the reason for each value.
// Depends on the dimensions in defines.p4.

#ifndef __HYSYNC_SIZES__
#define __HYSYNC_SIZES__

// ---------------------------------------------------------------------- tables
#define MEMBERS_TABLE_SIZE (MAX_JOBS * MAX_WORKERS)  // one entry per (job, worker)
#define JOBS_TABLE_SIZE MAX_JOBS                     // one entry per job id
#define ROLES_TABLE_SIZE MAX_JOBS                    // one role per job id (v1model)
#define MODES_TABLE_SIZE 4096                        // 16 slot ranges per job on average
#define L2_TABLE_SIZE 4096                           // hosts behind one top-of-rack switch
#define REWRITE_TABLE_SIZE (MAX_JOBS * MAX_WORKERS)  // one replica rewrite per (job, worker)

// ------------------------------------------------------------------- registers
#define SLOT_CELLS NUM_SLOTS                         // per-slot state: one cell per slot
#define LANE_BANK_CELLS (2 * NUM_SLOTS)              // two banks per slot, by round parity
#define MEMBER_SEQ_CELLS (NUM_SLOTS * MAX_WORKERS)   // one cell per (slot, worker)

// -------------------------------------------------------------------- counters
#define MEMBER_COUNTER_CELLS (MAX_JOBS * MAX_WORKERS)   // index job * 32 + worker
#define DROP_COUNTER_CELLS (MAX_JOBS * NUM_DROP_REASONS) // index job * 16 + reason

#endif  // __HYSYNC_SIZES__
