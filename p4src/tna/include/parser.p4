// TNA parsers and deparsers: the same frames as p4src/v1model/include/parser.p4, plus
// the bridge header that ingress puts in front of every packet it sends on.

#ifndef __HYSYNC_TNA_PARSER__
#define __HYSYNC_TNA_PARSER__

// Ethernet / IPv4 (no options) / UDP to 48620 / HySync header / lanes of a CONTRIB, as on
// v1model. A packet coming back from the recirculation port carries the bridge header
// first; in a lane pass its lanes are parsed whatever its op (a RESULT's too), and on
// Tofino 1 only the half the pass works on goes into the lanes header the lane registers
// read (hdr.lanes): the first half as it is, or, for the second, after the first half
// (lanes_lo, passed through). What comes after is payload. A truncated packet reaches
// ingress with parser_err set and is dropped there as MALFORMED.
parser HySyncIngressParser(packet_in packet,
                           out headers_t hdr,
                           out ingress_metadata_t meta,
                           out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        packet.extract(ig_intr_md);
        packet.advance(PORT_METADATA_SIZE);
        transition select(ig_intr_md.ingress_port[6:0]) {
            RECIRC_PORT_IN_PIPE: parse_bridge;
            default: first_pass;
        }
    }

    // A packet from a port: its pass, its sender's port and no lane op, where the controls
    // read them for every packet (the parser writes them for free; an action would cost a
    // stage).
    state first_pass {
        meta.bridge.pass = pass_t.NONE;
        meta.bridge.ingress_port = ig_intr_md.ingress_port;
        meta.bridge.lane_op = tna_lane_op_t.NONE;
        meta.bridge.half = 0;
        meta.bridge.even = 0;
        meta.bridge.last = 0;
        transition parse_ethernet;
    }

    state parse_bridge {
        packet.extract(meta.bridge);
        transition select(meta.bridge.lane_op) {
            tna_lane_op_t.NONE: parse_ethernet;
            default: parse_lane_pass;
        }
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (4, 5, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            HYSYNC_UDP_PORT: parse_hysync;
            default: accept;
        }
    }

    // A RESULT coming back for a pass without a lane op carries its lanes as payload.
    state parse_hysync {
        packet.extract(hdr.hysync);
        transition select(hdr.hysync.op) {
            OP_CONTRIB: parse_lanes;
            default: accept;
        }
    }

    state parse_lanes {
        packet.extract(hdr.lanes_lo);
        packet.extract(hdr.lanes_hi);
        transition accept;
    }

    // A lane pass: a packet the switch made, back from the recirculation port.
    state parse_lane_pass {
        packet.extract(hdr.ethernet);
        packet.extract(hdr.ipv4);
        packet.extract(hdr.udp);
        packet.extract(hdr.hysync);
#if __TARGET_TOFINO__ == 2
        transition parse_lanes;
#else
        transition select(meta.bridge.half) {
            0: parse_lanes_first_half;
            default: parse_lanes_second_half;
        }
#endif
    }

#if __TARGET_TOFINO__ != 2
    state parse_lanes_first_half {
        packet.extract(hdr.lanes);
        transition accept;
    }

    state parse_lanes_second_half {
        packet.extract(hdr.lanes_lo);
        packet.extract(hdr.lanes);
        transition accept;
    }
#endif
}

// The bridge header goes first whenever ingress set it valid: on every packet for egress
// and on every recirculated one.
control HySyncIngressDeparser(packet_out packet,
                              inout headers_t hdr,
                              in ingress_metadata_t meta,
                              in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        packet.emit(meta.bridge);
        packet.emit(hdr);
    }
}

// Egress rewrites the Ethernet, IPv4 and UDP headers of the packets the switch made and
// counts RESULTs; their lanes stay in the payload, untouched. L2 traffic needs only its
// Ethernet header here (flood pruning), so nothing else of it is parsed.
parser HySyncEgressParser(packet_in packet,
                          out headers_t hdr,
                          out egress_metadata_t meta,
                          out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        packet.extract(eg_intr_md);
        packet.extract(meta.bridge);
        packet.extract(hdr.ethernet);
        transition select(meta.bridge.switch_packet) {
            1: parse_switch_packet;
            default: accept;
        }
    }

    state parse_switch_packet {
        packet.extract(hdr.ipv4);
        packet.extract(hdr.udp);
        packet.extract(hdr.hysync);
        transition accept;
    }
}

// Switch packets (HySync header valid) get a new IPv4 checksum after egress has set the
// destination; L2-forwarded frames leave as they came. UDP checksum 0 (protocol.md §5).
control HySyncEgressDeparser(packet_out packet,
                             inout headers_t hdr,
                             in egress_metadata_t meta,
                             in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        if (hdr.hysync.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version,
                hdr.ipv4.ihl,
                hdr.ipv4.dscp,
                hdr.ipv4.ecn,
                hdr.ipv4.total_len,
                hdr.ipv4.identification,
                hdr.ipv4.flags,
                hdr.ipv4.frag_offset,
                hdr.ipv4.ttl,
                hdr.ipv4.protocol,
                hdr.ipv4.src_addr,
                hdr.ipv4.dst_addr });
        }
        packet.emit(hdr);
    }
}

#endif  // __HYSYNC_TNA_PARSER__
