"""Two leaves of three hosts and a spine, each the reference pipeline or the native one, wired
in-process (docs/protocol.md §11): the cases of the two-level protocol one by one, with real
lanes, on both engines.

The same pipelines under the events the two-level model draws: tests/sim/test_two_level_pipeline.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from hysync import p4names, wire
from hysync.softswitch.levels import JobRole, Level, Uplink
from hysync.softswitch.tables import Entry
from hysync.wire import DropReason, Flag, Mode, Op
from tests.softswitch.two_level_fabric import (
    JOB,
    SPINE,
    SPINE_ADDR,
    SPINE_MAC,
    Fabric,
    contrib,
    host_addr,
    host_port,
    lanes_of,
    leaf_addr,
)

LEAVES, HOSTS = 2, 3


def gradient(leaf: int, host: int, r: int) -> np.ndarray:
    """A host's distinct lanes for round r: every sum tells whose are in it."""
    return np.arange(1, wire.LANES + 1, dtype=np.int64) * (1 << (3 * leaf + host)) + 1000 * r


def sends(leaf: int, r: int, hosts=range(HOSTS), tx: int = 1) -> list:
    return [(("host", leaf, h), ("leaf", leaf), contrib(h, r, gradient(leaf, h, r), tx=tx))
            for h in hosts]


def total(r: int, members: list[tuple[int, int]]) -> np.ndarray:
    return sum(gradient(i, h, r) for i, h in members)


def header(datagram: bytes) -> wire.Header:
    return wire.Header.unpack(datagram)


def every(leaves=range(LEAVES)) -> list[tuple[int, int]]:
    return [(i, h) for i in leaves for h in range(HOSTS)]


def drops(fabric: Fabric, label: object, reason: DropReason) -> int:
    return fabric.pipeline(label).counters["HySyncIngress.stats.drops"].packets[
        JOB * wire.NUM_DROP_REASONS + reason]


@pytest.fixture(params=["python", "native"])
def engine(request) -> str:
    return request.param


@pytest.fixture
def fabric(engine: str) -> Fabric:
    return Fabric(LEAVES, HOSTS, engine=engine)


def test_a_sync_round_gives_every_host_the_exact_sum_of_six(fabric):
    got = fabric.settle(sends(0, 0) + sends(1, 0))
    assert sorted(got) == sorted(("host", i, h) for i, h in every())
    for datagrams in got.values():
        assert len(datagrams) == 1
        hdr = header(datagrams[0])
        assert (hdr.op, hdr.round, hdr.count, hdr.mode) == (Op.RESULT, 0, 6, Mode.SYNC)
        assert hdr.bitmap == 0b111  # every host of the leaf is in the sum, at both levels
        assert hdr.reason == wire.install_tag(fabric.epoch)
        np.testing.assert_array_equal(lanes_of(datagrams[0]), total(0, every()))
    # The next round runs the same way: the leaves took the spine's numbering.
    got = fabric.settle(sends(0, 1) + sends(1, 1))
    np.testing.assert_array_equal(lanes_of(got[("host", 1, 2)][0]), total(1, every()))


def test_a_rack_late_for_a_partial_spine_is_told_refused_and_carries(fabric):
    fabric.set_mode(SPINE, Mode.PARTIAL, 1)  # the spine closes with the first rack
    down = fabric.settle(sends(0, 0), lose=lambda src, dst, d: src == SPINE)
    assert down == {}  # the spine's results are held back: leaf 1 is still summing
    uplink1 = [out for h in range(HOSTS) for _, out in fabric.deliver(
        ("host", 1, h), ("leaf", 1), contrib(h, 0, gradient(1, h, 0)))]
    assert len(uplink1) == 1 and header(uplink1[0]).count == HOSTS
    # Rack 1's sum reaches the spine after round 0 closed without it: the spine resends
    # round 0's result to leaf 1, whose hosts learn their sum is not in it.
    got = fabric.settle([(("leaf", 1), SPINE, uplink1[0])])
    for h in range(HOSTS):
        (datagram,) = got[("host", 1, h)]
        hdr = header(datagram)
        assert (hdr.op, hdr.round, hdr.count, hdr.bitmap) == (Op.RESULT, 0, HOSTS, 0)
        np.testing.assert_array_equal(lanes_of(datagram), total(0, every([0])))
    # Each of them, asking again, is told "not counted" (and carries), and its cell at the
    # leaf says refused, so no copy of its round-0 contribution is counted later.
    for h in range(HOSTS):
        (reply,) = fabric.settle([(("host", 1, h), ("leaf", 1),
                                   contrib(h, 0, gradient(1, h, 0), tx=2))])[("host", 1, h)]
        hdr = header(reply)
        assert hdr.op == Op.RESULT and hdr.flags & Flag.RESEND and not hdr.bitmap >> h & 1
        leaf = fabric.pipeline(("leaf", 1))
        assert leaf.member_epoch[h] == wire.refused_mark(fabric.epoch)
        assert leaf.member_seq[h] == 0
    # Rack 0's hosts, asking again, read their bit: their contribution is in round 0.
    (reply,) = fabric.settle([(("host", 0, 1), ("leaf", 0),
                               contrib(1, 0, gradient(0, 1, 0), tx=2))])[("host", 0, 1)]
    assert header(reply).bitmap == 0b111 and header(reply).count == HOSTS


