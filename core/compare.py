"""Comparing runs: pair records by config, the throughput ratio with a 95% interval, and an
equivalence verdict against a tolerance (TOST-style: decided only by the whole interval).

Two analyses, and the output says which one it used:

- **paired**, when both records come from one interleaved run (same ``schedule.run_id``): the
  trials of one round ran next to each other, so the per-round ratios cancel the machine's drift;
  the interval is a t-interval on their logarithms (``accelbench.stats.paired_ratio``).
- **unpaired**, otherwise: a percentile bootstrap over each side's trials (or, with one trial,
  over its timed steps). Such an interval sees no run-to-run variation, so a comparison resting on
  one trial (or one round) per side is never ``within`` or ``outside``: it is ``undecided``.

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

from . import stats, validation
from .errors import UsageError
from .records import read_json
from .schedule import StopRule, parse_fraction
from .stats import BOOTSTRAP_RESAMPLES

EXIT_CODES = {"within": 0, "outside": 1, "undecided": 3}
PAIRED_ANALYSIS = "paired rounds (t-interval on log-ratios, order effect removed)"


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
    #: ``PAIRED_ANALYSIS`` or "unpaired bootstrap over trials|timed steps"
    analysis: str = ""
    #: the interval rests on one round or one trial per side: nothing can be decided from it
    single_sample: bool = False


def parse_tolerance(text: str) -> float:
    return parse_fraction(text, "--tolerance")


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
        block = document["accelbench"]
        if not isinstance(block, dict) or not isinstance(block.get("records"), list):
            raise UsageError(f"{path}: its accelbench block is not {{\"records\": [...]}}")
        records = block["records"]
        for record in records:
            validation.validate_or_raise("result", record, what=f"record in {path}")
        return records
    raise UsageError(f"{path}: neither an accelbench results file nor pytest-benchmark JSON with accelbench records")


def _backend_id(record: dict[str, Any]) -> str:
    """The run's label: its backend, and the requirements added to its environment in a version
    matrix (``--env``), so that two versions of one framework compare as two runs."""
    added = record["environment"].get("worker", {}).get("added")
    matrix = f" [{', '.join(added)}]" if added else ""
    return f"{record['plugin']['name']}:{record['backend']['name']}{matrix}"


def config_key(record: dict[str, Any]) -> str:
    """What must match for two runs to be compared: model and variant, precision, device, batch,
    image size, and for train-mode records the dataset (their throughput includes its pipeline)."""
    d, model = record["device"], record["model"]
    mode = f" train on {record['data']['source']}" if record.get("mode") == "train" else ""
    return (f"{' '.join(filter(None, (model['name'], model['variant'])))} {record['precision']} {d['kind']}x{d['count']} "
            f"batch {record['batch']['global']} {record['image_size']}px{mode}")


def compare(runs: list[Run], tolerance: float | None, seed: int = 0) -> list[Comparison]:
    results = comparisons(runs, tolerance, seed)
    if not results:
        raise UsageError("no two ok runs share a config (model, variant, precision, device, batch, image size)")
    return results


def runs_of(records: list[dict[str, Any]]) -> list[Run]:
    """The ``ok`` records of one invocation, labelled by backend."""
    return [Run(_backend_id(r), r) for r in records if r["status"] == "ok"]


def comparisons(runs: list[Run], tolerance: float | None, seed: int = 0,
                confidence: float = 0.95) -> list[Comparison]:
    """Every pair of runs that share a config (none is fine). ``confidence`` is that of the
    intervals (their field is still named ``ci95``: 95% but for ``until`` runs' looks)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(config_key(run.record), []).append(run)
    return [_compare_pair(a, b, key, tolerance, seed, confidence)
            for key, members in groups.items() for a, b in combinations(members, 2)]


def decided(records: list[dict[str, Any]], rule: StopRule, look: int) -> str:
    """Why an ``until`` run may stop at its ``look``-th look (every comparison among these records
    meets ``rule`` at the confidence this look may spend), or "" to go on."""
    confidence = stats.sequential_confidence(look)
    results = comparisons(runs_of(records), rule.tolerance, confidence=confidence)
    if not results:
        return "nothing left to compare (a run did not finish)"
    at = f"{confidence:.2%} CI at look {look}, 5% error spent over the looks"
    if rule.tolerance is not None and all(r.verdict in ("within", "outside") for r in results):
        return "decided: " + "; ".join(f"{r.a} / {r.b} {r.verdict} ±{rule.tolerance:.1%} "
                                       f"(ratio {r.ratio:.3f}, {at}: {r.ci95[0]:.3f}–{r.ci95[1]:.3f})"
                                       for r in results)
    if rule.half_width is not None and all(not r.single_sample and relative_half_width(r) <= rule.half_width
                                           for r in results):
        return "precise: " + "; ".join(f"{r.a} / {r.b} ratio {r.ratio:.3f} ±{relative_half_width(r):.2%} "
                                       f"({at})" for r in results)
    return ""


def relative_half_width(result: Comparison) -> float:
    """The larger side of the 95% interval, relative to the ratio."""
    return max(result.ratio - result.ci95[0], result.ci95[1] - result.ratio) / result.ratio


def _compare_pair(a: Run, b: Run, key: str, tolerance: float | None, seed: int,
                  confidence: float = 0.95) -> Comparison:
    paired = _paired_rates(a.record, b.record)
    if paired:
        estimate = stats.paired_ratio(*paired, confidence=confidence)
        point, ci, count, unit = estimate.ratio, estimate.ci95, estimate.samples, "rounds"
        samples, analysis = f"{count} paired rounds", PAIRED_ANALYSIS
    else:
        point, ci, count, unit, samples = _unpaired(a.record, b.record, seed, confidence)
        analysis = f"unpaired bootstrap over {unit}"
    result = Comparison(a.label, b.label, key, a.record["throughput"]["images_per_sec"],
                        b.record["throughput"]["images_per_sec"], point, ci, samples, analysis=analysis)
    single = (count < 2) if paired else (unit != "trials")
    result.single_sample = single
    if tolerance is not None:
        result.verdict, result.note = verdict(point, ci, tolerance, count, unit)
        if single:  # more of the same would not help: the interval lacks run-to-run variation
            result.verdict = "undecided"
            result.note = ("one round: no interval exists yet; run --trials >= 3" if paired else
                           "one trial per side: its interval covers step-to-step noise only, not run-to-run "
                           "variation; run both in one invocation with --trials >= 3 (paired rounds)")
    elif single and not paired:
        result.note = "interval covers step-to-step noise only: use --trials >= 3 for run-to-run variation"
    return result


def _paired_rates(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[float], list[float], list[bool]] | None:
    """Per-round images/sec of both sides, and whether A ran first in each round, when they were
    interleaved in one run; else None."""
    sa, sb = a.get("schedule"), b.get("schedule")
    if not (sa and sb and sa["run_id"] == sb["run_id"] and sa["kind"] == sb["kind"] == "interleaved"):
        return None
    rounds_a, rounds_b = _trials_by_round(a), _trials_by_round(b)
    common = sorted(set(rounds_a) & set(rounds_b))
    if not common:
        return None
    return ([rounds_a[r]["images_per_sec"] for r in common], [rounds_b[r]["images_per_sec"] for r in common],
            [rounds_a[r]["started_utc"] < rounds_b[r]["started_utc"] for r in common])


def _trials_by_round(record: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {t["round"]: t for t in record["trials"]
            if t["status"] == "ok" and "round" in t and "started_utc" in t and t["images_per_sec"]}


def _unpaired(a: dict[str, Any], b: dict[str, Any], seed: int,
              confidence: float) -> tuple[float, tuple[float, float], int, str, str]:
    rng = np.random.default_rng(seed)
    samples_a, unit_a, count_a = _throughput_samples(a, rng)
    samples_b, unit_b, count_b = _throughput_samples(b, rng)
    tail = (1 - confidence) / 2 * 100
    low, high = (float(x) for x in np.percentile(samples_a / samples_b, [tail, 100 - tail]))
    point = a["throughput"]["images_per_sec"] / b["throughput"]["images_per_sec"]
    unit = unit_a if unit_a == unit_b else "timed steps"
    samples = f"{count_a} vs {count_b} {unit}" if unit_a == unit_b else f"{count_a} {unit_a} vs {count_b} {unit_b}"
    return point, (low, high), min(count_a, count_b), unit, samples


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
