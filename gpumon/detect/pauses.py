"""All-GPU pauses (checkpoints, host-side syncs) and when they add up to a sync stall.

A pause is a stretch in which every working GPU is quiet, or spins (NCCL busy-wait:
pinned utilisation with few SMs active, or at low power where GPM is not read).  Short or
rare pauses are dips of a healthy run; long pauses taking a large share of the time, with
the GPUs busy in between, are a sync stall.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from gpumon.detect.config import DetectorConfig
from gpumon.detect.gpu import H_BUSY, H_COV, GpuTrack, sm_active_peak


class PauseTracker:
    """Pauses seen recently (bounded) and whether they form a sync-stall pattern now."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self.open_since: float | None = None
        self.pauses: deque[tuple[float, float]] = deque(maxlen=32)
        self.active = False
        self.first_s = 0.0  # start of the first pause of the current pattern
        self.skew_s: float | None = None  # how far apart the GPUs entered the last pause

    def step(
        self,
        t: float,
        prev_eval: float,
        working: Sequence[GpuTrack],
        run_peak_watts: float | None,
        began_s: float | None,
    ) -> bool:
        """Fold one eval in; True while the pauses amount to a sync stall.  ``began_s``: when
        the last of these GPUs began its work (the tail of start-up is no pause)."""
        cfg = self.cfg
        sm_peak = sm_active_peak(working)
        paused = len(working) >= 2 and all(
            self._quiet(tr, t, run_peak_watts, sm_peak) for tr in working
        )
        if paused and self.open_since is None:
            self.open_since = prev_eval
            starts = [tr.run_start for tr in working if not tr.run_busy]
            self.skew_s = max(starts) - min(starts) if len(starts) >= 2 else None
        elif not paused and self.open_since is not None:
            if t - self.open_since + self._slack(working) >= cfg.sync_pause_min_s:
                self.pauses.append((self.open_since, t))
            self.open_since = None
        self.active = self._pattern(t, working, began_s)
        return self.active

    def recent(self, t: float) -> list[tuple[float, float]]:
        """The pauses of the current pattern (the one in progress up to ``t``)."""
        spans = [(a, b) for a, b in self.pauses if b > self.first_s]
        if self.open_since is not None:
            spans.append((self.open_since, t))
        return spans

    def _slack(self, working: Sequence[GpuTrack]) -> float:
        """How much shorter than the real pause the measured one can be: a GPU counts as
        quiet only once a whole driver sample was, so up to one period per edge."""
        per = max((tr.period_s or 0.0 for tr in working), default=0.0)
        return max(self.cfg.eval_interval_s, per)

    def _quiet(
        self, tr: GpuTrack, t: float, run_peak_watts: float | None, sm_peak: float | None
    ) -> bool:
        """Whether this GPU paused over the last driver sample (or eval interval)."""
        cfg = self.cfg
        look = max(cfg.eval_interval_s, tr.period_s or 0.0)
        rec = tr.hist.at_or_before(t - look * 0.999)
        if rec is None:
            return False
        cov = tr.cum_cov - rec[H_COV]
        if cov <= 0:
            return False
        u = (tr.cum_busy - rec[H_BUSY]) / cov * 100
        if u < cfg.pause_util_pct:
            return True
        # Spinning through the pause counts as paused: pinned, few SMs or little power.
        return u >= cfg.busywait_util_pct and bool(tr.spinning_now(run_peak_watts, sm_peak))

    def _pattern(self, t: float, working: Sequence[GpuTrack], began_s: float | None) -> bool:
        cfg = self.cfg
        lo = t - cfg.sync_window_s
        # Pauses since the last GPU began its work: the tail of start-up is no pause.
        if began_s is not None:
            lo = max(lo, began_s)
        spans = [(a, b) for a, b in self.pauses if b > lo]
        if self.open_since is not None:
            if t - self.open_since > cfg.sync_pause_max_s:
                return False  # one very long pause is idleness, not a sync pattern
            if t - self.open_since + self._slack(working) >= cfg.sync_pause_min_s:
                spans.append((self.open_since, t))
        if len(spans) < cfg.sync_min_pauses:
            return False
        # The share is taken since the first pause (at least ``sync_min_span_s``): a run
        # that only now began pausing is judged on its pauses, not on its healthy past.
        first = min(max(a, lo) for a, _ in spans)
        self.first_s = first
        span = min(cfg.sync_window_s, max(cfg.sync_min_span_s, t - first))
        if working:
            span = min(span, t - min(t if tr.first_t is None else tr.first_t for tr in working))
        if span <= 0:
            return False
        share = sum(min(b, t) - max(a, lo) for a, b in spans) / span
        need = cfg.sync_pause_share * (0.6 if self.active else 1.0)
        if share < need:
            return False
        # GPUs that idle more than they work, in lock step, are starved together (every
        # rank's input pipeline), not pausing for a checkpoint between stretches of work.
        # Judged on their duty cycle over the pauses' own stretch, from the first pause on
        # (the share above is diluted by a minimum span at first, and a coarse sample
        # shortens every pause it straddles).
        own = [tr.window(t, t - first).duty for tr in working]
        own_duty = [d for d in own if d is not None]
        if own_duty and sum(own_duty) / len(own_duty) < 1.0 - cfg.sync_pause_share_max:
            return False
        # Outside the pauses the GPUs must be busy: starvation gaps that happen to line up
        # are not a sync pattern.
        duties = [d for d in (tr.window(t, span).duty for tr in working) if d is not None]
        if not duties:
            return False
        outside = (sum(duties) / len(duties)) / max(1e-6, 1.0 - share)
        return outside >= cfg.starved_duty
