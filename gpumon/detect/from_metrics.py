"""From exported metrics back to the one run summary: how `gpumon report` judges a job.

`gpumon serve` exports, per GPU, what its detector keeps: time per state, the current
cause and straggler mark, utilisation.  Read back over a job's time (from Prometheus),
those give the same tallies the detector sums (``Tally``, ``GpuFacts``), so ``summarize``
words a job on many nodes exactly as ``gpumon analyze`` words one trace.

One rule no node can apply alone lives here too: a straggler *node*.  Each node's
detector sees only its own GPUs; when every GPU of one node of a job is starved or idle
while the GPUs of its other nodes busy-wait, the others are waiting on that node.

Pure: readings in, summaries out; no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpumon.detect.advice import advice_for, names_no_rank, straggler_node_advice
from gpumon.detect.summary import WORK, AdviceWeights, GpuFacts, RunSummary, Tally, summarize
from gpumon.model import Advice, Cause, Evidence, Reason, State

# A straggler node: the job's other nodes spend at least this share of their working time
# stalled on peers ...
PEER_WAIT_SHARE = 0.5
# ... every GPU of the straggler spends at least this share of its time starved or idle ...
SLOW_SHARE = 0.5
# ... and the peers wait this much more of their working time than it does (the same
# threshold as the GpumonJobStragglerNode alert of gpumon-rules.yml).
MIN_SKEW = 0.3

STRAGGLER_NOTE = "its peers busy-wait on it"
HANG_NOTE = "hang: no GPU of its node computed"
# Peers that hung at least this share of their stall time hang on a node (the gauges say
# hang only once the detector's threshold has passed: the spinning before it reads as a
# plain busy-wait, so a real hang shows as a half or less of the stall).
HUNG_SHARE = 0.25
_CLASSIFIED = (State.HEALTHY, State.STARVED, State.SYNC_STALL, State.IDLE)


@dataclass(frozen=True, slots=True)
class GpuReadings:
    """One GPU of a job over the report's window, as the exported series tell it.

    Shares are of the scrapes in the window; ``util_by_state`` is the mean over the window
    of the utilisation counted only while the GPU was in that state (so the values sum to
    the mean utilisation), and ``state_share`` the share of scrapes in each state.  Absent
    readings are None or missing keys, never 0.

    ``seconds`` come from the detector's counters, whose episodes are backdated to their
    onset; the gauges say the state as it was known at each scrape, seconds later.  So the
    busy time in a state is the mean utilisation *while the gauges said that state* times
    the counters' seconds in it: over a short job the detection delay would otherwise
    count a healthy GPU's first seconds of work as start-up.
    """

    instance: str
    gpu: int
    uuid: str
    seconds: Mapping[State, float]
    cause_samples: Mapping[Cause, float] = field(default_factory=dict)
    straggler_share: float | None = None
    hang_share: float | None = None  # share of scrapes whose reason was hang (no progress)
    lost_share: float | None = None
    util_by_state: Mapping[State, float] | None = None
    state_share: Mapping[State, float] | None = None
    duty: float | None = None
    samples: int = 0
    evidence: Evidence = field(default_factory=lambda: Evidence())

    @property
    def covered_s(self) -> float:
        return sum(self.seconds.values())

    def util_seconds(self) -> dict[State, float] | None:
        """Busy seconds per state (utilisation x time), or None without utilisation."""
        cov = self.covered_s
        by, share = self.util_by_state, self.state_share
        if by is None:
            if self.duty is None:
                return None
            # No per-state split: spread the mean over the states, as a flat duty would.
            return {s: self.duty * self.seconds.get(s, 0.0) for s in State}
        if share is None:
            return {s: max(0.0, by.get(s, 0.0)) * cov for s in State}
        out = {}
        for s in State:
            secs = self.seconds.get(s, 0.0)
            if share.get(s, 0.0) > 0:
                out[s] = min(1.0, max(0.0, by.get(s, 0.0) / share[s])) * secs
            else:  # counted only by backdating: the mean utilisation stands for it
                out[s] = (self.duty or 0.0) * secs
        return out

    def straggler_s(self) -> float:
        """Its time as the straggler (within its sync stall time)."""
        stall = self.seconds.get(State.SYNC_STALL, 0.0)
        return min(stall, max(0.0, self.straggler_share or 0.0) * self.covered_s)

    def hang_s(self) -> float:
        """Its time hung: spinning with every peer of its node, none computing (within
        its sync stall time)."""
        stall = self.seconds.get(State.SYNC_STALL, 0.0)
        return min(stall, max(0.0, self.hang_share or 0.0) * self.covered_s)


@dataclass(frozen=True, slots=True)
class GpuJudged:
    """One GPU's readings with what they add up to."""

    readings: GpuReadings
    facts: GpuFacts
    lost_gpu_seconds: float  # idle or busy-waiting while the job held it
    advice: tuple[Advice, ...]  # for its own verdict