def test_the_late_rack_follows_the_spines_numbering(fabric):
    """A round the spine closed without a rack moves that rack's leaf on: its hosts' next
    round is the spine's next one, and what the leaf had open is refused."""
    fabric.set_mode(SPINE, Mode.PARTIAL, 1)
    first = fabric.deliver(("host", 1, 0), ("leaf", 1), contrib(0, 0, gradient(1, 0, 0)))
    assert first == []  # absorbed: leaf 1 waits for its other hosts
    got = fabric.settle(sends(0, 0))
    assert header(got[("host", 1, 0)][0]).bitmap == 0  # relayed, rack 1 not in it
    leaf = fabric.pipeline(("leaf", 1))
    assert leaf.round[0] == 1 and leaf.count[0] == 0
    assert leaf.member_epoch[0] == wire.refused_mark(fabric.epoch)  # host 0's round 0
    fabric.set_mode(SPINE, Mode.SYNC)
    got = fabric.settle(sends(0, 1) + sends(1, 1))
    for i, h in every():
        hdr = header(got[("host", i, h)][-1])
        assert (hdr.round, hdr.count) == (1, 6)


def test_a_lost_uplink_is_sent_again_on_a_hosts_retransmission(fabric):
    lost = []

    def lose_first_uplink(src, dst, datagram):
        if src == ("leaf", 0) and dst == SPINE and not lost:
            lost.append(datagram)
            return True
        return False

    assert fabric.settle(sends(0, 0) + sends(1, 0), lose=lose_first_uplink) == {}
    assert len(lost) == 1
    # A host of rack 0 times out and sends again: the leaf sends its sum up again.
    resent = fabric.deliver(("host", 0, 2), ("leaf", 0),
                            contrib(2, 0, gradient(0, 2, 0), tx=2, retransmit=True))
    ((to, uplink),) = resent
    hdr = header(uplink)
    assert to == SPINE and hdr.flags & Flag.RETRANSMIT and hdr.flags >> wire.TX_SHIFT == 2
    assert drops(fabric, ("leaf", 0), DropReason.UPLINK_RESENT) == 1
    got = fabric.settle([(("leaf", 0), SPINE, uplink)])
    assert len(got) == LEAVES * HOSTS
    for datagrams in got.values():
        assert header(datagrams[0]).count == 6
        np.testing.assert_array_equal(lanes_of(datagrams[0]), total(0, every()))


def test_a_duplicated_or_late_uplink_is_counted_once(fabric):
    uplinks = {}
    for i in range(LEAVES):
        for src, dst, d in sends(i, 0):
            for _to, out in fabric.deliver(src, dst, d):
                uplinks[i] = out
    # Leaf 0's sum arrives twice before leaf 1's: the copy is a duplicate of the open round.
    assert fabric.deliver(("leaf", 0), SPINE, uplinks[0]) == []
    assert fabric.deliver(("leaf", 0), SPINE, uplinks[0]) == []
    got = fabric.settle([(("leaf", 1), SPINE, uplinks[1])])
    np.testing.assert_array_equal(lanes_of(got[("host", 0, 0)][0]), total(0, every()))
    assert header(got[("host", 0, 0)][0]).count == 6
    # Round 1 opens; leaf 0's round-0 sum arrives again, reordered behind it: the spine
    # answers with round 0's result, which leaf 0 has relayed already: dropped there.
    fabric.settle(sends(0, 1))
    assert fabric.settle([(("leaf", 0), SPINE, uplinks[0])]) == {}
    assert drops(fabric, ("leaf", 0), DropReason.DUPLICATE) == 1
    got = fabric.settle(sends(1, 1))
    np.testing.assert_array_equal(lanes_of(got[("host", 1, 1)][0]), total(1, every()))
    assert header(got[("host", 1, 1)][0]).count == 6


