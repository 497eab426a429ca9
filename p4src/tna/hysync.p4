// HySync for Tofino 1 (TNA) and Tofino 2 (T2NA): in-network gradient aggregation whose
// synchronization mode (sync, partial(q), async) the controller hot-swaps per slot range.
//
// The same wire protocol (docs/protocol.md) and the same P4Info names as
// p4src/v1model/hysync.p4, so one control plane drives BMv2, the softswitch and Tofino.
// docs/tofino.md explains the layout over the stages and every difference from v1model:
// the slot state is split into registers of one stateful-ALU access each, two lanes share
// a 64-bit register, and the lanes act in a pass through the recirculation port after the
// pass that decides.
//
// Compile (make p4-tofino):
//   p4c-barefoot --target tofino  --arch tna  p4src/tna/hysync.p4
//   p4c-barefoot --target tofino2 --arch t2na p4src/tna/hysync.p4

#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
#include <tna.p4>
#endif

// A job's level per switch (protocol.md §11), on Tofino 2: this program runs a job as its
// spine, where each member is a leaf whose uplink carries the hosts in its sum, or at one
// level; it runs no leaf (docs/tofino.md, "Two levels"), and the controller sets no leaf
// role on it. Tofino 1's passes take all 12 stages and Weight would lengthen its DECIDE pass
// (docs/tofino.md, "Two levels"): its program has no roles table and runs every job at one
// level.
#if __TARGET_TOFINO__ == 2
#define HYSYNC_ROLES
#endif

#include "../shared/defines.p4"
#include "../shared/sizes.p4"
#include "../shared/headers.p4"
#include "include/defines.p4"

#include "include/parser.p4"
#include "../shared/control/admission.p4"
#ifdef HYSYNC_ROLES
#include "../shared/control/roles.p4"
#endif
#include "../shared/control/sync_mode.p4"
#include "include/control/slot_registers.p4"
#include "include/control/lanes.p4"
#include "include/control/aggregation.p4"
#include "include/control/replies.p4"
#include "include/control/forwarding.p4"
#include "include/control/stats.p4"
#include "include/control/replication.p4"

// Metadata starts at zero, as on v1model: the controls rely on it for fields a packet's
// path leaves unset (the compiler otherwise leaves them undefined).
@pa_auto_init_metadata

// A resend reads res_meta into bridge.res_packed straight from a stateful ALU, whose 32-bit
// answer reaches the action data bus as one word; an 8-bit ALU reads any byte of it, a
// 16-bit ALU only an aligned half. Left to itself PHV allocation may put res_packed[23:8]
// in one 16-bit container (no ALU can write it from that word), and one 32-bit container
// is not to be had (Resent copies its bytes into 8-bit header fields, which fixes where they
// sit). So each byte gets an 8-bit container.
@pa_container_size("ingress", "meta.bridge.res_packed", 8, 8, 8, 8)

