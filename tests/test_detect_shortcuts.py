"""The detector's shortcuts say what the long way says: where ``rhythm_shorter_than`` rules
a rhythm out without looking for it, ``find_rhythm`` finds none that long."""

from __future__ import annotations

import random

from gpumon.detect.config import DetectorConfig
from gpumon.detect.gpu import GpuTrack


def test_a_rhythm_ruled_short_is_never_found_longer() -> None:
    cfg = DetectorConfig()
    rng = random.Random(7)
    ruled = 0
    for _ in range(20000):
        base = rng.choice([0.3, 1.0, 3.0, 6.0, 10.0])
        t, gaps = 0.0, []
        for _ in range(rng.randint(0, cfg.ring_long_gaps)):
            # Mostly near-regular steps, now and then a repeat, a step back or a jump.
            step = (
                base * rng.uniform(0.5, 1.8)
                if rng.random() < 0.9
                else rng.choice([0.0, -0.1, 4 * base])
            )
            t += step
            gaps.append((t, t + rng.uniform(0.1, 0.9) * base))
        tr = GpuTrack(0, "GPU-0", cfg)
        for gap in gaps:
            tr.long_gaps.append(gap)
        if rng.random() < 0.5:  # a long gap in progress counts as the newest
            tr.period_s = 1 / 6
            tr.run_busy = False
            tr.run_start = t + base * rng.uniform(0.5, 1.8)
            tr.last_t = tr.run_start + rng.uniform(0.3, 2.0)
        else:
            tr.run_busy = True
        limit = rng.choice([cfg.window_s, 2.0, 20.0])
        if tr.rhythm_shorter_than(limit):
            ruled += 1
            rh = tr.rhythm()
            assert rh is None or rh.period_s < limit, (gaps, rh, limit)
    assert ruled > 5000  # (the shortcut is taken often enough to be tested)