def test_a_leaf_restart_is_a_restart_of_the_job(fabric):
    fabric.settle(sends(0, 0) + sends(1, 0))
    fabric.settle(sends(0, 1))  # leaf 0's round-1 sum waits at the spine for leaf 1's
    (uplink,) = [out for src, dst, d in sends(1, 1) for _, out in fabric.deliver(src, dst, d)]
    # Round 1's result, of the install that is about to go, still on its way to leaf 0.
    (stale,) = [out for to, out in fabric.deliver(("leaf", 1), SPINE, uplink)
                if to == ("leaf", 0)]
    fabric.restart_leaf(1, epoch=2)
    # The old install's result reaches leaf 0 after the restart: no sum of the new one.
    assert fabric.settle([(SPINE, ("leaf", 0), stale)]) == {}
    assert drops(fabric, ("leaf", 0), DropReason.STALE) == 1
    # Every host starts the job again at round 0, on every switch.
    got = fabric.settle(sends(0, 0) + sends(1, 0))
    assert len(got) == LEAVES * HOSTS
    for datagrams in got.values():
        hdr = header(datagrams[0])
        assert (hdr.round, hdr.count, hdr.reason) == (0, 6, wire.install_tag(2))
        np.testing.assert_array_equal(lanes_of(datagrams[0]), total(0, every()))


def test_a_verdict_from_another_address_than_the_spine_is_dropped(fabric):
    fabric.settle(sends(0, 0))
    forged = wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=0, round=0,
                         bitmap=0b11, count=6, reason=wire.install_tag(1)).pack()
    forged += bytes(wire.PAYLOAD_BYTES)
    assert fabric.deliver(("host", 0, 1), ("leaf", 0), forged) == []
    assert drops(fabric, ("leaf", 0), DropReason.NOT_MEMBER) == 1
    assert fabric.pipeline(("leaf", 0)).up_pending[0]


def test_a_leaf_partial_inside_a_rack_leaves_its_slow_host_out(fabric):
    fabric.set_mode(("leaf", 0), Mode.PARTIAL, 2)
    got = fabric.settle(sends(0, 0, hosts=[0, 1]) + sends(1, 0))
    hdr = header(got[("host", 0, 0)][0])
    assert (hdr.count, hdr.bitmap, hdr.mode) == (5, 0b011, Mode.SYNC)  # the spine's mode
    np.testing.assert_array_equal(lanes_of(got[("host", 1, 0)][0]),
                                  total(0, [(0, 0), (0, 1), *every([1])]))
    (late,) = fabric.settle(sends(0, 0, hosts=[2]))[("host", 0, 2)]
    assert header(late).op == Op.RESULT and header(late).flags & Flag.RESEND
    assert not header(late).bitmap >> 2 & 1  # not in it: the slow host carries


def test_a_role_is_checked_when_it_is_set(engine):
    with pytest.raises(ValueError, match="uplink_id 40 is out of range"):
        Uplink(SPINE_ADDR, SPINE_MAC, 40, 1)
    with pytest.raises(ValueError, match="a leaf needs its uplink"):
        JobRole(Level.LEAF)
    fabric = Fabric(1, 1, engine=engine)
    with pytest.raises(ValueError, match="job 0 is out of range"):
        fabric.spine.set_role(0, JobRole(Level.SPINE))
    fabric.spine.set_role(JOB, None)
    assert fabric.spine.role(JOB).level == Level.SINGLE


def test_the_frame_path_sends_the_uplink_out_of_the_spines_port(engine):
    """Ethernet frames in and out (the path BMv2 is compared on): the uplink leaves on the
    port the leaf's L2 table gives the spine's MAC, addressed leaf -> spine."""
    fabric = Fabric(1, 1, engine=engine)
    leaf_mac, host_mac, spine_port = bytes.fromhex("02000000b001"), bytes.fromhex("02000000c001"), 7
    leaf = fabric.pipeline(("leaf", 0))
    leaf.write_entry("INSERT", Entry(p4names.FORWARDING_L2, (SPINE_MAC,),
                                     p4names.FORWARDING_SET_EGRESS_PORT, (spine_port,)))
    frame = wire.build_frame(wire.FrameAddress(host_mac, leaf_mac, host_addr(0, 0), leaf_addr(0),
                                               host_port(0)), contrib(0, 0, gradient(0, 0, 0)))
    ((port, up),) = leaf.process_frame(1, frame)
    addr, datagram = wire.parse_frame(up)
    assert port == spine_port
    assert (addr.dst_mac, addr.src_ip, addr.dst_ip, addr.dst_port) == (
        SPINE_MAC.to_bytes(6, "big"), leaf_addr(0), SPINE_ADDR, wire.HYSYNC_UDP_PORT)
    hdr = header(datagram)
    assert (hdr.op, hdr.worker_id, hdr.count) == (Op.CONTRIB, 0, 1)
    ((_, result),) = fabric.spine.process_frame(3, up)
    ((_, down),) = leaf.process_frame(spine_port, result)
    addr, datagram = wire.parse_frame(down)
    assert addr.dst_ip == host_addr(0, 0) and header(datagram).bitmap == 1
    np.testing.assert_array_equal(lanes_of(datagram), gradient(0, 0, 0))