def tally_of(r: GpuReadings) -> Tally:
    """The detector's tally of one GPU, rebuilt from its readings."""
    t = Tally()
    for s in State:
        t.seconds[s] = max(0.0, r.seconds.get(s, 0.0))
    starved = t.seconds[State.STARVED]
    if starved > 0:
        total = sum(v for v in r.cause_samples.values() if v > 0)
        if total > 0:
            for c, v in r.cause_samples.items():
                if v > 0:
                    t.starved_by_cause[c] = starved * v / total
        else:
            t.starved_by_cause[Cause.UNKNOWN] = starved
    strag = r.straggler_s()
    if strag > 0:
        t.reasons[(State.SYNC_STALL, Reason.STRAGGLER)] = [strag, strag, STRAGGLER_NOTE]
    hung = r.hang_s()
    if hung > 0:
        t.reasons[(State.SYNC_STALL, Reason.HANG)] = [hung, hung, HANG_NOTE]
    unknown = t.seconds[State.UNKNOWN]
    lost = min(unknown, max(0.0, r.lost_share or 0.0) * r.covered_s)
    if lost > 0:
        t.reasons[(State.UNKNOWN, Reason.GPU_LOST)] = [lost, lost, "GPU lost"]
    return t


def judge_gpu(r: GpuReadings, index: int) -> GpuJudged:
    """``index`` is the GPU's place in the summary (indices repeat across nodes)."""
    tally = tally_of(r)
    busy = r.util_seconds()
    cov = r.covered_s
    stall = tally.seconds[State.SYNC_STALL]
    strag_frac = min(1.0, r.straggler_s() / stall) if stall > 0 else 0.0
    if busy is None:
        busy_s = work_busy = lost = 0.0
        duty_cov = 0.0
    else:
        busy_s = sum(busy.values())
        # Busy-waiting is not work: only a straggler's own stall time computes.
        waiting_busy = (1.0 - strag_frac) * busy[State.SYNC_STALL]
        work_busy = busy[State.HEALTHY] + busy[State.STARVED] + strag_frac * busy[State.SYNC_STALL]
        # As the detector counts it: the time off the bus is not waiting.
        lost = sum(max(0.0, tally.seconds[s] - busy[s]) for s in State if s is not State.UNKNOWN)
        lost += waiting_busy
        duty_cov = cov
    work_cov = sum(tally.seconds[s] for s in WORK)
    facts = GpuFacts(
        gpu=index,
        uuid=r.uuid,
        tally=tally,
        samples=r.samples,
        covered_s=duty_cov,
        busy_s=busy_s,
        work_covered_s=work_cov if busy is not None else 0.0,
        work_busy_s=work_busy,
        lost_gpu_seconds=lost,
    )
    state, cause = tally.verdict()
    ev = Evidence(**r.evidence)
    if busy is not None and cov > 0:
        ev.setdefault("duty_cycle", round(busy_s / cov, 4))
    reason = _main_reason(tally, state)
    advice = (
        advice_for(state, cause, ev, reason, host_seen=True) if state is not State.HEALTHY else ()
    )
    return GpuJudged(r, facts, round(lost, 1), advice)


