// v1model parser, deparser and checksum controls.

#ifndef __HYSYNC_PARSER__
#define __HYSYNC_PARSER__

// Ethernet / IPv4 (no options) / UDP to port 48620 / HySync header / lanes for the ops
// that carry them (CONTRIB, RESULT). Anything else stops early and is L2-forwarded.
// A truncated packet sets standard_metadata.parser_error and still reaches ingress,
// which drops it as MALFORMED.
parser HySyncParser(packet_in packet,
                    out headers_t hdr,
                    inout metadata_t meta,
                    inout standard_metadata_t standard_metadata) {
    state start {
        transition parse_ethernet;
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
        // IPv4 options would move the UDP header: such packets are not HySync's.
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

    state parse_hysync {
        packet.extract(hdr.hysync);
        transition select(hdr.hysync.op) {
            OP_CONTRIB: parse_lanes;
            OP_RESULT: parse_lanes;
            default: accept;
        }
    }

#define EXTRACT_LANE(i) packet.extract(hdr.lanes[i]);
    // All lanes in one state, no parser loop: each extract has a fixed index.
    state parse_lanes {
        FOR_EACH_LANE(EXTRACT_LANE)
        transition accept;
    }
#undef EXTRACT_LANE
}

// The switch does not verify IPv4 checksums: a corrupted header is the receiving host's
// to reject, and the softswitch model (which the conformance suite holds this program
// to) forwards such frames unchanged too.
control HySyncVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

// Only packets the switch generates (RESULT, RESYNC, ACK; the HySync header is valid
// exactly for those once ingress has run) get a new IPv4 checksum: L2-forwarded frames
// leave byte for byte as they came. The UDP checksum of switch packets is 0 (§5).
control HySyncComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(
            hdr.hysync.isValid(),
            { hdr.ipv4.version,
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
              hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum,
            HashAlgorithm.csum16);
    }
}

control HySyncDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.hysync);
        packet.emit(hdr.lanes);   // only the valid lanes: none in a RESYNC or ACK
    }
}

#endif  // __HYSYNC_PARSER__