def uplink_of(fabric: Fabric, leaf: int, packets: list) -> bytes:
    """The sum `leaf` sends up once its hosts' packets are in."""
    (up,) = [out for src, dst, d in packets for to, out in fabric.deliver(src, dst, d)
             if to == SPINE]
    return up


def test_a_sum_the_spine_refused_as_stale_is_relayed_to_its_hosts_only(fabric):
    """Rack 1's sum of round 0 reaches the spine two rounds late: the spine's STALE_ROUND
    reaches the rack's hosts relayed, their flight named by the sum's chunk."""
    fabric.set_mode(SPINE, Mode.PARTIAL, 1)
    for r in (0, 1):  # rack 0 alone closes rounds 0 and 1; rack 1 hears none of them
        fabric.settle(sends(0, r), lose=lambda src, dst, d: dst == ("leaf", 1))
    fabric.set_mode(("leaf", 1), Mode.PARTIAL, 2)  # rack 1 closes without its host 2
    uplink = uplink_of(fabric, 1, [(("host", 1, h), ("leaf", 1),
                                    contrib(h, 0, gradient(1, h, 0), chunk=40))
                                   for h in range(2)])
    got = fabric.settle([(("leaf", 1), SPINE, uplink)])
    assert sorted(got) == [("host", 1, 0), ("host", 1, 1)]  # host 2 is not in the sum
    for h in range(2):
        (relayed,) = got[("host", 1, h)]
        hdr = header(relayed)
        assert (hdr.op, hdr.flags, hdr.reason) == (Op.RESYNC, Flag.RELAYED,
                                                   wire.ResyncReason.STALE_ROUND)
        assert (hdr.round, hdr.chunk, hdr.bitmap) == (2, 40, 0b011)
    leaf = fabric.pipeline(("leaf", 1))
    assert leaf.round[0] == 2 and not leaf.up_pending[0]
    for h in range(2):
        assert leaf.member_epoch[h] == wire.refused_mark(fabric.epoch)
        assert leaf.member_seq[h] == 0


def test_a_chunk_mismatch_at_the_spine_reaches_the_hosts_with_the_spines_chunk(fabric):
    """The racks' round 0 aggregates different chunks: the spine opened it with rack 0's, so
    rack 1's hosts are told, relayed, which chunk to contribute instead (§9), for the round
    of their sum."""
    up0 = uplink_of(fabric, 0, [(("host", 0, h), ("leaf", 0),
                                 contrib(h, 0, gradient(0, h, 0), chunk=5)) for h in range(HOSTS)])
    up1 = uplink_of(fabric, 1, [(("host", 1, h), ("leaf", 1),
                                 contrib(h, 0, gradient(1, h, 0), chunk=7)) for h in range(HOSTS)])
    assert fabric.deliver(("leaf", 0), SPINE, up0) == []  # round 0 opens with chunk 5
    got = fabric.settle([(("leaf", 1), SPINE, up1)])
    assert sorted(got) == [("host", 1, h) for h in range(HOSTS)]
    for h in range(HOSTS):
        (relayed,) = got[("host", 1, h)]
        hdr = header(relayed)
        assert (hdr.op, hdr.flags, hdr.reason) == (Op.RESYNC, Flag.RELAYED,
                                                   wire.ResyncReason.CHUNK_MISMATCH)
        assert (hdr.round, hdr.chunk, hdr.bitmap) == (0, 5, 0b111)
    leaf = fabric.pipeline(("leaf", 1))
    assert not leaf.up_pending[0]
    assert all(leaf.member_epoch[h] == wire.refused_mark(fabric.epoch) for h in range(HOSTS))