def _main_reason(tally: Tally, state: State) -> Reason | None:
    if state is State.SYNC_STALL:
        strag = tally.reason_s(State.SYNC_STALL, Reason.STRAGGLER)
        return Reason.STRAGGLER if strag >= 0.5 * tally.seconds[State.SYNC_STALL] else None
    main = tally.main_reason(state)
    return main[0] if main else None


def merge(tallies: Iterable[Tally]) -> Tally:
    """GPU-seconds summed: a node's or a job's tally from its GPUs'."""
    out = Tally()
    for t in tallies:
        for s, v in t.seconds.items():
            out.seconds[s] += v
        for c, v in t.starved_by_cause.items():
            out.starved_by_cause[c] = out.starved_by_cause.get(c, 0.0) + v
        for key, (secs, longest, note) in t.reasons.items():
            row = out.reasons.setdefault(key, [0.0, -1.0, None])
            row[0] += secs
            if longest > row[1]:
                row[1], row[2] = longest, note
        out.startup_s += t.startup_s
        out.episodes += t.episodes
    return out


# --- across nodes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Straggler:
    """What the job waits on: a whole node, or one GPU (``gpu`` set)."""

    instance: str
    gpu: int | None
    skew: float  # how much more of their working time its peers wait than it does (0-1)
    peers_wait: float  # the peers' share of working time stalled (the least-waiting peer's)
    own_wait: float
    state: State  # what it did meanwhile (starved, idle; sync_stall for a GPU straggler)
    cause: Cause | None
    # The other nodes hang on it (spinning, none computing): it is what the job waits on,
    # whatever it does (idle, computing alone, or unreadable).
    hung_peers: bool = False

    @property
    def kind(self) -> str:
        return "node" if self.gpu is None else "gpu"

    def name(self) -> str:
        return f"node {self.instance}" if self.gpu is None else f"GPU {self.gpu} of {self.instance}"


def _share(t: Tally, states: Sequence[State], of: Sequence[State]) -> float:
    den = sum(t.seconds.get(s, 0.0) for s in of)
    return 0.0 if den <= 0 else sum(t.seconds.get(s, 0.0) for s in states) / den


def straggler_node(nodes: Mapping[str, Sequence[Tally]]) -> Straggler | None:
    """The node a multi-node job waits on, if one does.

    ``nodes``: each node's (``instance``) GPU tallies for the job.  A straggler node is
    the one whose GPUs wait least, when every one of its GPUs spends most of its time
    starved or idle, while the GPUs of every other node spend most of their working time
    stalled on peers (busy-waiting), at least ``MIN_SKEW`` more than it does.
    """
    merged = {n: merge(ts) for n, ts in nodes.items() if ts}
    if len(merged) < 2:
        return None
    wait = {n: _share(t, (State.SYNC_STALL,), WORK) for n, t in merged.items()}
    cand = min(wait, key=lambda n: (wait[n], n))
    peers = [n for n in merged if n != cand]
    peers_wait = min(wait[n] for n in peers)
    if peers_wait < PEER_WAIT_SHARE or peers_wait - wait[cand] < MIN_SKEW:
        return None
    t = merged[cand]
    # Peers that hang (every GPU spinning, none computing) wait on whatever this node does:
    # idle, gone, or computing alone in another phase.  Peers that only busy-wait wait on a
    # slower node: it must be slow (starved or idle) to be the one.
    hung = all(_hang_share(merged[n]) >= HUNG_SHARE for n in peers)
    slow = (State.STARVED, State.IDLE)
    if not hung and any(_share(g, slow, _CLASSIFIED) < SLOW_SHARE for g in nodes[cand]):
        return None
    if hung:
        state, cause = t.verdict()
    else:
        state = State.STARVED if t.seconds[State.STARVED] >= t.seconds[State.IDLE] else State.IDLE
        cause = None
        if state is State.STARVED:
            causes = t.starved_by_cause
            cause = max(causes, key=causes.__getitem__, default=Cause.UNKNOWN)
    return Straggler(
        cand,
        None,
        round(peers_wait - wait[cand], 4),
        round(peers_wait, 4),
        round(wait[cand], 4),
        state,
        cause,
        hung,
    )


