"""Statistics over timed steps and trials. Throughput is always a ratio of sums.

- images/sec = images in the timed steps / wall time of those steps (pooled over trials)
- jitter = 1.4826 x median absolute deviation (a robust stdev)
- cv = stdev / mean of step times; above ``CV_WARNING`` the record carries a warning
- 95% CI for images/sec: percentile bootstrap; over trials when there are several (each trial
  is an independent process), else over the steps of the single trial
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

CV_WARNING = 0.10
BOOTSTRAP_RESAMPLES = 4000
MAD_TO_SIGMA = 1.4826


def step_time_summary(step_times: Sequence[float]) -> dict[str, float]:
    t = np.asarray(step_times, dtype=float)
    q1, median, q3 = np.percentile(t, [25, 50, 75])
    mean = float(t.mean())
    stdev = float(t.std(ddof=1)) if t.size > 1 else 0.0
    return {
        "median_s": float(median),
        "mean_s": mean,
        "stdev_s": stdev,
        "iqr_s": float(q3 - q1),
        "jitter_s": float(MAD_TO_SIGMA * np.median(np.abs(t - median))),
        "cv": stdev / mean if mean > 0 else 0.0,
    }


def throughput_ci(images: Sequence[int], walls: Sequence[float], step_times: Sequence[float],
                  images_per_step: float, seed: int = 0) -> tuple[tuple[float, float], str]:
    """95% percentile-bootstrap interval for pooled images/sec, and how it was computed."""
    rng = np.random.default_rng(seed)
    if len(walls) > 1:
        imgs, wall = np.asarray(images, float), np.asarray(walls, float)
        idx = rng.integers(0, len(wall), size=(BOOTSTRAP_RESAMPLES, len(wall)))
        samples = imgs[idx].sum(axis=1) / wall[idx].sum(axis=1)
        method = "bootstrap over trials"
    else:
        t = np.asarray(step_times, float)
        idx = rng.integers(0, len(t), size=(BOOTSTRAP_RESAMPLES, len(t)))
        samples = images_per_step * len(t) / t[idx].sum(axis=1)
        method = "bootstrap over steps"
    low, high = np.percentile(samples, [2.5, 97.5])
    return (float(low), float(high)), method

