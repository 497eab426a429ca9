"""The invariants every simulated run is held to, and the rules that allow what they do not
(docs/protocol.md §10: "Invariants" and "Allowed, by rule").

Checked while the run plays (run.py): every round's sum is what the switch counted into it,
bit for bit; every call ends within the liveness bound, fixed when it starts. Checked here,
at its end, for every worker (dead ones included), in every mode the job ends in; every
violation is reported, not only the first:

* failures: a failed call is allowed only by a rule of RULES, with the error the rule names
  and within its bound (Plan.fail_within of its cause), and only at a worker the cause touched.
* exactly-once: per element of every chunk, what a worker was given (in fixed point) == what
  the switch counted from it + the residual it holds + what its packets in flight took from
  the residual and the switch has not counted; what a restart or a re-install wiped, or a
  round that closed in a lost state whose result no member applied, counts as not counted.
  A worker that died, aborted a call or outlived a switch state may be off by no more than
  its contributions of unknown fate (rule unknown_fate), and must know it (flagged) or still
  have a packet in flight.
* agreement (RULE A): a worker applies a round (switch state, slot, round) at most once, and
  only a result that state emitted, header for header.
* nothing lost silently: a result a worker drops as a duplicate of none it applied leaves
  its replica flagged for a resync.
* non-finite values travel (docs/protocol.md §9, "Non-finite values"), outside the rule
  nonfinite_unknown_fate.
* every chunk reaches a round once faults stop, in every mode, while the live members can
  close rounds.

RULES names each allowance; Record.excused counts them per run and `make simulate` per
sweep (excused_by_rule).
"""

from __future__ import annotations

import numpy as np

from hysync import wire
from tests.conformance.tna_model import TnaModelPipeline

from .check_hosts import check_hosts
from .plan import JOIN_AFTER, SCALE
from .run import Record, Sim

H = wire.HEADER_BYTES
_CHUNK = slice(wire.FIELD_OFFSET["chunk"], wire.FIELD_OFFSET["chunk"] + 4)  # its bytes


# Every failed call, and every other departure from the invariants, that the protocol allows:
# one rule each, stated in docs/protocol.md §10 ("Allowed, by rule"), with the bound the
# checker holds it to. Record.excused counts each per run; nothing else is excused.
RULES = {
    "restart_abort": "a call ends SwitchRestartedError within dead_after + 2 rto_max of a "
                     "restart or a re-install (and the switch's silence), or is the "
                     "worker's first call to end after one",
    "bare_unreachable": "a call ends NoReplyError within dead_after + 2 rto_max "
                        "of the later of its start and a bare restart (no job installed)",
    "restart_unheard": "a call ends NoReplyError within dead_after + 2 rto_max of a restart "
                       "or a re-install (and the switch's silence) that came while it was under "
                       "way, having heard no reply of the switch but NOT_JOINED since",
    "dead_member": "a call ends NoReplyError within dead_after + 2 rto_max of "
                   "the later of its start and the death of a member its mode waits for",
    "end_behind": "a call ends NoReplyError within dead_after + 2 rto_max of the "
                  "later of its start and the last call of the members its mode waits for, "
                  "who finished the job before it",
    "lossy_straggler": "a call ends NoReplyError after its dead timer started "
                       "while the network still lost packets, with a live peer behind it, "
                       "or, no peer more than one call ahead, with a live member (itself "
                       "included) still in the call that the network lost a contribution of "
                       "twice or more in a row while its dead timer ran, or, whatever call "
                       "its peers are in, with a contribution of its own that the network "
                       "lost twice or more in a row then, on a slot the call still waited on",
    "died_with_member": "the key of the call a member died in is not held to its books: "
                        "what the call had not sent died with it",
    "nonfinite_unknown_fate": "the non-finite books and outputs of a worker that died or "
                              "aborted a call, or of any worker once the switch lost its "
                              "state, are not held (its sentinels in flight share its "
                              "contributions' unknown fate)",
    "limit_relaunch": "(a limit, not a guarantee) a chunk's books of a worker that "
                      "aborted a call or outlived a switch state are off by no more than "
                      "its unknown-fate contributions and a flight settled by a round that "
                      "had counted another transmission of its, with other lanes",
    "limit_stale_copy": "(a limit, not a guarantee) a chunk's books of a worker are off by "
                        "no more than its contributions that a copy of theirs erased from its "
                        "member cell: counted in an open round, then a copy of an earlier "
                        "transmission of theirs under another round field (a first contact's "
                        "sequence number) answered STALE_ROUND there, whose refusal mark "
                        "replaced the count's record",
    "limit_dead_latch": "(a limit, not a guarantee) a worker's chunks of a key reach no "
                        "round after the faults stop, every one on a slot whose open round "
                        "latched sync or partial with a quorum that counts a dead member "
                        "and cannot close with the live members",
    "limit_out_of_step": "(a limit, not a guarantee) a worker's chunks of a key reach no "
                         "round after the faults stop, each, in every call of the key "
                         "judged, answered CHUNK_MISMATCH by a partial slot (the open round "
                         "of a chunk of another key, or of this key's that the round's "
                         "members went on to after such a displacement of their own; "
                         "behind a slow switch also RESEND by such a round of another key "
                         "closed already) or carried behind the call's own earlier packet "
                         "holding the slot (of an earlier call, or parked in this one "
                         "behind a slow switch before the switch saw it): "
                         "the members' calls stay out of step on the slot, and partial "
                         "carries a displaced chunk, never chases it",
    "limit_raced": "(a limit, not a guarantee) a worker's chunks of a key reach no round "
                   "after the faults stop behind a slow switch, each, in every call of the key "
                   "judged, answered RESEND by a partial round of another chunk that closed "
                   "without it, of quorum 1 or of a chunk of another key: members out of "
                   "step race for each round of the "
                   "slot, and partial carries the chunk that lost, never chases it",
    "unknown_fate": "a chunk's books of a worker that died, aborted a call or outlived a "
                    "switch state are off by no more than its contributions the switch "
                    "counted and never acknowledged to it",
}
# The bound of the NoReplyError rules and of restart_abort is Plan.fail_within: dead_after +
# 2 rto_max, of the engine's timing fitted to the plan's switch.