control HySyncIngress(inout headers_t hdr,
                      inout ingress_metadata_t meta,
                      in ingress_intrinsic_metadata_t ig_intr_md,
                      in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                      inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                      inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

    Admission() admission;
#ifdef HYSYNC_ROLES
    Roles() roles;
#endif
    SyncMode() sync_mode;
    Round() round;
    Lanes() lanes;
    RoundCompare() round_compare;
    Latching() latching;
    Counting() counting;
    AsyncPass() async_pass;
    Results() results;
    Resent() resent;
    Replies() replies;
    Forwarding() forwarding;
    Stats() stats;

    @hidden action drop(drop_reason_t reason) {
        meta.hs.count_drop = true;
        meta.hs.drop_reason = reason;
        ig_dprsr_md.drop_ctl = 1;
    }

    // Every packet that goes on to egress carries the bridge header (parser.p4); egress
    // reads these two fields and the contribution's port. Set for every packet, before
    // Replies (which reads the pass and sets the next one): a recirculated packet's
    // ingress ignores them, and on Tofino 1 a table after Replies would start where the
    // replies end.
    @hidden action bridge_to_egress() {
        meta.bridge.setValid();
        meta.bridge.flooded = (bit<1>) meta.hs.flooded;
        meta.bridge.switch_packet = (bit<1>) hdr.hysync.isValid();
    }

    // w's bit. Tofino has no shift by a variable amount: one row per worker id.
    @hidden action set_me(bitmap_t me) {
        meta.tf.me = me;
    }

    @hidden table worker_bit {
        key = {
            hdr.hysync.worker_id : exact;
        }
        actions = {
            set_me;
        }
        const entries = {
#define WORKER_BIT(w) w : set_me(32w1 << w);
            FOR_EACH_WORKER(WORKER_BIT)
#undef WORKER_BIT
        }
        size = MAX_WORKERS;
    }

    // The job a drop is counted under: the packet's, or job 0 for a packet without a
    // HySync header or with a job id past the counters. From parsed fields: beside Round.
    @hidden action set_drop_job(bit<8> job) {
        meta.tf.drop_job = job;
    }

    @hidden action own_drop_job() {
        meta.tf.drop_job = hdr.hysync.job_id[7:0];
    }

    @hidden table drop_job {
        key = {
            hdr.hysync.isValid() : exact;
            hdr.hysync.job_id    : ternary;
        }
        actions = {
            set_drop_job;
            own_drop_job;
        }
        const entries = {
            (true, 0x0000 &&& 0xFF00) : own_drop_job();
        }
        const default_action = set_drop_job(0);
        size = 2;
    }

    // The recirculation port of the pipe the packet arrived on (the port's top two bits),
    // for Replies: looked up for every packet beside Round (an action writes a container
    // from one source, so the port number cannot be assembled where it is used).
    @hidden action set_recirc_port(PortId_t port) {
        meta.tf.recirc_port = port;
    }

    @hidden table recirc_port {
        key = {
            ig_intr_md.ingress_port[8:7] : exact;
        }
        actions = {
            set_recirc_port;
        }
        const entries = {
            0 : set_recirc_port(0 << 7 | (PortId_t) RECIRC_PORT_IN_PIPE);
            1 : set_recirc_port(1 << 7 | (PortId_t) RECIRC_PORT_IN_PIPE);
            2 : set_recirc_port(2 << 7 | (PortId_t) RECIRC_PORT_IN_PIPE);
            3 : set_recirc_port(3 << 7 | (PortId_t) RECIRC_PORT_IN_PIPE);
        }
        size = 4;
    }

    apply {
        meta.hs.count_drop = false;
        meta.hs.flooded = false;
        meta.hs.verdict = verdict_t.NONE;
        meta.hs.member_counter = member_counter_t.NONE;
        meta.hs.admitted = false;

        // Every pass: the round register (read; advance, take or reset by the pass), w's
        // bit, the drop counters' job, the recirculation port.
        round.apply(hdr, meta.tf, meta.bridge.pass, meta.bridge.last, hdr.hysync.bitmap);
        worker_bit.apply();
        drop_job.apply();
        recirc_port.apply();

        // The passes, in parallel stages (Tofino 1 chains its tables by next-table
        // pointers, which only go forward, so a sequence of tables costs the sum of its
        // stages; the branches of one test cost the longest): a first pass admits and
        // latches (and, on Tofino 2, counts); Tofino 1 counts in a DECIDE pass; an ASYNC
        // pass takes its round; a lane pass applies the lane op the pass before decided
        // (docs/tofino.md, "Stages").
        if (meta.bridge.pass == pass_t.NONE || meta.bridge.pass == pass_t.RESET) {
            // 8. The mode the controller wants for this slot now (a lookup without side
            // effects, made for every packet: its answer is used only by an admitted
            // contribution that opens a round).
            sync_mode.apply(hdr, meta.hs);
            round_compare.apply(hdr, meta);
            if (meta.bridge.pass == pass_t.RESET) {
                // Nothing admitted, nothing counted; the epoch of the install the slot now
                // belongs to.
                meta.hs.epoch = hdr.hysync.bitmap;
            } else if (ig_prsr_md.parser_err != 0) {
                // 1. Truncated: changes no state, counted.
                drop(DROP_MALFORMED);
            } else if (!hdr.hysync.isValid()) {
                // §7. Not HySync: L2.
                forwarding.apply(hdr, meta, ig_tm_md);
            } else if (hdr.hysync.version != HYSYNC_VERSION) {
                drop(DROP_BAD_VERSION);                                 // 2.
            } else if (hdr.hysync.op != OP_CONTRIB) {
                drop(DROP_BAD_OP);                                      // 3.
            } else if (hdr.ipv4.total_len != CONTRIB_IPV4_LEN
                       || hdr.udp.length != CONTRIB_UDP_LEN) {
                // 4. Tofino's ingress does not know the frame length: bytes after the IPv4
                // packet are not caught here (docs/tofino.md).
                drop(DROP_BAD_LENGTH);
            } else {
                // 5-7. A member of a configured job, on its slots; the job's level here.
                admission.apply(hdr, meta.hs);
#ifdef HYSYNC_ROLES
                roles.apply(hdr, meta.hs);
#endif
                if (!meta.hs.admitted) {
                    ig_dprsr_md.drop_ctl = 1;
                }
            }
            // 8. Latch (an admitted first pass), or reset the slot.
            latching.apply(hdr, meta);
#if __TARGET_TOFINO__ == 2
            // 9-10. Count and decide, in the same pass.
            if (meta.tf.counting) {
                counting.apply(hdr, meta);
            }
        } else if (meta.bridge.pass == pass_t.ASYNC) {
            async_pass.apply(hdr, meta);
#else
        } else if (meta.bridge.pass == pass_t.DECIDE || meta.bridge.pass == pass_t.ASYNC) {
            if (meta.bridge.pass == pass_t.DECIDE) {
                // 9-10. Count and decide, one pass after Latching.
                counting.apply(hdr, meta);
            } else {
                async_pass.apply(hdr, meta);
            }
            // The result header: stored by a close and an async round, read by a resend.
            results.apply(hdr, meta);
#endif
        } else {
            // A lane pass.
            lanes.apply(hdr, meta.bridge);
            resent.apply(hdr, meta);
        }
#if __TARGET_TOFINO__ == 2
        // The result header: stored by a close and an async round, read by a resend.
        results.apply(hdr, meta);
#endif
        // §8. Count what the controls above decided to count (the pass that decided; a
        // resend's member counter in its last lane pass). Before Replies, which it does not
        // depend on: on Tofino 1 a table after the replies would start where they end.
        stats.apply(hdr, meta.hs, meta.tf.drop_job);
        bridge_to_egress();

        if (hdr.hysync.isValid()) {
            // The RESULT / RESYNC / ACK the verdict calls for, or the next pass.
            replies.apply(hdr, meta, ig_intr_md, ig_dprsr_md, ig_tm_md);
        }
    }
}

control HySyncEgress(inout headers_t hdr,
                     inout egress_metadata_t meta,
                     in egress_intrinsic_metadata_t eg_intr_md,
                     in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                     inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                     inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {

    Replication() replication;

    apply {
        // §6-7. Address each replica of a RESULT, count RESULTs, prune L2 floods.
        replication.apply(hdr, meta, eg_intr_md, eg_dprsr_md);
    }
}

Pipeline(HySyncIngressParser(),
         HySyncIngress(),
         HySyncIngressDeparser(),
         HySyncEgressParser(),
         HySyncEgress(),
         HySyncEgressDeparser()) pipe;

Switch(pipe) main;
