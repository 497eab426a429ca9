// HySync constants and type names shared by every target (v1model, tna).
//
// What restates hysync/wire.py (the wire format) or hysync/protocol_spec/decision.py (the decision
// table) is generated into wire.p4 and decision.p4 (`python -m hysync.codegen`); this file
// holds what is the P4 program's own.

#ifndef __HYSYNC_DEFINES__
#define __HYSYNC_DEFINES__

#include "wire.p4"
#include "decision.p4"

// ----------------------------------------------------------------------- types
typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<9>  port_num_t;      // v1model port; the TNA shim uses PortId_t
typedef bit<16> mcast_group_t;
typedef bit<32> epoch_t;         // a job install's epoch (non-zero); a slot latches it
typedef bit<32> cell_index_t;    // index into a register or counter array
typedef bit<8>  level_t;         // a job's level on a switch (protocol.md §11)

// The levels, as softswitch/levels.py numbers them.
const level_t LEVEL_SINGLE = 0;
const level_t LEVEL_LEAF = 1;
const level_t LEVEL_SPINE = 2;

// What a leaf relays of a spine's verdict (§11 leaf steps 4-5).
const bit<8> RELAY_NONE = 0;
const bit<8> RELAY_RESULT = 1;     // to every host of the job
const bit<8> RELAY_RESYNC = 2;     // flag RELAYED, to the hosts of its bitmap only

// ------------------------------------------------------ pipeline-internal values
// What a Lane control does with its register on this packet.
enum bit<8> lane_op_t {
    NONE = 0,
    ACCUMULATE = 1,      // bank = (bank & keep) + lane; the lane becomes the new bank value
    READ = 2             // the lane becomes the stored bank value (a resend)
}

#endif  // __HYSYNC_DEFINES__