def check(rec: Record, sim: Sim) -> list[str]:
    """Every violation of the run (docs/protocol.md §10), in the order found."""
    out = list(rec.violations)
    plan = rec.plan
    for wk in sim.workers:
        failed = [c for c in wk.calls if c.status not in ("done", "")]
        for c in failed:
            rule = _failure_rule(rec, sim, wk, c)
            if rule is None:
                out.append(f"failure: worker {wk.w} call {c.index} (started {c.start:.3f} s) "
                           f"ended {c.status!r} at {c.end:.3f} s, which no rule allows "
                           f"({_failure_context(rec, sim, wk, c)})")
            else:
                rec.excused[rule] = rec.excused.get(rule, 0) + 1
        if not wk.dead and len(wk.calls) < plan.calls * len(plan.sizes):
            out.append(f"liveness: worker {wk.w} made {len(wk.calls)} of "
                       f"{plan.calls * len(plan.sizes)} calls")
        out += _exactly_once(rec, wk)
        out += _agreement(rec, wk)
        if wk.dead or failed or rec.state_resets:
            rec.excused["nonfinite_unknown_fate"] = \
                rec.excused.get("nonfinite_unknown_fate", 0) + 1
        else:
            out += _nonfinite_books(rec, sim, wk) + _nonfinite_seen(rec, sim, wk)
        out += _starved(rec, sim, wk)
        if wk.dropped and not wk.engine.needs_resync:
            state, slot, rnd = wk.dropped[0]
            out.append(f"silent loss: worker {wk.w} dropped the result of slot {slot} round "
                       f"{rnd} (switch state {state}) as a duplicate, applied none such, and "
                       f"its replica is not flagged for a resync ({len(wk.dropped)} such)")
    # Hosts of several ranks: exactly-once and agreement for every rank (check_hosts.py).
    out += check_hosts(rec, sim)
    return out


def _failure_rule(rec: Record, sim: Sim, wk, c) -> str | None:
    """The rule of RULES that allows failed call c, or None."""
    if c.status == "reset":
        # Within fail_within of a restart or a re-install (and its switch's silence), or
        # the worker's first call to end after one (a worker paused or computing hears of it
        # with its next packet).
        resets = [(f.at, f.length) for f in rec.plan.faults
                  if f.kind in ("restart", "readd") and f.at < c.end]
        if resets and (any(c.end <= t + length + rec.plan.fail_within for t, length in resets) or
                       not any(x.status == "reset" and resets[-1][0] < x.end < c.end
                               for x in wk.calls)):
            return "restart_abort"
        return None
    if c.status != "unreachable":
        return None
    if _lossy_straggler(rec, sim, wk, c):
        return "lossy_straggler"
    bare = [t for t, k in rec.resets if k == "restart_bare" and t < c.end]
    if bare and c.end <= max(c.start, _awake(rec, wk, bare[-1])) + rec.plan.fail_within:
        return "bare_unreachable"
    deaths = [f for f in rec.plan.faults if f.kind == "death" and f.at < c.end
              and f.worker != wk.w]
    if deaths and _members_gone(rec, sim, c.end, dead_only=True) and \
            c.end <= _gone_since(rec, wk, c, _awake(rec, wk, deaths[-1].at),
                                 {f.worker for f in deaths}) + rec.plan.fail_within:
        return "dead_member"
    finished = [x for x in sim.workers
                if x is not wk and x.finished and x.calls[-1].end <= c.end]
    if finished and _members_gone(rec, sim, c.end):
        finish = max(x.calls[-1].end for x in finished)
        gone = {x.w for x in finished} | {f.worker for f in deaths}
        if c.end <= _gone_since(rec, wk, c, _awake(rec, wk, finish), gone) + \
                rec.plan.fail_within:
            return "end_behind"
    # A state lost under the call that the worker never heard of: its packets met the new
    # state's open rounds and were held there without a word (a round no peer comes back to
    # but by a JOIN), so no reply tells it to abort (restart_abort) and its dead timer runs
    # on (seed 9026054: a restart and a re-install; the JOINs that closed the round came
    # after the call had failed).
    if any(c.start < f.at < c.end and c.end <= f.at + f.length + rec.plan.fail_within and
           not any(f.at < t <= c.end for t in wk.answers_heard)
           for f in rec.plan.faults if f.kind in ("restart", "readd")):
        return "restart_unheard"
    return None


def _awake(rec: Record, wk, cause: float) -> float:
    """When the worker could first act on a cause: the end of its latest pause that held its
    dead timer back, else the cause's own time. The dead timer starts with the first packet
    sent after the last reply heard, at most one back-off (rto_max) after the cause; a paused
    worker sends nothing, so a pause under way at the cause (tests/sim/plans/bare_in_pause.json:
    a bare restart 0.26 s into a member's 1.5 s pause), or one that began within that back-off
    while the timer had not started (no packet sent since the last reply heard), starts it at
    the pause's end (seed 9080965: a member's two lost packets parked 0.15 s before a bare
    restart, their timers due rto_max after parking, 0.35 s after the restart, fell in a pause
    begun 0.33 s after it)."""
    ends = [cause]
    for f in rec.plan.faults:
        if f.kind != "pause" or f.worker != wk.w:
            continue
        if f.at <= cause < f.at + f.length or (
                cause < f.at <= cause + rec.plan.rto_max and not _timer_running(wk, f.at)):
            ends.append(f.at + f.length)
    return max(ends)


def _timer_running(wk, t: float) -> bool:
    """Had the worker's dead timer started by t: a packet sent after the last reply it heard
    before t? (Its engine hears NOT_JOINED too, which answers_heard leaves out: read without
    it, the last reply is never later, and the timer is taken as running at least as often.)"""
    last = max((h for h in wk.answers_heard if h < t), default=float("-inf"))
    return any(last < s < t for s, _slot, _chunk in wk.sent)