def _hang_share(t: Tally) -> float:
    """Of a node's sync stall time, the share it hung (no GPU of it computing)."""
    stall = t.seconds.get(State.SYNC_STALL, 0.0)
    return 0.0 if stall <= 0 else t.reason_s(State.SYNC_STALL, Reason.HANG) / stall


def as_waited_on(t: Tally) -> Tally:
    """A straggler node's tally in the job's view: its starved time is what its peers
    wait on (a sync stall, reason straggler), as the detector re-judges a straggler GPU."""
    out = t.copy()
    starved = out.seconds[State.STARVED]
    if starved <= 0:
        return out
    out.seconds[State.STARVED] = 0.0
    out.seconds[State.SYNC_STALL] += starved
    out.starved_by_cause = {}
    row = out.reasons.setdefault((State.SYNC_STALL, Reason.STRAGGLER), [0.0, -1.0, None])
    row[0] += starved
    if starved > row[1]:
        row[1], row[2] = starved, STRAGGLER_NOTE
    return out


def straggler_gpu(gpus: Sequence[GpuJudged]) -> Straggler | None:
    """The GPU the others wait on, where a node's detector named one (the straggler mark)."""
    best, most = None, 0.0
    for g in gpus:
        s = g.facts.tally.reason_s(State.SYNC_STALL, Reason.STRAGGLER)
        if s > most:
            best, most = g, s
    if best is None:
        return None
    own_t = best.facts.tally.copy()
    own_t.seconds[State.SYNC_STALL] -= most
    own = _share(own_t, (State.SYNC_STALL,), WORK)
    others = [_share(g.facts.tally, (State.SYNC_STALL,), WORK) for g in gpus if g is not best]
    peers = min(others) if others else 0.0
    r = best.readings
    return Straggler(
        r.instance,
        r.gpu,
        round(max(0.0, peers - own), 4),
        round(peers, 4),
        round(own, 4),
        State.SYNC_STALL,
        None,
    )


# --- the job --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeJudged:
    instance: str
    summary: RunSummary
    gpus: tuple[GpuJudged, ...]
    lost_gpu_seconds: float


@dataclass(frozen=True, slots=True)
class JobJudged:
    """A job across its nodes: the one run summary, each node's and each GPU's."""

    summary: RunSummary
    nodes: tuple[NodeJudged, ...]
    straggler: Straggler | None
    problem_nodes: tuple[str, ...]  # the nodes whose own verdict is the job's problem


def _advice_weights(gpus: Iterable[GpuJudged]) -> AdviceWeights:
    """Each GPU's advice for each problem it had, weighted by the time it had it."""
    w = AdviceWeights()
    for g in gpus:
        t, ev = g.facts.tally, Evidence(**g.readings.evidence)
        duty = g.facts.busy_s / g.facts.covered_s if g.facts.covered_s > 0 else None
        if duty is not None:
            ev.setdefault("duty_cycle", round(duty, 4))
        starved = t.seconds[State.STARVED]
        if starved > 0:
            c = max(t.starved_by_cause, key=t.starved_by_cause.__getitem__, default=Cause.UNKNOWN)
            _weigh(w, State.STARVED, c, advice_for(State.STARVED, c, ev, None, True), starved)
        stall = t.seconds[State.SYNC_STALL]
        if stall > 0:
            reason = _main_reason(t, State.SYNC_STALL)
            _weigh(
                w,
                State.SYNC_STALL,
                None,
                advice_for(State.SYNC_STALL, None, ev, reason, True),
                stall,
            )
        idle = t.seconds[State.IDLE]
        if idle > 0:
            _weigh(
                w,
                State.IDLE,
                None,
                advice_for(State.IDLE, None, ev, Reason.MEMORY_HELD, True),
                idle,
            )
    return w


