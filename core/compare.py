"""Comparing runs: pair records by config, the throughput ratio with a 95% bootstrap interval,
and an equivalence verdict against a tolerance (TOST-style: decided only by the whole interval).

- ``within``: the whole interval lies inside [1 - t, 1 + t]
- ``outside``: the whole interval lies outside it
- ``undecided``: the interval straddles a bound; we estimate how many more samples (trials,
  or timed steps when each side has one trial) would likely decide it, as the interval's
  half-width shrinks with the square root of the sample count
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from . import validation
from .records import read_json
from .errors import UsageError
from .stats import BOOTSTRAP_RESAMPLES

EXIT_CODES = {"within": 0, "outside": 1, "undecided": 3}


@dataclass(frozen=True)
class Run:
    label: str
    record: dict[str, Any]


@dataclass
class Comparison:
    a: str
    b: str
    config: str
    a_images_per_sec: float
    b_images_per_sec: float
    ratio: float
    ci95: tuple[float, float]
    samples: str
    verdict: str | None = None
    note: str = ""


def parse_tolerance(text: str) -> float:
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"--tolerance must be like 3% or 0.03, got {text!r}") from None
    if not 0 < value < 1:
        raise UsageError(f"--tolerance must be between 0 and 100%, got {text!r}")
    return value


def load_runs(paths: list[str]) -> list[Run]:
    """The ``ok`` records of accelbench results files and pytest-benchmark JSON files."""
    loaded = [(Path(p), r) for p in paths for r in _records_of(Path(p))]
    labels = [_backend_id(r) for _, r in loaded]
    return [Run(label if labels.count(label) == 1 else f"{label} [{path.name}]", record)
            for (path, record), label in zip(loaded, labels) if record["status"] == "ok"]


def _records_of(path: Path) -> list[dict[str, Any]]:
    document = read_json(path)
    if isinstance(document, dict) and "records" in document:
        validation.validate_or_raise("results", document, what=f"results file {path}")
        return document["records"]
    if isinstance(document, dict) and "accelbench" in document:  # pytest-benchmark JSON
        records = document["accelbench"]["records"]
        for record in records:
            validation.validate_or_raise("result", record, what=f"record in {path}")
        return records
    raise UsageError(f"{path}: neither an accelbench results file nor pytest-benchmark JSON with accelbench records")


def _backend_id(record: dict[str, Any]) -> str:
    return f"{record['plugin']['name']}:{record['backend']['name']}"


def config_key(record: dict[str, Any]) -> str:
    """What must match for two runs to be compared: model and variant, precision, device, batch,
    image size, and for train-mode records the dataset (their throughput includes its pipeline)."""
    d, model = record["device"], record["model"]
    mode = f" train on {record['data']['source']}" if record.get("mode") == "train" else ""
    return (f"{' '.join(filter(None, (model['name'], model['variant'])))} {record['precision']} {d['kind']}x{d['count']} "
            f"batch {record['batch']['global']} {record['image_size']}px{mode}")


def compare(runs: list[Run], tolerance: float | None, seed: int = 0) -> list[Comparison]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(config_key(run.record), []).append(run)
    results = [_compare_pair(a, b, key, tolerance, seed)
               for key, members in groups.items() for a, b in combinations(members, 2)]
    if not results:
        raise UsageError("no two ok runs share a config (model, variant, precision, device, batch, image size)")
    return results


def _compare_pair(a: Run, b: Run, key: str, tolerance: float | None, seed: int) -> Comparison:
    rng = np.random.default_rng(seed)
    samples_a, unit_a, count_a = _throughput_samples(a.record, rng)
    samples_b, unit_b, count_b = _throughput_samples(b.record, rng)
    ratios = samples_a / samples_b
    low, high = (float(x) for x in np.percentile(ratios, [2.5, 97.5]))
    point = a.record["throughput"]["images_per_sec"] / b.record["throughput"]["images_per_sec"]
    unit = unit_a if unit_a == unit_b else "samples"
    result = Comparison(a.label, b.label, key, a.record["throughput"]["images_per_sec"],
                        b.record["throughput"]["images_per_sec"], point, (low, high),
                        f"{count_a} vs {count_b} {unit}")
    if tolerance is not None:
        result.verdict, result.note = verdict(point, (low, high), tolerance, min(count_a, count_b), unit)
    if unit != "trials":
        result.note = (result.note + "; " if result.note else "") + \
            "interval covers step-to-step noise only: use --trials >= 3 for run-to-run variation"
    return result


def _throughput_samples(record: dict[str, Any], rng: np.random.Generator) -> tuple[np.ndarray, str, int]:
    """Bootstrap images/sec: over trials when there are several, else over the timed steps."""
    trials = record["trials"]
    if len(trials) > 1:
        images = np.array([t["images"] for t in trials], float)
        walls = np.array([t["wall_time_s"] for t in trials], float)
        idx = rng.integers(0, len(trials), size=(BOOTSTRAP_RESAMPLES, len(trials)))
        return images[idx].sum(axis=1) / walls[idx].sum(axis=1), "trials", len(trials)
    steps = np.array(trials[0]["step_times_s"], float)
    images_per_step = record["batch"]["global"]
    idx = rng.integers(0, steps.size, size=(BOOTSTRAP_RESAMPLES, steps.size))
    return images_per_step / steps[idx].mean(axis=1), "timed steps", steps.size


def verdict(point: float, ci: tuple[float, float], tolerance: float, samples: int, unit: str) -> tuple[str, str]:
    low_bound, high_bound = 1 - tolerance, 1 + tolerance
    low, high = ci
    if low_bound <= low and high <= high_bound:
        return "within", ""
    if high < low_bound or low > high_bound:
        return "outside", ""
    margin = min(point - low_bound, high_bound - point) if low_bound <= point <= high_bound \
        else min(abs(point - low_bound), abs(point - high_bound))
    if margin <= 0:
        return "undecided", "the estimate sits on the tolerance bound"
    half_width = (high - low) / 2
    more = max(1, math.ceil(samples * (half_width / margin) ** 2) - samples)
    return "undecided", f"about {more} more {unit} would likely decide it"


def exit_code(results: list[Comparison]) -> int:
    verdicts = {r.verdict for r in results}
    if "outside" in verdicts:
        return EXIT_CODES["outside"]
    if "undecided" in verdicts:
        return EXIT_CODES["undecided"]
    return 0


def to_json(results: list[Comparison], tolerance: float | None) -> str:
    return json.dumps({"tolerance": tolerance, "comparisons": [asdict(r) for r in results]}, indent=1)
