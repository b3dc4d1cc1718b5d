"""What the job's Python processes do while its GPUs wait, read from their stacks.

Pure: stack samples in (``model.StackSample``, read by ``sample/stacks.py``), activities
out.  Every rule names frames a person could point at in a flame graph -- a module, a
function, or, for a call into C that no Python frame shows, the innermost line's source
(``pickle.dump(state, f)``) -- never a guess from timing.

A sample is classified in two steps:

The source line counts only for the job's own code: inside a library the frames say more
(multiprocessing's queue reads its pipe with ``read(handle, n)``, and that is a queue wait).

1. Phases, anywhere in the stack: a frame that writes a checkpoint (``torch.save``,
   ``save_pretrained``, safetensors, ``pickle.dump``, a function named to save a
   checkpoint) makes the sample a checkpoint; else a frame of an evaluation loop (a
   function named evaluate/validation/val_step ...) makes it evaluation.  A phase says why
   the training loop is not stepping, whatever it waits on inside.
2. Else the innermost frame a rule knows decides: a collective (``all_reduce``,
   ``barrier`` ...), the host waiting on the GPU (``synchronize``, ``.item()``), reading
   files, decoding and augmentation (PIL, cv2, torchvision transforms, numpy, a function
   named to decode or augment), a DataLoader
   or queue wait (waiting on the loader in a main process; idle in a worker, which waits
   for work), the dataset's own code in a DataLoader fetch (decoding).  Nothing known:
   Python work of the step.

A forked process's frames outside multiprocessing's ``_bootstrap`` are its parent's (the
stack at the fork): they are dropped first.

Samples are weighted by how much of their time the GPUs spent waiting (``tick``), as the
host readings are: shares are "during the gaps", so a 3 s checkpoint every 30 s is what
the pauses were spent on, not 10 % of everything.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gpumon.detect.config import DetectorConfig
from gpumon.detect.rules import Candidate
from gpumon.model import (
    Cause,
    Evidence,
    ProcessRole,
    Reason,
    StackFrame,
    StackSample,
    State,
)


class Activity(StrEnum):
    """What a process was doing, by its stack."""

    LOADER_WAIT = "loader_wait"  # a main process waiting on its DataLoader / a queue
    DECODE = "decode"  # decoding and augmentation (PIL, cv2, transforms, numpy)
    READ = "read"  # reading files
    CHECKPOINT = "checkpoint"  # writing a checkpoint
    EVALUATION = "evaluation"  # an evaluation / validation loop
    COLLECTIVE = "collective"  # all_reduce, barrier, broadcast, ...
    GPU_WAIT = "gpu_wait"  # the host waiting on the GPU (.item(), synchronize)
    STEP = "step"  # Python work in the training step (nothing more specific)
    IDLE = "idle"  # a worker waiting for work, or sleeping


# --- frame rules ----------------------------------------------------------------------------

_COLLECTIVES = frozenset(
    {
        "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
        "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
        "barrier", "monitored_barrier", "reduce", "scatter", "gather", "gather_object",
        "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv",
        "batch_isend_irecv", "_all_gather_base", "_reduce_scatter_base",
        "allreduce", "allgather", "broadcast_parameters",
    }
)  # fmt: skip
_DISTRIBUTED = ("torch/distributed/", "deepspeed/comm/", "horovod/", "mpi4py/")
_DECODERS = (
    "PIL/", "cv2/", "torchvision/transforms/", "torchvision/io/", "torchvision/datasets/",
    "albumentations/", "numpy/", "imageio/", "skimage/", "torchaudio/", "librosa/",
    "soundfile.py", "decord/", "av/", "turbojpeg.py", "simplejpeg/", "timm/data/",
    "monai/transforms/", "scipy/ndimage/",
)  # fmt: skip
_READERS = (
    "h5py/", "zipfile", "tarfile.py", "pyarrow/", "pandas/io/", "webdataset/", "fsspec/",
    "s3fs/", "gcsfs/", "botocore/", "urllib3/", "lmdb/", "datasets/arrow_reader.py",
)  # fmt: skip
_READ_FUNCS = {
    "pathlib.py": frozenset({"read_bytes", "read_text"}),
    "torch/serialization.py": frozenset({"load", "_load", "_legacy_load"}),
    "numpy/lib/format.py": frozenset({"read_array"}),
    "numpy/lib/npyio.py": frozenset({"load", "loadtxt", "fromfile"}),
    "numpy/lib/_npyio_impl.py": frozenset({"load", "loadtxt", "fromfile"}),
}
_SAVES = frozenset({"save_pretrained", "save_model", "save_state", "save_checkpoint"})
_QUEUE_FILES = ("multiprocessing/queues.py", "queue.py", "multiprocessing/connection.py")
_QUEUE_FUNCS = frozenset(
    {"get", "put", "poll", "_poll", "wait", "recv", "recv_bytes", "_recv_bytes", "_recv"}
)
_EVAL_WORDS = frozenset({"eval", "evaluate", "evaluation", "validate", "validation", "val"})
_DECODE_WORDS = frozenset({"decode", "augment", "augmentation", "transform", "transforms"})
_SAVE_WORDS = frozenset({"save", "write", "dump", "store"})
_CKPT_WORDS = frozenset({"checkpoint", "ckpt", "checkpoints"})

# A call into C shows only as the line that made it (innermost frame's source).
_CODE_CHECKPOINT = re.compile(
    r"\b(?:pickle|torch|joblib|dill|cloudpickle)\.(?:dump|save)\s*\(|\.save_pretrained\s*\(|"
    r"\bsave_file\s*\("
)
_CODE_GPU_WAIT = re.compile(r"\.(?:item|cpu|tolist)\(\s*\)|\bsynchronize\s*\(")
_CODE_READ = re.compile(
    r"\b(?:open|read|readinto|readline|readlines|read_bytes|read_text|fromfile|pread|"
    r"load|imread)\s*\("
)
_CODE_WRITE_OPEN = re.compile(r"""open\(.*['"](?:w|a|x)b?\+?['"]""")
_CODE_DECODE = re.compile(r"\b(?:cv2|np|numpy|Image|PIL|torchvision)\.\w+|\b\w*decode\w*\s*\(")
_CODE_SLEEP = re.compile(r"\bsleep\s*\(")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _func(frame: StackFrame) -> str:
    """The function's own name: ``Queue.get`` -> ``get``."""
    return frame.name.rsplit(".", 1)[-1]


def _words(frame: StackFrame) -> set[str]:
    """The words of the function's qualified name, lower case (``validation_step``,
    ``runEvaluation`` -> {validation, step}, {run, evaluation})."""
    out: set[str] = set()
    for part in frame.name.split("."):
        if part.startswith("<"):
            continue
        for w in _CAMEL.sub("_", part).lower().split("_"):
            if w:
                out.add(w)
    return out


def is_checkpoint(frame: StackFrame, innermost: bool = False) -> bool:
    """A frame that writes a checkpoint: torch.save, save_pretrained / save_model /
    save_state, safetensors' save, torch.distributed.checkpoint's save, the pure-Python
    pickler's dump, a function named to save or write a checkpoint (``save_ckpt``) --
    or, innermost, a line calling one of them in C (``pickle.dump(state, f)``)."""
    f, func = frame.file, _func(frame)
    if f == "torch/serialization.py" and func in ("save", "_save", "_legacy_save"):
        return True
    if func in _SAVES or func.startswith("_save_checkpoint"):
        return True
    if f.startswith("safetensors/") and func.startswith("save"):
        return True
    if f.startswith("torch/distributed/checkpoint/") and "save" in func:
        return True
    if f == "pickle.py" and func in ("dump", "_dump"):
        return True
    words = _words(frame)
    if words & _SAVE_WORDS and words & _CKPT_WORDS:
        return True
    code = frame.code if innermost and not frame.library else None
    return code is not None and bool(_CODE_CHECKPOINT.search(code))


def is_evaluation(frame: StackFrame) -> bool:
    """A frame of an evaluation loop: a function named to evaluate or validate
    (``evaluate``, ``validation_step``, ``run_eval``), not ``nn.Module.eval``, which only
    switches a mode."""
    if frame.file.startswith("torch/nn/modules/") or frame.file == "ast.py":
        return False
    return bool(_words(frame) & _EVAL_WORDS)


def _leaf(frame: StackFrame, innermost: bool) -> Activity | str | None:
    """The activity this frame names when it is the innermost known one; ``"queue"`` for a
    queue wait and ``"fetch"`` / ``"worker"`` / ``"loader"`` for DataLoader frames (whose
    meaning depends on the process)."""
    f, func = frame.file, _func(frame)
    code = frame.code if innermost and not frame.library else None
    if code is not None:
        if _CODE_GPU_WAIT.search(code):
            return Activity.GPU_WAIT
        if _CODE_READ.search(code) and not _CODE_WRITE_OPEN.search(code):
            return Activity.READ
        if _CODE_DECODE.search(code):
            return Activity.DECODE
        if _CODE_SLEEP.search(code):
            return Activity.IDLE
    if func in _COLLECTIVES and f.startswith(_DISTRIBUTED):
        return Activity.COLLECTIVE
    if f.startswith("torch/cuda/") and func in ("synchronize", "wait", "query"):
        return Activity.GPU_WAIT
    if f.startswith(_READERS) or func in _READ_FUNCS.get(f, ()):
        return Activity.READ
    if f.startswith(_DECODERS) or (not frame.library and _words(frame) & _DECODE_WORDS):
        return Activity.DECODE
    if f.startswith(_QUEUE_FILES) and func in _QUEUE_FUNCS:
        return "queue"
    if f == "torch/utils/data/_utils/fetch.py" or f == "torch/utils/data/_utils/collate.py":
        return "fetch"
    if f == "torch/utils/data/_utils/worker.py":
        return "worker"
    if f == "torch/utils/data/dataloader.py":
        return "loader"
    return None


def own_frames(frames: Sequence[StackFrame]) -> Sequence[StackFrame]:
    """The process's own frames: a forked process's stack continues, outside
    multiprocessing's ``_bootstrap``, with its parent's at the fork."""
    for i, fr in enumerate(frames):
        if fr.file == "multiprocessing/process.py" and _func(fr) == "_bootstrap":
            return frames[:i]
    return frames


def decide(frames: Sequence[StackFrame], role: ProcessRole) -> tuple[Activity, int | None]:
    """The activity of one stack (innermost frame first) of a process in ``role``, and
    the index (in the process's own frames) of the frame that decided it."""
    frames = own_frames(frames)
    for i, fr in enumerate(frames):
        if is_checkpoint(fr, innermost=i == 0):
            return Activity.CHECKPOINT, i
    for i, fr in enumerate(frames):
        if is_evaluation(fr):
            return Activity.EVALUATION, i
    worker = role is ProcessRole.WORKER
    for i, fr in enumerate(frames):
        leaf = _leaf(fr, i == 0)
        if leaf is None:
            continue
        if isinstance(leaf, Activity):
            return leaf, i
        if leaf == "queue" and worker:
            while i + 1 < len(frames) and frames[i + 1].file.startswith(_QUEUE_FILES):
                i += 1
            return Activity.IDLE, i  # a worker waiting for work (or for room to put it)
        if leaf == "fetch":
            return Activity.DECODE, i  # the dataset's own code, making samples
        if leaf == "worker":
            return Activity.IDLE, i  # the worker loop's own bookkeeping
        # A main process waiting on its queue, in a DataLoader iterator, or starting its
        # workers: the loader's outermost frame says it best (``__next__``), else the
        # queue's (``Queue.get``, not the pipe read inside it).
        loader = [k for k, f in enumerate(frames) if f.file == "torch/utils/data/dataloader.py"]
        if loader:
            return Activity.LOADER_WAIT, loader[-1]
        while i + 1 < len(frames) and frames[i + 1].file.startswith(_QUEUE_FILES):
            i += 1
        return Activity.LOADER_WAIT, i
    return Activity.STEP, None


def classify(frames: Sequence[StackFrame], role: ProcessRole) -> Activity:
    """The activity of one stack (innermost frame first) of a process in ``role``."""
    return decide(frames, role)[0]


def dotted(frame: StackFrame) -> str:
    """An installed frame as its dotted name (``PIL.Image.open``), the job's own as
    ``file:line function``."""
    if not frame.library:
        return f"{frame.file}:{frame.line} {frame.name}" if frame.line else frame.file
    module = frame.file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return f"{module}.{frame.name}"


def _code(frame: StackFrame) -> str:
    """The job's own frame with its line's source (a comment after it dropped)."""
    text = dotted(frame)
    code = frame.code
    if code:
        code = code.split("  #", 1)[0].rstrip()
        return f"{text}: {code}"
    return text


def where(frames: Sequence[StackFrame], decided: int | None = None) -> str:
    """Where in the code a stack is, in one line: the innermost frame of the job's own
    code at or outside the frame that decided its activity, and that frame
    (``dataset.py:87 __getitem__ -> PIL.Image.open``); the job's own innermost frame with
    its line's source where it is itself the place (a call into C)."""
    frames = own_frames(frames)
    if not frames:
        return "?"
    at = 0 if decided is None else decided
    for i in range(at, len(frames)):
        fr = frames[i]
        if fr.library:
            continue
        if i == at:
            return _code(fr) if i == 0 else dotted(fr)
        return f"{dotted(fr)} -> {dotted(frames[at])}"
    return dotted(frames[at])


# --- weighting and windows --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Weighted:
    """One classified sample, weighted by the GPUs' waiting over its time."""

    end_s: float
    pid: int
    role: ProcessRole
    activity: Activity
    where: str
    seconds: float  # gap-weighted


@dataclass(slots=True)
class RoleShares:
    """What the processes of one role did over a window: shares of their gap-weighted
    seconds by activity, and the places in the code that took the most."""

    seconds: float = 0.0
    activities: dict[Activity, float] = field(default_factory=dict)
    wheres: dict[str, float] = field(default_factory=dict)
    where_activity: dict[str, Activity] = field(default_factory=dict)

    def add(self, w: Weighted) -> None:
        self.seconds += w.seconds
        self.activities[w.activity] = self.activities.get(w.activity, 0.0) + w.seconds
        self.wheres[w.where] = self.wheres.get(w.where, 0.0) + w.seconds
        self.where_activity.setdefault(w.where, w.activity)

    def top(self) -> tuple[Activity, float] | None:
        """The activity with the largest share, and that share."""
        if self.seconds <= 0 or not self.activities:
            return None
        act = max(self.activities, key=lambda a: self.activities[a])
        return act, self.activities[act] / self.seconds

    def top_where(self, activity: Activity | None = None, n: int = 1) -> list[tuple[str, float]]:
        """The places that took most of the time (of ``activity``), with their shares."""
        if self.seconds <= 0:
            return []
        items = [
            (w, s)
            for w, s in self.wheres.items()
            if activity is None or self.where_activity.get(w) is activity
        ]
        items.sort(key=lambda x: -x[1])
        return [(w, s / self.seconds) for w, s in items[:n]]

    def trim(self, keep: int) -> None:
        """Keep the ``keep`` places that took most (a long run's stacks stay bounded)."""
        if len(self.wheres) > 2 * keep:
            kept = sorted(self.wheres, key=lambda w: -self.wheres[w])[:keep]
            self.wheres = {w: self.wheres[w] for w in kept}
            self.where_activity = {w: self.where_activity[w] for w in kept}


@dataclass(slots=True)
class StackWindow:
    """The stacks over a window, by role (ranks count as main processes) and by pid."""

    main: RoleShares = field(default_factory=RoleShares)
    workers: RoleShares = field(default_factory=RoleShares)
    by_pid: dict[int, RoleShares] = field(default_factory=dict)
    ranks: set[int] = field(default_factory=set)
    worker_pids: set[int] = field(default_factory=set)

    def add(self, w: Weighted) -> None:
        if w.role is ProcessRole.WORKER:
            self.workers.add(w)
            self.worker_pids.add(w.pid)
        else:
            self.main.add(w)
            if w.role is ProcessRole.RANK:
                self.ranks.add(w.pid)
        per = self.by_pid.get(w.pid)
        if per is None:
            per = self.by_pid[w.pid] = RoleShares()
        per.add(w)

    def main_of(self, pids: Iterable[int]) -> RoleShares:
        """The main processes' shares, of ``pids`` only where they have stacks (the
        process driving one GPU), else of every main process and rank."""
        mine = [self.by_pid[p] for p in pids if p in self.by_pid and p not in self.worker_pids]
        if not mine:
            return self.main
        out = RoleShares()
        for per in mine:
            out.seconds += per.seconds
            for a, s in per.activities.items():
                out.activities[a] = out.activities.get(a, 0.0) + s
            for w, s in per.wheres.items():
                out.wheres[w] = out.wheres.get(w, 0.0) + s
            out.where_activity.update(per.where_activity)
        return out


# The GPUs' waiting is kept per stretch of a second, 256 of them: a stack window (at most
# 2 minutes, serve's every_s) is weighted by the stretches it spans.
TICK_BUCKET_S = 1.0
TICK_BUCKETS = 256
_KEEP_WHERES = 64


class ActivityTrack:
    """The job's stacks, classified and weighted by the GPUs' waiting: a bounded ring of
    recent samples for windows, and the run's totals per role."""

    def __init__(self, ring: int = 8192, buckets: int = TICK_BUCKETS) -> None:
        # The GPUs' waiting share (0-1) per stretch of at least TICK_BUCKET_S: each
        # stretch's end and share, oldest first (a stack window reaches back its length).
        self._tick_t: deque[float] = deque(maxlen=buckets)
        self._tick_w: deque[float] = deque(maxlen=buckets)
        self._first_t = 0.0
        self.samples: deque[Weighted] = deque(maxlen=ring)
        self.run = StackWindow()
        self.raw_seconds = 0.0  # seconds of stacks read, unweighted
        self.seen = False
        self._kind: OrderedDict[tuple[tuple[StackFrame, ...], ProcessRole], tuple[Activity, str]]
        self._kind = OrderedDict()

    def tick(self, t: float, waiting: float | None) -> None:
        """The GPUs' waiting share (0-1) over the tick ending at ``t``; None: no GPU read.
        Ticks shorter than TICK_BUCKET_S are averaged into one stretch (bounded memory
        whatever the tick rate)."""
        times, shares = self._tick_t, self._tick_w
        if waiting is None or (times and t <= times[-1]):
            return
        if not times:
            self._first_t = t
        else:
            start = times[-2] if len(times) > 1 else self._first_t
            span = times[-1] - start
            if span < TICK_BUCKET_S:
                dt = t - times[-1]
                shares[-1] = (shares[-1] * span + waiting * dt) / (span + dt)
                times[-1] = t
                return
        times.append(t)
        shares.append(waiting)

    def waiting_s(self, a: float, b: float) -> float:
        """GPU-waiting seconds within [a, b]: each tick's share over the part of [a, b]
        it covers (a tick covers the time since the one before it; before the first and
        after the last, their shares hold).  ``b - a`` where no GPU was read."""
        times, shares = self._tick_t, self._tick_w
        if b <= a:
            return 0.0
        if not times:
            return b - a
        total = 0.0
        lo = a
        k = bisect_left(times, a)
        n = len(times)
        while lo < b:
            if k >= n:
                total += (b - lo) * shares[-1]
                break
            hi = min(b, times[k])
            if hi > lo:
                total += (hi - lo) * shares[k]
                lo = hi
            k += 1
        return total

    def ingest(self, samples: Iterable[StackSample]) -> None:
        """Stack samples (of a window that just ended), classified and weighted."""
        for s in samples:
            if s.seconds <= 0:
                continue
            key = (s.frames, s.role)
            kind = self._kind.get(key)
            if kind is None:
                act, at = decide(s.frames, s.role)
                kind = self._kind[key] = (act, where(s.frames, at))
                if len(self._kind) > 4096:
                    self._kind.popitem(last=False)
            w = Weighted(
                s.t_s + s.seconds, s.pid, s.role, kind[0], kind[1],
                self.waiting_s(s.t_s, s.t_s + s.seconds),
            )  # fmt: skip
            self.seen = True
            self.raw_seconds += s.seconds
            if w.seconds <= 0:
                continue
            self.samples.append(w)
            self.run.add(w)
        for shares in (self.run.main, self.run.workers):
            shares.trim(_KEEP_WHERES)
        if len(self.run.by_pid) > 256:
            self.run.by_pid = dict(list(self.run.by_pid.items())[-128:])
        for shares in self.run.by_pid.values():
            shares.trim(8)

    def window(self, a: float, b: float) -> StackWindow:
        """The samples that ended within (a, b]."""
        out = StackWindow()
        for w in reversed(self.samples):
            if w.end_s <= a:
                break
            if w.end_s <= b:
                out.add(w)
        return out


# --- evidence and judgments -------------------------------------------------------------------


def evidence(win: StackWindow, pids: Iterable[int] = (), min_s: float = 0.0) -> Evidence:
    """What the window's stacks say, as flat evidence; ``pids``: the processes on this GPU
    (its main process is theirs, where they have stacks); nothing below ``min_s``
    gap-weighted seconds of stacks."""
    ev = Evidence()
    main = win.main_of(pids)
    total = main.seconds + win.workers.seconds
    if total <= 0 or total < min_s:
        return ev
    ev["stack_seconds"] = round(total, 2)
    top = main.top()
    if top is not None:
        ev["main_activity"] = top[0].value
        ev["main_activity_share"] = round(top[1], 3)
        places = main.top_where(top[0])
        if places:
            ev["main_where"] = places[0][0]
    top = win.workers.top()
    if top is not None:
        ev["workers_activity"] = top[0].value
        ev["workers_activity_share"] = round(top[1], 3)
        places = win.workers.top_where(top[0])
        if places:
            ev["workers_where"] = places[0][0]
    strag = straggler(win)
    if strag is not None:
        pid, shares = strag
        top = shares.top()
        if top is not None:
            place = shares.top_where(top[0])
            ev["straggler_where"] = f"pid {pid}: " + (place[0][0] if place else top[0].value)
    return ev


def straggler(win: StackWindow, share: float = 0.5) -> tuple[int, RoleShares] | None:
    """Ranks waiting in a collective while one rank is elsewhere: that rank, with what it
    did.  At least two ranks with stacks; every rank but one spent ``share`` of its gaps
    in a collective, and that one did not."""
    ranks = [(p, win.by_pid[p]) for p in sorted(win.ranks) if win.by_pid[p].seconds > 0]
    if len(ranks) < 2:
        return None
    waiting = [
        p for p, s in ranks if s.activities.get(Activity.COLLECTIVE, 0.0) >= share * s.seconds
    ]
    others = [(p, s) for p, s in ranks if p not in waiting]
    if len(others) != 1 or not waiting:
        return None
    return others[0]


@dataclass(frozen=True, slots=True)
class Reading:
    """What one GPU's waits were spent on, as a judgment reads it."""

    main: tuple[Activity, float] | None
    workers: tuple[Activity, float] | None
    main_where: str | None
    workers_where: str | None
    seconds: float


def reading(win: StackWindow, pids: Iterable[int] = ()) -> Reading:
    ev = evidence(win, pids)
    main = workers = None
    if "main_activity" in ev:
        main = (Activity(ev["main_activity"]), float(ev["main_activity_share"]))
    if "workers_activity" in ev:
        workers = (Activity(ev["workers_activity"]), float(ev["workers_activity_share"]))
    return Reading(
        main, workers, ev.get("main_where"), ev.get("workers_where"), ev.get("stack_seconds", 0.0)
    )


_WAITING = (State.STARVED, State.SYNC_STALL, State.IDLE)
# What workers do that makes the main process wait: the words a note says it in.
_MAKING = {Activity.DECODE: "decode", Activity.READ: "read", Activity.STEP: "compute"}
_PAUSE_REASONS = (
    None,
    Reason.PERIODIC_GAPS,
    Reason.SYNC_PAUSES,
    Reason.MEMORY_HELD,
    Reason.NO_WORK,
)


def judge(cand: Candidate, r: Reading, cfg: DetectorConfig, worked: bool) -> Candidate:
    """One GPU's candidate, given what its job's processes did during its gaps.

    - A GPU waiting (starved, pausing with its peers, or idle with its memory held after
      work) while the main process writes a checkpoint for most of the gaps is in a
      checkpoint: a sync stall (checkpoint), not starvation.  Likewise an evaluation.
    - A starved GPU whose main process waits on its loader while the workers decode (or
      read) is starved on the CPU (on storage); one whose main process decodes (reads)
      itself, with no workers doing it, is starved on the GIL (on storage).  Workers busy
      in Python of their own (no more specific frame) make samples on the CPU too.  Contention
      stays contention: the stacks cannot see the processes outside the job.
    """
    if r.seconds < cfg.stack_min_s or r.main is None:
        return cand
    act, share = r.main
    if share < cfg.stack_share or cand.state not in _WAITING:
        return cand
    if cand.reason not in _PAUSE_REASONS or (cand.state is State.IDLE and not worked):
        return cand
    if act in (Activity.CHECKPOINT, Activity.EVALUATION):
        reason = Reason.CHECKPOINT if act is Activity.CHECKPOINT else Reason.EVALUATION
        what = f"the main process in {r.main_where or act.value}, {share:.0%} of the gaps"
        return replace(cand, state=State.SYNC_STALL, cause=None, reason=reason, detail=what)
    if cand.state is not State.STARVED or cand.cause is Cause.CONTENTION:
        return cand
    cause = cand.cause
    detail = cand.detail
    wk = r.workers
    if act is Activity.LOADER_WAIT and wk is not None and wk[1] >= cfg.stack_share:
        if wk[0] in _MAKING:
            cause = Cause.IO if wk[0] is Activity.READ else Cause.CPU
            verb = _MAKING[wk[0]]
            detail = f"the workers {verb} in {r.workers_where}, {wk[1]:.0%} of the gaps"
    elif act in (Activity.DECODE, Activity.READ) and not (
        wk is not None and wk[0] in (Activity.DECODE, Activity.READ)
    ):
        cause = Cause.GIL if act is Activity.DECODE else Cause.IO
        verb = "decodes" if act is Activity.DECODE else "reads"
        detail = f"the main process {verb} in {r.main_where}, {share:.0%} of the gaps"
    if cause is cand.cause and detail is cand.detail:
        return cand
    return replace(cand, cause=cause, detail=detail)


def straggler_gpus(
    win: StackWindow, gpu_pids: Mapping[int, frozenset[int]], share: float = 0.5
) -> tuple[int, list[int], str] | None:
    """The GPU of the rank its peers wait on in a collective, the GPUs of those waiting,
    and the straggler's place in the code; None where the stacks do not show one or its
    GPU is not known."""
    strag = straggler(win, share)
    if strag is None:
        return None
    pid, shares = strag
    gpu_of = {p: g for g, ps in gpu_pids.items() for p in ps}
    if pid not in gpu_of:
        return None
    waiting = sorted({gpu_of[p] for p in win.ranks if p != pid and p in gpu_of} - {gpu_of[pid]})
    if not waiting:
        return None
    top = shares.top()
    place = shares.top_where(top[0]) if top else []
    return gpu_of[pid], waiting, place[0][0] if place else "?"