def _gone_since(rec: Record, wk, c, cause: float, gone: set[int]) -> float:
    """Where a NoReplyError rule's bound starts: the later of the call's start, the cause
    (a death, a finish), the last result the worker heard before the call ended of a
    round a member then gone had joined, and the last CHUNK_MISMATCH it heard then that
    answered a contribution of its. Rounds that counted a member before it went still
    close (once a paused peer comes back), and each result restarts the dead timer; no
    round the gone member had not joined closes, so the results that move it are few. A
    CHUNK_MISMATCH restarts the dead timer too (docs/protocol.md §9, a sign of life): the
    worker joins the open round it names, and its later copies there are dropped without
    a word, so each slot hears one per round joined, and those rounds close only as
    above. A STALE reply to its flight's latest transmission restarts the packet's
    deadline: the flight is sent again at the open round it names, after one RTO's grace,
    and waits there afresh; then it names the open round, so a slot answers one per round
    moved (seeds 1011479 and 1011063 with --hosts drawn: a re-install's async rounds, or a
    swap's, moved a slot on while the flight waited, and the round it was sent again to
    latched sync with members finished). A pause of the worker's begun within that grace,
    before the flight went out again, holds the packet, and its deadline, to the pause's end
    (_resent)."""
    mask = sum(1 << w for w in gone)
    heard = [t for t, bitmap in wk.results_heard if cause < t <= c.end and bitmap & mask]
    heard += [t for t in wk.mismatches_heard if cause < t <= c.end]
    heard += [_resent(rec, wk, t) for t in wk.stales_heard if cause < t <= c.end]
    return max(c.start, cause, *heard)


def _resent(rec: Record, wk, stale: float) -> float:
    """Where the deadline of a flight answered STALE at `stale` starts at the latest: the
    flight is sent again at the open round after one RTO's grace (at most rto_max), so from
    `stale` itself, unless a pause of the worker's began within that grace while it had sent
    nothing since the reply: the grace fell due in the pause and the packet went out at its
    end (seed 9105650: an RTO of 0.40 s, learned from an answer read at the end of a pause,
    due 0.18 s into a pause begun 0.22 s after the STALE reply)."""
    ends = [stale]
    for f in rec.plan.faults:
        if f.kind == "pause" and f.worker == wk.w and \
                stale < f.at <= stale + rec.plan.rto_max and \
                not any(stale < s < f.at for s, _slot, _chunk in wk.sent):
            ends.append(f.at + f.length)
    return max(ends)


def _failure_context(rec: Record, sim: Sim, wk, c) -> str:
    """The faults before worker wk's failed call c and the other members gone by its end (a
    worker whose last call is c has finished by then, but is not gone from its own call)."""
    faults = [f"{f.kind}@{f.at:.3f}" for f in rec.plan.faults
              if f.kind != "swap" and f.at < c.end]
    gone = [x.w for x in sim.workers
            if x.w != wk.w and (x.dead or (x.finished and x.calls[-1].end <= c.end))]
    return f"faults before it: {faults[-3:] or 'none'}; members gone by then: {gone}"


# Calls of a key since the faults stopped after which each of its chunks must have reached a
# round: the first may still carry what the faults displaced.
STARVE_CALLS = 3