def test_the_native_engine_names_what_is_wrong_with_a_register_or_a_role():
    from hysync.softswitch.native import NativePipeline

    pipeline = NativePipeline(num_slots=1)
    with pytest.raises(ValueError, match="no register rounds: name one of the reference"):
        pipeline.engine.read_register("rounds", 0)
    with pytest.raises(IndexError, match="slot 1 is outside 0..0"):
        _ = pipeline.up_pending[1]
    with pytest.raises(ValueError, match="round is not a member register"):
        pipeline.round[0] = 3
    pipeline.member_seq[2] = 7
    assert pipeline.member_seq[2] == 7
    with pytest.raises(ValueError, match="uplink id 40 is not a role"):
        pipeline.engine.set_tables(members=[], jobs=[], modes=[], l2=[], rewrites=[], groups=[],
                                   roles=[(JOB, int(Level.LEAF), SPINE_ADDR, SPINE_MAC, 40, 1)])


def test_a_spine_whose_leaves_claim_more_than_255_hosts_wraps_the_count_byte(engine):
    """The weight is the RESULT's count byte (a two-level job has at most 255 hosts): leaves
    that claim 200 and 100 get a result of count 44 on both engines, as P4's bit<8> has it."""
    fabric = Fabric(2, 1, engine=engine)
    uplinks = [wire.Header(op=Op.CONTRIB, job_id=JOB, worker_id=i, slot=0, round=0,
                           count=hosts, flags=1 << wire.TX_SHIFT).pack()
               + bytes(wire.PAYLOAD_BYTES) for i, hosts in enumerate((200, 100))]
    assert fabric.deliver(("leaf", 0), SPINE, uplinks[0]) == []
    ((_, result), (_, _)) = fabric.deliver(("leaf", 1), SPINE, uplinks[1])
    assert header(result).count == 300 & 0xFF


def test_a_leaf_takes_its_round_back_open_for_the_spines_chunk(fabric):
    """Rack 1's sum of round 0 holds chunk 7, the spine's round 0 chunk 5: the leaf, already
    at round 1 with its late host's contribution open there, takes round 0 back open. The late
    host is told refused at round 1 and pointed back to round 0; the rack's contributions of
    chunk 5 at round 0 then close the spine's round with all six hosts."""
    up0 = uplink_of(fabric, 0, [(("host", 0, h), ("leaf", 0),
                                 contrib(h, 0, gradient(0, h, 0), chunk=5)) for h in range(HOSTS)])
    assert fabric.deliver(("leaf", 0), SPINE, up0) == []  # round 0 opens with chunk 5
    fabric.set_mode(("leaf", 1), Mode.PARTIAL, 2)  # rack 1 closes round 0 without host 2
    up1 = uplink_of(fabric, 1, [(("host", 1, h), ("leaf", 1),
                                 contrib(h, 0, gradient(1, h, 0), chunk=7)) for h in range(2)])
    late = fabric.deliver(("host", 1, 2), ("leaf", 1), contrib(2, 0, gradient(1, 2, 0), chunk=7))
    (stale,) = [out for _to, out in late]
    assert (header(stale).reason, header(stale).round) == (wire.ResyncReason.STALE_ROUND, 1)
    # host 2 sends again at round 1, which absorbs it while the sum is at the spine
    assert fabric.deliver(("host", 1, 2), ("leaf", 1),
                          contrib(2, 1, gradient(1, 2, 0), chunk=7, tx=2)) == []
    leaf = fabric.pipeline(("leaf", 1))
    assert (leaf.round[0], leaf.count[0], leaf.bitmap[0]) == (1, 1, 0b100)

    got = fabric.settle([(("leaf", 1), SPINE, up1)])
    for h in range(2):
        (relayed,) = got[("host", 1, h)]
        assert (header(relayed).reason, header(relayed).round, header(relayed).chunk) == (
            wire.ResyncReason.CHUNK_MISMATCH, 0, 5)
    assert (leaf.round[0], leaf.count[0], leaf.bitmap[0], leaf.res_valid[0]) == (0, 0, 0, 0)
    assert (leaf.member_seq[2], leaf.member_epoch[2]) == (1, wire.refused_mark(fabric.epoch))
    (back,) = [out for _to, out in fabric.deliver(
        ("host", 1, 2), ("leaf", 1), contrib(2, 1, gradient(1, 2, 0), chunk=7, tx=3))]
    assert (header(back).reason, header(back).round) == (wire.ResyncReason.STALE_ROUND, 0)

    fabric.set_mode(("leaf", 1), Mode.SYNC)
    got = fabric.settle([(("host", 1, h), ("leaf", 1),
                          contrib(h, 0, gradient(1, h, 0), chunk=5, tx=4)) for h in range(HOSTS)])
    for i, h in every():
        (result,) = got[("host", i, h)]
        hdr = header(result)
        assert (hdr.op, hdr.round, hdr.chunk, hdr.count) == (Op.RESULT, 0, 5, 6)
        assert np.array_equal(lanes_of(result), total(0, every()))