def _weigh(
    w: AdviceWeights, s: State, c: Cause | None, advice: Iterable[Advice], secs: float
) -> None:
    row = w.weights.setdefault((s, c), {})
    for a in advice:
        row[a] = row.get(a, 0.0) + secs


def _straggler_advice(
    s: Straggler, peers: Sequence[str], node_advice: Sequence[Advice]
) -> list[Advice]:
    what = s.state.value + (f" (cause: {s.cause.value})" if s.cause is not None else "")
    node = straggler_node_advice(s.instance, what, ", ".join(peers), s.hung_peers)
    if s.hung_peers:
        return [node]
    return [node, *(a for a in node_advice if a != node)]


def _summarize(
    tallies: Sequence[Tally], facts: list[GpuFacts], advice: AdviceWeights, lost: float
) -> RunSummary:
    return summarize(merge(tallies), facts, advice, lost, True, None)


def judge_job(readings: Sequence[GpuReadings]) -> JobJudged:
    """The job's summary, each node's and each GPU's, from its GPUs' readings."""
    ordered = sorted(readings, key=lambda r: (r.instance, r.gpu))
    judged = [judge_gpu(r, i) for i, r in enumerate(ordered)]
    by_node: dict[str, list[GpuJudged]] = {}
    for g in judged:
        by_node.setdefault(g.readings.instance, []).append(g)
    nodes = []
    for inst, gs in by_node.items():
        local = [_reindexed(g.facts, g.readings.gpu) for g in gs]
        lost = round(sum(g.lost_gpu_seconds for g in gs), 1)
        summ = _summarize([g.facts.tally for g in gs], local, _advice_weights(gs), lost)
        nodes.append(NodeJudged(inst, summ, tuple(gs), lost))
    strag = straggler_node({n: [g.facts.tally for g in gs] for n, gs in by_node.items()})
    tallies = [g.facts.tally for g in judged]
    facts = [g.facts for g in judged]
    advice = _advice_weights(judged)
    if strag is not None:
        tallies = [
            as_waited_on(t) if g.readings.instance == strag.instance else t
            for g, t in zip(judged, tallies, strict=True)
        ]
        node = next(n for n in nodes if n.instance == strag.instance)
        peers = [n for n in by_node if n != strag.instance]
        row = advice.weights.setdefault((State.SYNC_STALL, None), {})
        # The peers' straggler they cannot name (or "the rank is elsewhere", for a hang)
        # says less than what the node rule knows.
        for a in [a for a in row if names_no_rank(a)]:
            del row[a]
        # The straggler node's advice comes first, in its own order: what to fix.
        top = 2.0 * sum(row.values()) + len(row) + 1.0
        texts = _straggler_advice(strag, peers, node.summary.advice)
        for k, a in enumerate(texts):
            row[a] = top - k
    lost = round(sum(g.lost_gpu_seconds for g in judged), 1)
    summ = _summarize(tallies, facts, advice, lost)
    if strag is None and summ.verdict is State.SYNC_STALL:
        strag = straggler_gpu(judged)
    problem: tuple[str, ...] = ()
    if summ.verdict in (State.STARVED, State.SYNC_STALL, State.IDLE):
        problem = tuple(n.instance for n in nodes if n.summary.verdict is summ.verdict)
        if strag is not None and strag.gpu is None:
            problem = (strag.instance,)
    return JobJudged(summ, tuple(nodes), strag, problem)


def _reindexed(f: GpuFacts, gpu: int) -> GpuFacts:
    """Within one node the GPU's own index names it."""
    return replace(f, gpu=gpu)