def _starved(rec: Record, sim: Sim, wk) -> list[str]:
    """Every chunk reaches a round (docs/protocol.md §10, invariant 6): judged on the calls a
    worker made while every other member was still calling (a member left alone at the
    job's end has no partner for a round). In every mode the job ends in."""
    plan = rec.plan
    settle = max(plan.faults_end, plan.lossy_until) + JOIN_AFTER
    others = [o.calls[-1].end for o in sim.workers if o is not wk and not o.dead and o.calls]
    together = min(others, default=-1.0)
    reached = {chunk for t, chunk in wk.got if t > settle}
    bare = _bare_spans(rec)
    out = []
    for k, n in enumerate(plan.sizes):
        # (and while the live members can close rounds of the modes desired: a partial
        # quorum that counts a dead member never closes, and its calls end by carrying)
        calls = [c for c in wk.calls if c.key == k and settle < c.start and c.end <= together
                 and c.status == "done" and not _members_gone(rec, sim, c.end, c.start,
                                                              dead_only=True)
                 and not any(c.start < until and since < c.end for since, until in bare)]
        if len(calls) < STARVE_CALLS:
            continue
        first = wk.firsts[k]
        starved = [c for c in range(first, first + -(-n // wire.LANES)) if c not in reached]
        latched = [c for c in starved if _latched_with_dead(rec, sim, c)]
        if latched and len(latched) == len(starved):
            rec.excused["limit_dead_latch"] = rec.excused.get("limit_dead_latch", 0) + 1
            continue
        keyed = range(first, first + -(-n // wire.LANES))
        out_of_step = [all(_out_of_step(rec, sim, wk, call, x, keyed) for x in starved)
                       for call in calls]
        if starved and all(out_of_step):
            rec.excused["limit_out_of_step"] = rec.excused.get("limit_out_of_step", 0) + 1
            continue
        if starved and all(_raced(rec, wk, call, x, keyed) for call in calls for x in starved):
            rec.excused["limit_raced"] = rec.excused.get("limit_raced", 0) + 1
            continue
        # A call may meet the other members' round of another key still open (CHUNK_MISMATCH)
        # or, behind a slow switch, closed already (RESEND): the same phase (seed 9014513).
        # Each chunk is read on its own slot, where the phase shows in either form whatever
        # the call's other slots show; and a chunk the call never sent, carried behind a
        # packet on its slot parked on a slow switch's delay (§9 partial liveness), met what
        # that packet's chunk of the key met (seed 9063516).
        # A call may also have been the turn of a staler chunk of the key on the slot, in
        # the order partial sends a slot's chunks (least recently closed first), with the
        # starved chunk carried behind it (seed 10003598); that order gives the starved
        # chunk its turn in a later call, where the phase must show.
        if starved and all(_met_another_key(rec, sim, wk, call, x, keyed) or any(
                _met_another_key(rec, sim, wk, call, y, keyed)
                for y in _carried_behind(rec, wk, call, x, keyed))
                or _turn_of_staler(rec, wk, call, x, keyed)
                for call in calls for x in starved):
            rec.excused["limit_out_of_step"] = rec.excused.get("limit_out_of_step", 0) + 1
            continue
        if starved:
            out.append(f"starvation: worker {wk.w}'s chunk(s) {starved[:4]} of key {k} reached "
                       f"no round in its {len(calls)} calls after {settle:.3f} s (their "
                       "gradient piles up in its residual)")
    return out


def _out_of_step(rec: Record, sim: Sim, wk, call, chunk: int, keyed: range) -> bool:
    """Did `call` meet the members out of step on the slot of `chunk`, a chunk of the key
    (`keyed`) it carried (docs/protocol.md §10, limit "Members out of step on a partial
    slot")? Its contribution of `chunk` was answered CHUNK_MISMATCH by a partial slot whose
    open round was of a chunk of another key (members in calls of different keys), or of a
    chunk of this key that a member in that round sent after a round of another key had
    displaced its own `chunk` earlier in the call it sent it in, every other member in it
    having done the same or joined it displaced, each read in the call it entered that round
    in (seeds 1005345 with --hosts drawn, 9018072, 9019419); or the call started with the
    slot held by a packet of its of another chunk, which a round of an earlier call still
    held (the others had not come to it), so the call carried its chunks there. (Not a chain
    within one key alone: members half a call apart that displace each other's chunk with
    rounds of their own key's chunks are what the fixed order leaves after an abort, seed
    1001019 with --hosts drawn, and a partial call offers such a chunk again once the round
    that displaced it closes, seed 9019721: the worker closes that chain, and a check that
    excused it would hide its return.)"""
    for t, d, o, bitmap, round_, sent in wk.displaced:
        if not (call.start <= t <= call.end or _answered_late(call, sent)) or d != chunk:
            continue
        if o not in keyed:
            return True
        # Each member is read in the call it entered the round in, which may be calls
        # before the one it is in at `t`: a round that waits for members in calls of other
        # keys stays open across their calls (seed 9019419).
        members = [(x, _entered(rec, x, round_, t)) for x in sim.workers
                   if x is not wk and (bitmap >> x.w) & 1]
        displaced = [x for x, e in members if _displaced_before(x, chunk, keyed, e)]
        if displaced and all(x in displaced or _joined(x, round_, e) for x, e in members):
            return True
    slot = rec.plan.slot_base + chunk % rec.plan.slots
    return any(s == slot and c != chunk for s, c in call.held)


def _met_another_key(rec: Record, sim: Sim, wk, call, chunk: int, keyed: range) -> bool:
    """Did `call`'s contribution of `chunk` meet the other members' round of another key on
    its slot, open (_out_of_step, CHUNK_MISMATCH) or, behind a slow switch, closed already
    (_raced's second form, RESEND)?"""
    return _out_of_step(rec, sim, wk, call, chunk, keyed) or \
        _raced(rec, wk, call, chunk, keyed, another_key=True)


def _carried_behind(rec: Record, wk, call, chunk: int, keyed: range) -> list[int]:
    """The chunks of the key (`keyed`) whose fate on the slot of `chunk` was the turn of
    `chunk`, which `call` never sent: behind a slow switch, a partial call's packet on a slot
    meets silence while the switch answers others and is parked (§9 "Sync / partial sending",
    partial liveness), and the call carries what is left on the slot, unsent; a packet parked
    before the switch could have seen it (switch_delay after it left) held the slot on the
    switch's delay alone. Such a packet is the call's own of another chunk of the key, or the
    contribution it joined a round of another key's chunk with after that round displaced
    one (CHUNK_MISMATCH), whose chunk is then read. (Seed 9063516: behind a switch 0.08 s
    slow, a call's chunk 14 was parked 5 ms after it left and chunk 21 carried behind it; the
    answer, a round of another key's chunk, came 0.08 s later; or chunk 14 met that round
    open, and the call's contribution to it was parked so. Not where the packet was parked
    for a round that waits for others: then the members are not read, and a chunk carried
    behind a round it joined met no round of its own - seed 9016450 with its worker bug
    back, whose switch is not slow.)"""
    plan = rec.plan
    slot = plan.slot_base + chunk % plan.slots

    def within(t: float) -> bool:
        return call.start <= t <= call.end

    sent = [(t, s, c) for t, s, c in wk.sent if within(t)]
    if any(c == chunk for _t, _s, c in sent):
        return []
    behind: set[int] = set()
    for t, s, c in wk.parks:
        left = max((u for u, s2, c2 in sent if s2 == s and c2 == c and u <= t), default=None)
        if not within(t) or s != slot or left is None or t - left >= plan.switch_delay:
            continue
        if c in keyed:
            behind.add(c)
        else:
            behind.update(d for u, d, o, _bitmap, round_, _sent in wk.displaced
                          if within(u) and o == c and round_[0] == slot and d in keyed)
    behind.discard(chunk)
    return sorted(behind)


def _turn_of_staler(rec: Record, wk, call, chunk: int, keyed: range) -> bool:
    """Was `call` the turn of a staler chunk of the key (`keyed`) on the slot of `chunk`
    (docs/protocol.md §10, limit "Members out of step on a partial slot", the staleness
    order)? A partial call sends a slot's chunks least recently closed first (§9 "Sync /
    partial sending", bounded staleness): the call sent the key's chunk whose result the
    worker applied longest before the call began, which a round held open for others took
    and the call parked, and carried `chunk`, fresher and never sent, behind it; that chunk
    then reached the round. Its turn gives `chunk` a fresher rival in no later call: once
    the staler chunks have had theirs, `chunk` goes first (seed 10003598: worker 0's chunk 7,
    last closed in round 8, went before chunk 1, last closed in round 13, and chunk 1 then
    met the members out of step in the two calls after)."""
    slot = rec.plan.slot_base + chunk % rec.plan.slots
    later = [c.start for c in wk.calls if c.key == call.key and c.start > call.start]
    until = min(later, default=float("inf"))

    def last_closed(c: int) -> float:
        return max((t for t, g in wk.got if g == c and t < call.start), default=-1.0)

    if any(call.start <= t <= call.end and c == chunk for t, _s, c in wk.sent):
        return False
    return any(call.start <= t <= call.end and s == slot and c in keyed and c != chunk
               and last_closed(c) < last_closed(chunk)
               and any(t < u < until and g == c for u, g in wk.got)
               for t, s, c in wk.parks)


def _answered_late(call, sent: float) -> bool:
    """Was the transmission answered after `call` ended (`sent`: when it was sent) one the
    call sent? A partial call can end with its packet parked in a round before a slow switch
    answers it, and the answer comes in a later call (seed 9044398: a call of a one-chunk key
    ended 5 ms after sending it; the CHUNK_MISMATCH came 0.1 s later, in the next call, of
    another key). A transmission of a later call is judged with that call."""
    return call.start <= sent <= call.end


def _raced(rec: Record, wk, call, chunk: int, keyed: range, another_key: bool = False) -> bool:
    """Did `call` lose a race for a round with its contribution of `chunk` behind a slow
    switch (docs/protocol.md §10, limit "Rounds of one raced on a slow switch")? Answered
    RESEND by a partial round of another chunk that closed without it: of quorum 1 (a member
    out of step closed it alone first), or of a chunk of another key (members in calls of
    other keys met its quorum first; seed 9014497: quorum 2 of 5, the members in three
    groups), and the call carried its chunk. The answer may come after the call ended, to a
    transmission the call sent (_answered_late; seed 9127363: a partial call ended with its
    packet in a round a slow switch answered RESEND in the next call). With `another_key`,
    only the second form."""
    return rec.plan.switch_delay > 0 and any(
        (call.start <= t <= call.end or _answered_late(call, sent)) and d == chunk
        and o != chunk and (o not in keyed or q == 1 and not another_key)
        for t, d, o, q, sent in wk.raced)


def _displaced_before(wk, chunk: int, keyed: range, t: float) -> bool:
    """Was the worker's `chunk` displaced by a round of another key's chunk in its call under
    way at `t`, before `t`?"""
    under_way = [c for c in wk.calls if c.start <= t and (c.end < 0 or t <= c.end)]
    return any(under_way[-1].start <= u <= t and d == chunk and o not in keyed
               for u, d, o, _bitmap, _round, _sent in wk.displaced) if under_way else False


def _joined(wk, round_: tuple[int, int], t: float) -> bool:
    """Did the worker join the round (slot, round) `round_` by a contribution of its of
    another chunk that round displaced, in its call under way at `t`, before `t`? A member
    that opened the round sent its chunk as its own; one that joined it was displaced into
    it, like the member judged."""
    under_way = [c for c in wk.calls if c.start <= t and (c.end < 0 or t <= c.end)]
    return any(under_way[-1].start <= u <= t and r == round_
               for u, _d, _o, _bitmap, r, _sent in wk.displaced) if under_way else False


def _entered(rec: Record, wk, round_: tuple[int, int], t: float) -> float:
    """When the worker entered the round (slot, round) `round_` open at `t`: the moment its
    contribution that round counted was first sent, where the round closed in the switch
    state of `t`; else `t` (the round is still open at the run's end)."""
    state = sum(1 for u, _kind in rec.resets if u <= t)
    sent = [c[5] for c in rec.contribs if c[0] == wk.w and c[3] == (state, *round_)]
    return sent[0][0] if sent and sent[0][1] else t


def _latched_with_dead(rec: Record, sim: Sim, chunk: int) -> bool:
    """Does the slot of `chunk` end the run holding a round of the job that the live members
    cannot close: latched in sync or partial with a quorum that counts a dead member, and
    short of it without that member's bit? A round keeps the mode it latched, so the live
    members' contributions parked in it are never answered and the slot's chunks reach no
    round (docs/protocol.md §10, limit "A partial round latched with a member who then
    died"). Read from the registers of the pipeline (_open_round)."""
    sw, plan = sim.switch, rec.plan
    s = plan.slot_base + chunk % plan.slots
    held = _open_round(sw.pipeline, s, sw.job.epoch) if sw.installed else None
    if held is None or held[0] == wire.Mode.ASYNC:
        return False
    mode, quorum, count, bitmap = held
    dead = {f.worker for f in plan.faults if f.kind == "death"}
    need = plan.workers if quorum == 0 else min(quorum, plan.workers)
    live_missing = sum(1 for w in range(plan.workers) if w not in dead and not bitmap >> w & 1)
    return bool(dead) and count + live_missing < need


def _open_round(pl, s: int, epoch: int) -> tuple[int, int, int, int] | None:
    """(mode, quorum, count, bitmap) of slot s's open round of install `epoch`, or None
    where none is under way: from the reference layout of the registers (the native and
    Python pipelines), or the TNA model's own (TnaModelPipeline.open_round)."""
    if isinstance(pl, TnaModelPipeline):
        return pl.open_round(s, epoch)
    if pl.slot_epoch[s] != epoch or pl.count[s] == 0:
        return None
    return pl.mode[s], pl.quorum[s], pl.count[s], pl.bitmap[s]


def _bare_spans(rec: Record) -> list[tuple[float, float]]:
    """(from, until) of every stretch the switch held no job: from a bare restart to the
    re-install of the next restart or re-add (until the run's end where none follows). No
    round closes then, so a partial call that ends by carrying reaches none."""
    spans, since = [], None
    for f in sorted((f for f in rec.plan.faults if f.kind in ("restart", "readd",
                                                               "restart_bare")),
                    key=lambda f: f.at):
        if f.kind == "restart_bare":
            since = f.at if since is None else since
        elif since is not None:
            spans.append((since, f.at + f.length))
            since = None
    if since is not None:
        spans.append((since, float("inf")))
    return spans


def _members_gone(rec: Record, sim: Sim, t: float, since: float = -1.0,
                  dead_only: bool = False) -> bool:
    """By time t, had so many members finished the job (or died; dead_only: died) that
    rounds of a mode desired at some time in [since, t] could not close? (Sync needs every
    member, partial its quorum; a round latches the mode it opened in and keeps it while it
    waits.)"""
    died = {f.worker for f in rec.plan.faults if f.kind == "death" and f.at <= t}
    left = sum(1 for x in sim.workers if x.w not in died and
               not (x.finished and x.calls[-1].end <= t and not dead_only))
    n = rec.plan.workers
    modes = [(rec.plan.mode, rec.plan.quorum)]
    for at, m, q in rec.modes:
        if at <= since:
            modes = [(m, q)]
        elif at <= t:
            modes.append((m, q))
    return any(mode != wire.Mode.ASYNC and left < (n if quorum == 0 else min(quorum, n))
               for mode, quorum in modes)


def _lossy_straggler(rec: Record, sim: Sim, wk, call) -> bool:
    """Did the call's dead timer start while the network still lost packets, with a live
    member still in an earlier call, or in this one with a contribution lost twice or more
    in a row while the dead timer ran? A sync round waits for every member, and a member
    whose packets the network lost time after time is a straggler: one slower than
    `dead_after` fails its peers' calls, as any straggler that slow does (docs/protocol.md
    §9 Failures, §10 lossy_straggler). Loss makes that a matter of chance (k losses in a
    row), never of a rule."""
    plan = rec.plan
    if call.end - plan.dead_after >= plan.lossy_until or not (plan.up.loss or plan.down.loss):
        return False
    done = {x.w: sum(1 for c in x.calls if c.status == "done" and c.end <= call.end)
            for x in sim.workers if not x.dead}
    if any(n < call.index for w, n in done.items() if w != wk.w):
        return True
    since = max(call.start, call.end - plan.dead_after - plan.fail_within)
    if _answers_lost(rec, call, since, set(done)):
        return True
    if _own_contribution_lost(rec, wk, call, since):
        return True
    # A member of this very call (a first call has no one behind it) whose contribution the
    # network lost time after time: with many members in sync every slot waits, and a silent
    # window sends one probe per silence period (§9 Failures), so k losses in a row hold that
    # member back k probe periods times its window, past dead_after. Only while no peer is
    # more than this call ahead (rounds it left behind are another matter: JOIN's).
    if any(n > call.index + 1 for n in done.values()):
        return False
    return any(since <= t <= call.end and done.get(w, call.index + 1) <= call.index
               for t, w, _slot in rec.loss_streaks)


def _own_contribution_lost(rec: Record, wk, call, since: float) -> bool:
    """Did the network lose a contribution of the call's own twice or more in a row while
    its dead timer ran, on a slot where the call still had a packet in flight when it
    failed? Its silent window sends one probe per silence period to the packet sent longest
    ago (§9 Failures), so k losses in a row hold that packet back k probe periods times its
    window, past its packet deadline, whatever call its peers are in: on a slot in async
    they run ahead without waiting for it (docs/protocol.md §10 lossy_straggler, seed
    9005694 on the Tofino fault model: behind a switch 0.54 s slow, two slots silent, a
    member's chunk lost at its first transmission and at its probe 1.7 s later; the next
    probe came 2.2 s after that, past the packet deadline, its peers several calls ahead)."""
    return any(since <= t <= call.end and w == wk.w and slot in call.waiting
               for t, w, slot in rec.loss_streaks)


def _answers_lost(rec: Record, call, since: float, live: set[int]) -> bool:
    """Did the network lose the answers to one round of a live member's twice or more in a
    row (its RESULT, then the RESEND its retransmission met) while the call's dead timer
    ran, on a slot where the call still had a packet in flight when it failed? That member
    holds the slot's next round back by the silent window's probe periods (§9 Failures),
    whatever call it is in: a member ahead that JOINed a round this call waits in is held
    there as long (docs/protocol.md §10 lossy_straggler, seed 1006182 with --hosts drawn)."""
    return any(since <= t <= call.end and w in live and slot in call.waiting
               for t, w, slot in rec.answer_loss_streaks)


def _uncounted_flights(rec: Record, wk):
    """(chunk, datagram, amount) of every packet in flight the switch has not counted."""
    for slot, data, amount in wk.engine.flights():
        if rec.last_counted.get((wk.w, rec.plan.slot_base + slot)) == data[_CHUNK] + data[H:]:
            continue  # counted: the worker's books already say so
        yield int.from_bytes(data[_CHUNK], "big"), data, amount


def _exactly_once(rec: Record, wk) -> list[str]:
    """The fixed-point books of every element no non-finite value was given at (those
    are _nonfinite_books': a NaN swallows the finite values beside it)."""
    e = wk.engine
    pending: dict[int, np.ndarray] = {}  # chunk -> not counted, out of the residual
    for chunk, _data, amount in _uncounted_flights(rec, wk):
        if amount is None:
            continue
        acc = pending.setdefault(chunk, np.zeros(wire.LANES, np.int64))
        # (a non-finite or out-of-range element - NaN, +-inf, 1e30 - is _nonfinite_books';
        # its lane is skipped below, so it adds 0 here rather than an int64 cast's garbage)
        amount = np.asarray(amount, np.float64) * SCALE
        acc += np.rint(np.where(np.abs(amount) < 2.0 ** 62, amount, 0.0)).astype(np.int64)
    orphaned = _orphaned(rec, wk.w)
    unknown = _unknown_fate(rec, wk)
    out = []
    # the key of the call a member died in: what the call had not sent died with it
    died_in = wk.calls[-1].key if wk.dead and wk.calls and wk.calls[-1].end < 0 else None
    for k, first in zip(wk.keys, wk.firsts, strict=True):
        index = wk.keys.index(k)
        if index == died_in:
            rec.excused["died_with_member"] = rec.excused.get("died_with_member", 0) + 1
            continue
        given = wk.grads[index].copy()
        res = np.asarray(e.residual(k), np.float64) * SCALE
        skip = np.zeros(len(given), bool)
        for key, element in wk.injected:
            if key == index:
                skip[element] = True
        res[skip] = 0.0
        if not np.array_equal(res, np.rint(res)):
            out.append(f"exactly-once: worker {wk.w} key {index}: residual not in fixed point")
            continue
        res = res.astype(np.int64)
        for local in range(len(given) // wire.LANES):
            chunk = first + local
            rows = slice(local * wire.LANES, (local + 1) * wire.LANES)
            counted = rec.counted.get((wk.w, chunk), np.zeros(wire.LANES, np.int64))
            counted = counted - orphaned.get(chunk, 0)
            held = res[rows] + pending.get(chunk, 0)
            diff = np.where(skip[rows], 0, given[rows] - counted - held)
            # (a live worker whose books are off must know it - its replica is flagged - or
            # still have a packet in flight, whose answer is yet to tell it)
            if diff.any() and unknown is not None and (
                    wk.dead or e.needs_resync or e.in_flight) and \
                    (np.abs(diff) <= unknown.get(chunk, 0)).all():
                rec.excused["unknown_fate"] = rec.excused.get("unknown_fate", 0) + 1
                continue
            if diff.any() and unknown is not None and chunk in wk.missettled and \
                    (np.abs(diff) <= unknown.get(chunk, 0) + wk.missettled[chunk]).all():
                rec.excused["limit_relaunch"] = rec.excused.get("limit_relaunch", 0) + 1
                continue
            erased = rec.erased.get((wk.w, chunk))
            if diff.any() and erased is not None and (np.abs(diff) <= erased + (
                    unknown.get(chunk, 0) if unknown is not None else 0)).all():
                rec.excused["limit_stale_copy"] = rec.excused.get("limit_stale_copy", 0) + 1
                continue
            if diff.any():
                j = int(np.flatnonzero(diff)[0])
                out.append(
                    f"exactly-once: worker {wk.w} chunk {chunk} lane {j}: given "
                    f"{given[rows][j]}, switch counted {counted[j]}, residual + in flight "
                    f"{held[j] if np.ndim(held) else held} ({'doubled' if diff[j] < 0 else 'lost'}"
                    f" {abs(int(diff[j]))})")
                break
    return out


def _unknown_fate(rec: Record, wk) -> dict[int, np.ndarray] | None:
    """chunk -> the most worker wk's books may be off by there, per lane, under the rule
    "unknown_fate": the sum of the magnitudes of its contributions whose fate it could not
    know - counted and not acknowledged to it (no RESULT with its bit, no ACK: counted in
    a round that stayed open, that a restart or a re-install wiped, or whose answers it
    never heard) before it dropped what it had in flight (a call aborted, a new switch
    state learned), or sent before a state reset and counted after it (a copy of a packet
    the worker carried in full when it learned of the new state), or counted in a round
    that closed in a switch state a restart or a re-install then wiped, whose result no
    member applied (_orphaned: the worker heard at most an ACK, which says "counted", and
    the result that would have told every replica is gone with the state), or counted
    and then taken for "not counted" at the round of a packet an abort forgot. A
    worker is held to it only where it could not know: it died, a call of its aborted, or
    the switch's state was lost; None for every other worker (its books balance exactly).
    "Before" is the order things happened (Sim.moment), also within one simulated instant."""
    if not (wk.dead or rec.state_resets or
            any(c.status not in ("done", "") for c in wk.calls)):
        return None
    out: dict[int, np.ndarray] = {}
    for w, chunk, lanes, closed, crossed, sent in rec.contribs:
        if w != wk.w:
            continue
        acked = wk.acked.get(closed) if closed is not None else None
        lost_with_state = closed is not None and closed[0] != rec.state_resets and \
            closed not in rec.applied
        if crossed or acked is None or lost_with_state or \
                any(sent < t < acked for t in wk.aborts):
            out[chunk] = out.get(chunk, 0) + np.abs(lanes)
    # A flight sent at the round of a packet of another chunk that the worker's last abort
    # forgot takes an ACK or STALE_COUNTED there for "not counted" (the forgotten packet may
    # hold that record); where the switch had counted the flight itself, its fate was unknown
    # to the worker, and it is carried as well (docs/protocol.md §9, seed 9000006).
    for chunk, lanes in wk.misread_own.items():
        out[chunk] = out.get(chunk, 0) + lanes
    return out


def _orphaned(rec: Record, w: int) -> dict[int, np.ndarray]:
    """chunk -> what worker w's contributions added to rounds that closed in a switch state
    a restart or a re-install then wiped, whose result no member applied: those reached
    no replica, so their owner must still carry them (docs/protocol.md §10, invariant 1)."""
    out: dict[int, np.ndarray] = {}
    for (state, slot, rnd), parts in rec.closed.items():
        if state == rec.state_resets or (state, slot, rnd) in rec.applied:
            continue
        for who, chunk, lanes in parts:
            if who == w:
                out[chunk] = out.get(chunk, 0) + lanes
    return out


def _nonfinite_books(rec: Record, sim: Sim, wk) -> list[str]:
    """Every non-finite element given is delivered (a sentinel counted, or absorbed by the
    round it missed) after it was given, or is still held; never more often than given; and
    no sentinel of this worker's is at an element it was given none at."""
    e = wk.engine
    out = []
    flying: set[tuple[int, int]] = set()  # (chunk, lane): a sentinel in an uncounted packet
    for chunk, data, _amount in _uncounted_flights(rec, wk):
        lanes = np.frombuffer(data, ">i4", wire.LANES, H)
        flying.update((chunk, int(j)) for j in np.flatnonzero(lanes == sim.sentinel))
    given: dict[tuple[int, int], list[float]] = {}  # (chunk, lane) -> times given
    for (key, element), times in wk.injected.items():
        given[(wk.firsts[key] + element // wire.LANES, element % wire.LANES)] = times
    nan_held: set[tuple[int, int]] = set()
    bound = np.float32(sim.bound)
    for k, first in zip(wk.keys, wk.firsts, strict=True):
        res = np.asarray(e.residual(k), np.float32)
        # Held for a sentinel: NaN, an infinity, or a finite value beyond the quantizer's
        # range, which the next contribution of the chunk sends as the sentinel (§9, "Beyond
        # the range is overflow"); compared as the quantizer compares, in float32.
        with np.errstate(over="ignore", invalid="ignore"):
            fixed = res * np.float32(SCALE)
        for i in np.flatnonzero(~((fixed >= -bound) & (fixed <= bound))):
            nan_held.add((first + int(i) // wire.LANES, int(i) % wire.LANES))
    cells = {(c, j) for (w, c, j) in rec.sentinels if w == wk.w}
    for cell in sorted(cells | set(given) | nan_held | flying | set(wk.absorbed)):
        times = given.get(cell, [])
        delivered = rec.sentinels.get((wk.w, *cell), []) + wk.absorbed.get(cell, [])
        held = (cell in nan_held) + (cell in flying)
        chunk, lane = cell
        where = f"non-finite: worker {wk.w} chunk {chunk} lane {lane}"
        if not times:
            out.append(f"{where}: sent as a sentinel, held or absorbed ({len(delivered)} "
                       f"delivered, {held} held) where no non-finite value was given")
        elif len(delivered) + held > len(times):
            out.append(f"{where}: given non-finite {len(times)} times, delivered "
                       f"{len(delivered)} times (sentinels counted or absorbed) and {held} "
                       "still held: carried more than once")
        elif not held and not any(t >= times[-1] for t in delivered):
            out.append(f"{where}: given non-finite at {times[-1]:.6f} s, never delivered "
                       f"after (deliveries at {[round(t, 6) for t in delivered]}) and not "
                       "held: lost")
        if out:
            break
    return out


def _nonfinite_seen(rec: Record, sim: Sim, wk) -> list[str]:
    """A sentinel absorbed follows a round non-finite there, applied by the worker. Every
    result a worker applied with a non-finite lane shows in its output: in the
    first call of the chunk's key that ended at or after it was applied (a result lands in
    the call under way, or is buffered for the key's next one), or, after the key's last
    call, in what the engine still holds for it; and nothing else in an output is
    non-finite."""
    for (chunk, lane), times in sorted(wk.absorbed.items()):
        # absorbed only by a round non-finite there that the worker applied already
        first = min((t for t, c, lanes in wk.applied_nonfinite if c == chunk and lane in lanes),
                    default=None)
        if first is None or first > times[0]:
            return [f"non-finite: worker {wk.w} absorbed its sentinel at chunk {chunk} lane "
                    f"{lane} at {times[0]:.6f} s, before it applied any round non-finite there"]
    want: dict[int, set[int]] = {}  # call index -> elements of its output that must be NaN
    late: dict[int, set[int]] = {}  # key -> elements of its buffered output that must be NaN
    ends = {}  # key -> [(end, call index)]
    for index, key, end, _bad in wk.outputs:
        ends.setdefault(key, []).append((end, index))
    for t, chunk, lanes in wk.applied_nonfinite:
        key = next(i for i, first in reversed(list(enumerate(wk.firsts))) if chunk >= first)
        elements = {(chunk - wk.firsts[key]) * wire.LANES + j for j in lanes}
        elements = {x for x in elements if x < rec.plan.sizes[key]}
        call = next((i for end, i in ends.get(key, []) if end >= t), None)
        (want.setdefault(call, set()) if call is not None
         else late.setdefault(key, set())).update(elements)
    for index, key, _end, bad in wk.outputs:
        expected = want.get(index, set())
        if set(bad) != expected:
            extra, missing = sorted(set(bad) - expected), sorted(expected - set(bad))
            return [f"non-finite: worker {wk.w} call {index} (key {key}): output elements "
                    f"{missing[:4]} are finite though a non-finite result was applied there"
                    if missing else
                    f"non-finite: worker {wk.w} call {index} (key {key}): output elements "
                    f"{extra[:4]} are non-finite though no result applied there was"]
    for key, elements in late.items():
        held = np.empty(rec.plan.sizes[key], np.float32)
        wk.engine.take(wk.keys[key], held)
        missing = sorted(x for x in elements if np.isfinite(held[x]))
        if missing:
            return [f"non-finite: worker {wk.w} key {key}: elements {missing[:4]} of a "
                    "non-finite result applied after its last call are finite in what the "
                    "engine holds for it"]
    return []


def _agreement(rec: Record, wk) -> list[str]:
    """RULE A in every switch state: rounds are numbered afresh after a restart or a
    re-install, so a round is (switch state, slot, round)."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    states = range(rec.state_resets + 1)
    for state, head in wk.results:
        (_v, _op, _fl, _mode, _job, _w, count, slot, _r, _q, rnd, chunk,
         bitmap) = wire.HEADER_STRUCT.unpack_from(head)
        if state is None:  # applied outside a datagram: from any state
            state = next((s for s in states if (s, slot, rnd, chunk, count, bitmap)
                          in rec.emitted), -1)
        if (state, slot, rnd) in seen:
            out.append(f"agreement: worker {wk.w} applied slot {slot} round {rnd} (switch "
                       f"state {state}) twice")
        seen.add((state, slot, rnd))
        if (state, slot, rnd, chunk, count, bitmap) not in rec.emitted:
            out.append(f"agreement: worker {wk.w} applied slot {slot} round {rnd} chunk "
                       f"{chunk} count {count} bitmap {bitmap:#x}, which switch state "
                       f"{state} never closed")
    return out
