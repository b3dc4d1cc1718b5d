"""Thresholds of the burst/stall detector, in one frozen place so callers pass them in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Every threshold the detector uses, with the reason for its default.

    Times are seconds of stream time (the samples' own clock), never wall-clock.
    """

    # A driver sample at or above this utilisation counts as part of a busy burst.  The
    # driver reports a duty cycle per period (1/6 s to 1 s), so a half-busy period is the
    # natural boundary between "kernels ran" and "the GPU waited".
    busy_util_pct: float = 50.0
    # Classification is re-evaluated at most this often (stream time); per-point work stays
    # a tight loop, the rules run once per interval.
    eval_interval_s: float = 1.0
    # While nothing is pending or changing for ``calm_evals`` evals, up to ``calm_factor``
    # - 1 evals in a row are skipped while every GPU's work since the last one is what its
    # state says (offline: most of a long trace is calm, and the rules are the cost).
    calm_evals: int = 5
    calm_factor: float = 1.0
    # The short window over which the duty cycle is judged; stretched to
    # ``window_periods`` burst/gap periods for slow cycles, capped at ``window_max_s``.
    window_s: float = 8.0
    window_periods: float = 2.5
    window_max_s: float = 60.0
    # Duty cycle below which a GPU does nothing (idle), and the band in between healthy and
    # starved.  Entering starvation needs the duty cycle below ``starved_duty``; leaving it
    # needs ``healthy_duty`` (hysteresis, so a run near the line does not flap).
    idle_duty: float = 0.05
    starved_duty: float = 0.75
    healthy_duty: float = 0.82
    # Hysteresis is for flicker: a duty cycle below ``sustained_duty`` over a whole
    # ``sustained_window_s`` is starvation even inside the band.
    sustained_duty: float = 0.8
    sustained_window_s: float = 60.0
    # Start-up ends at the first window with this duty cycle (and the window full of data):
    # the first sustained work.  Before it a quiet GPU is "start-up", not starved.
    startup_duty: float = 0.2
    startup_active: float = 0.5  # ... or this share of the window with any activity
    startup_bursts: int = 3  # ... or this many bursts in it (a starved rhythm)
    # One unbroken burst this long is work at once: a GPU busy from its first sample is
    # shown healthy within seconds (a starved GPU's bursts are shorter than its window).
    busy_run_s: float = 2.0
    # A single isolated gap (a checkpoint, an evaluation hand-over) is a dip, not a state
    # change, while it lasts under ``dip_max_s`` and no other gap came in ``dip_isolation_s``.
    dip_max_s: float = 6.0
    # With no process on the GPU, a gap this long is already idleness.
    idle_gap_s: float = 3.0
    dip_isolation_s: float = 30.0
    # How long a new candidate state must persist before an episode opens.  Short, because
    # the window already smooths; the episode's start is backdated to the candidate's onset.
    confirm_s: float = 2.0
    confirm_idle_s: float = 2.0
    confirm_unknown_s: float = 6.0
    # A duty cycle this far below ``starved_duty`` is no borderline case: confirm at once.
    clear_margin: float = 0.25
    # A sample period at or above this is too coarse to see sub-second bursts: only the duty
    # cycle can be judged (nvidia-smi CSV at 1 s, a 1 s or 2 s driver period).
    coarse_period_s: float = 0.9
    # Consecutive points further apart than this many periods leave a hole (no data).
    hole_periods: float = 4.0
    # A window with less than this share of time covered by samples is "no data": unknown.
    min_coverage: float = 0.5
    # Busy-wait (NCCL spinning): utilisation at or above ``busywait_util_pct`` while drawing at
    # most ``busywait_power_share`` of the reference power (the run's peak 1-s power, or
    # ``power_ref_of_limit`` of the limit when that is larger).
    busywait_util_pct: float = 90.0
    busywait_power_share: float = 0.55
    power_ref_of_limit: float = 0.75
    busywait_window_s: float = 4.0
    # Where the GPU has GPM counters, busy-wait is told by SM activity instead of power: pinned
    # utilisation with at most this share of SMs busy (a collective's spinning kernels hold
    # one block per channel, a few SMs of a hundred; real work keeps most of them busy).
    busywait_sm_active_ratio: float = 0.2
    # ... or at most this share of the highest SM activity any GPU of the run has shown:
    # NCCL's kernels may hold 24-32 channels (a fifth of an H100's SMs), far below the
    # 0.7-0.9 of a GPU computing the same model.
    busywait_sm_share: float = 0.4
    # All-GPU pauses (checkpoint, host-side sync): a second in which every working GPU is
    # below ``pause_util_pct`` (or busy-waiting).  Pauses of ``sync_pause_min_s`` to
    # ``sync_pause_max_s`` taking more than ``sync_pause_share`` of the last
    # ``sync_window_s`` (at least ``sync_min_pauses`` of them) are a sync stall; rarer or
    # shorter pauses are dips of a healthy run.
    pause_util_pct: float = 10.0
    sync_pause_min_s: float = 5.0
    sync_pause_max_s: float = 60.0
    sync_pause_share: float = 0.15
    sync_pause_share_max: float = 0.5
    sync_window_s: float = 120.0
    sync_min_span_s: float = 60.0
    sync_min_pauses: int = 2
    # A pause the CPU fills is the input pipeline's, not a checkpoint: the job's CPU (the
    # host's, without its process tree) during the pauses at least ``pause_cpu_surge_ratio``
    # times, and ``pause_cpu_surge_cores`` cores above, what it is in the work between --
    # DataLoader workers starting anew at each epoch and loading their first batches.  A
    # checkpoint writes (``pause_write_bytes_per_s`` during the pauses) or waits on the
    # disk (``io_iowait_pct``) with no such surge: its pauses stay a sync stall.
    pause_cpu_surge_ratio: float = 1.5
    pause_cpu_surge_cores: float = 1.0
    pause_write_bytes_per_s: float = 50e6
    # Host causes, judged on host/process-tree data averaged over the GPUs' gaps.
    cpu_worker_saturated_pct: float = 80.0  # mean worker CPU (% of one core) = saturated
    cpu_host_saturated_pct: float = 90.0  # host CPU (mean of all cores) = saturated
    gil_main_pct: float = 85.0  # main process pinned at ~one core
    gil_rest_max_pct: float = 50.0  # ... while the workers stay below this each
    io_iowait_pct: float = 10.0  # iowait share of all-core time that points at storage
    io_read_bytes_per_s: float = 200e6  # tree read throughput that points at storage
    # Contention needs a job that asks for the CPU: below this tree CPU (% of one core)
    # during the gaps, with none of its processes runnable, its processes sleep (on a
    # remote source, a lock), and however busy the host is with others, the CPU is not
    # what it waits on.  (A runnable process gets a fair share of a saturated host.)
    contention_min_tree_pct: float = 10.0
    # A cause holds until its sign falls below this share of the line that named it (the
    # causes' hysteresis: worker CPU 80 % names the CPU, 64 % releases it), and a change
    # of cause alone must hold ``confirm_cause_s`` before a new episode opens.
    cause_release: float = 0.8
    confirm_cause_s: float = 3.0
    # A cause is read over the GPUs' latest ``cause_wait_s`` seconds of waiting (at least
    # ``cause_min_span_s`` back, at most the GPU's window): what the host did during the
    # latest gaps, not an average reaching back into the phase before -- over at least
    # ``cause_min_readings`` host readings, so that one noisy reading names no cause.
    cause_wait_s: float = 2.0
    cause_min_readings: int = 6
    cause_min_span_s: float = 2.0
    # Memory: a GPU with process memory above this share of the total is "held" even when
    # the process list is unknown (nvidia-smi CSV logs carry memory.used, not processes).
    held_mem_share: float = 0.05
    held_mem_bytes: int = 1 << 30  # ... or this much (1 GiB: a small model on a big card)
    # Less memory in use than any CUDA context takes (~250 MiB and up): no process holds
    # the GPU, whatever else reads on it (a display, another client at idle power).
    no_context_mem_bytes: int = 200 << 20
    # A flat duty cycle below this with no sign of a process could be small work (or a
    # display); at or above it a GPU is plainly working at a fraction of its capacity.
    small_work_duty: float = 0.1
    # Drawing at least this share of its power limit, a GPU is running something.
    working_power_share: float = 0.35
    # Headroom above which a larger batch would likely fit.
    batch_headroom_ratio: float = 0.35
    # Start-up ends at the first sustained work; a GPU that has not worked after this long
    # is no longer "starting up" but holding memory (or nothing) with no work.
    startup_max_s: float = 120.0
    # Periodic gaps (a loader restarting every epoch, a checkpoint every N steps): gaps of
    # at least ``rhythm_gap_periods`` driver samples, ``rhythm_min_gaps`` or more of them at
    # regular intervals (coefficient of variation <= ``rhythm_max_cv``), taking at least
    # ``rhythm_idle_share`` of the time (of whole periods: the median gap over the median
    # interval), are starvation even at a duty cycle up to ~0.88.
    # (Leaving needs the share below ``rhythm_exit_share``.)  Checkpoints of a healthy
    # run are rarer: 4 s every 60 s is under 7 %.
    rhythm_gap_periods: float = 1.5
    rhythm_min_gaps: int = 3
    rhythm_max_cv: float = 0.3
    rhythm_max_ratio: float = 1.6  # ... and no interval 1.6 times another
    rhythm_max_ratio_2: float = 1.45  # (1.45 when only three gaps make the rhythm)
    rhythm_idle_share: float = 0.12
    rhythm_exit_share: float = 0.08
    rhythm_window_max_s: float = 600.0
    # A multi-GPU run in which a minority of GPUs works at a starved duty cycle while its
    # peers read pinned (>= ``pinned_duty``) without drawing computing power is waiting on
    # that straggler (data-parallel peers spin in the collective).
    pinned_duty: float = 0.9
    pinned_window_s: float = 30.0  # ... and have stayed pinned this long
    # Every GPU of a run (or node) spinning in a collective with none computing for this
    # long is a hang, not a wait: the rank they wait on is elsewhere, or stuck.  PyTorch's
    # NCCL watchdog aborts a collective after the process group's timeout (10 minutes by
    # default; 30 in releases before 2.2), so 5 minutes names a hang before it fires.
    hang_after_s: float = 300.0
    computing_power_share: float = 0.8
    # Every GPU pinned and most at no more than this share of the busiest one's SM
    # activity (GPM), or of its power: they spin for part of each step on it (a
    # data-parallel rank doing the same work at 60 % of another's rate waits 40 %).
    partial_wait_sm_share: float = 0.6
    partial_wait_power_share: float = 0.65
    # ... and every one of them this much further below: no borderline case, confirmed at
    # the next eval (even while the run's first judgment is pending).
    partial_wait_clear_margin: float = 0.1
    # A stream that ends before its work could be judged (a log of a few samples) is judged
    # at its end on all it shows, if it has at least this many samples of work.
    short_log_min_samples: int = 3
    # ... unless memory in use grew by more than this factor since its first activity: a
    # job still allocating is warming up (loading a model), not yet working.
    warmup_mem_growth: float = 1.25
    # New work is not judged while its memory still rises by more than this factor over
    # the last ``warmup_mem_window_s`` (a rate, so that how often memory is sampled does not
    # change what counts as rising): the job is loading, warming up.  A job that allocated
    # in one go and then works is judged at once.
    warmup_mem_rise: float = 1.1
    warmup_mem_window_s: float = 2.0
    # Ring sizes: bounded memory whatever the stream length.
    ring_events: int = 64  # recent bursts / gaps / cycles kept per GPU for quantiles
    ring_evals: int = 160  # per-eval history (>= window_max_s / eval_interval_s)
    ring_long: int = 72  # a record every ``long_record_s``: long windows (rhythms)
    long_record_s: float = 10.0
    ring_long_gaps: int = 12  # the recent gaps long enough to form a rhythm
    # Python stacks (``--stacks``): what the job's processes did over the gaps of the last
    # ``stack_window_s`` (longer for a rhythm: 2.5 of its periods) names a wait when one
    # activity took ``stack_share`` of at least ``stack_min_s`` gap-weighted seconds.
    stack_window_s: float = 30.0
    stack_share: float = 0.5
    stack_min_s: float = 1.0
