"""Comparing runs: pair records by config, the throughput ratio with a 95% interval, and an
equivalence verdict against a tolerance (TOST-style: decided only by the whole interval).

Two analyses, and the output says which one it used:

- **paired**, when both records come from one interleaved run (same ``schedule.run_id``): the
  trials of one round ran next to each other, so the per-round ratios cancel the machine's drift;
  the interval is a t-interval on their logarithms (``accelbench.analysis.stats.paired_ratio``).
- **pairs of processes**, when both come from one lockstep run: each pair's processes took turns
  in blocks; the pair's ratio is one sample, and the t-interval is over the pairs' log-ratios. A
  comparison resting on a block in which other processes took more than ``busy.BUSY_SHARE`` of
  the machine is ``undecided``, with a note naming the load: a busy machine never gives a verdict.
- **unpaired**, otherwise: Welch's t-interval on the two sides' trial log-rates when each has
  two trials or more (a t-interval holds at small samples, where a percentile bootstrap over two
  trials would be little more than their span); with one trial on a side, a percentile bootstrap
  over the timed steps. That interval sees no run-to-run variation, so a comparison resting on one
  trial (or one round) per side is never ``within`` or ``outside``: it is ``undecided``.

- ``within``: the whole interval lies inside [1 - t, 1 + t]
- ``outside``: the whole interval lies outside it
- with a ``margin`` instead (non-inferiority, "is A at least B, within 2%?"): ``ahead`` (the whole
  interval above 1), ``not behind`` (above 1 - margin), ``behind`` (below it), else ``undecided``
- ``undecided``: the interval straddles a bound; we estimate how many more samples (trials,
  or timed steps when each side has one trial) would likely decide it, as the interval's
  half-width shrinks with the square root of the sample count
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np
import numpy.typing as npt

from accelbench.analysis import stats
from accelbench.analysis.stats import BOOTSTRAP_RESAMPLES
from accelbench.errors import UsageError
from accelbench.execution import busy
from accelbench.execution.schedule import StopRule, parse_fraction
from accelbench.records import validation
from accelbench.records.blocks import Efficiency, TimeSplit
from accelbench.records.results import Record, TrialRow, read_json, results_from_json

EXIT_CODES = {"within": 0, "outside": 1, "undecided": 3, "ahead": 0, "not behind": 0, "behind": 1}
PAIRED_ANALYSIS = "paired rounds (t-interval on log-ratios, order effect removed)"
LOCKSTEP_ANALYSIS = "lockstep pairs of processes (t-interval on the pairs' log-ratios; the order is balanced inside each pair)"
UNPAIRED_ANALYSIS = "unpaired trials (Welch t-interval on log-rates)"
PAIRED_KINDS = ("interleaved", "lockstep")


@dataclass(frozen=True)
class Run:
    label: str
    record: Record


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
    #: ``PAIRED_ANALYSIS``, ``LOCKSTEP_ANALYSIS``, ``UNPAIRED_ANALYSIS`` or "unpaired bootstrap over timed steps"
    analysis: str = ""
    #: the interval rests on one round or one trial per side: nothing can be decided from it
    single_sample: bool = False
    #: the confidence of ``ci95`` (0.95, or an ``until`` run's last look's)
    confidence: float = 0.95
    #: A/B of each round or pair, in order (paired analyses only)
    per_unit: list[float] = field(default_factory=list)
    #: the verdict was withheld because the machine was busy during the run (what it was, in words)
    busy: str = ""
    #: lockstep: the indices into ``per_unit`` of the pairs with a busy counted block
    busy_units: list[int] = field(default_factory=list)
    #: lockstep: where the run's time went, and how close its interval came to what that time allowed
    time_split: TimeSplit | None = None
    efficiency: Efficiency | None = None


def parse_tolerance(text: str) -> float:
    return parse_fraction(text, "--tolerance")


def load_runs(paths: list[str]) -> list[Run]:
    """The ``ok`` records of accelbench results files and pytest-benchmark JSON files."""
    loaded = [(Path(p), r) for p in paths for r in _records_of(Path(p))]
    labels = [_backend_id(r) for _, r in loaded]
    return [
        Run(label if labels.count(label) == 1 else f"{label} [{path.name}]", record)
        for (path, record), label in zip(loaded, labels)
        if record.ok
    ]


def _records_of(path: Path) -> list[Record]:
    document = read_json(path)
    if isinstance(document, dict) and "records" in document:
        return results_from_json(document, f"results file {path}").records
    if isinstance(document, dict) and "accelbench" in document:  # pytest-benchmark JSON
        block = document["accelbench"]
        if not isinstance(block, dict) or not isinstance(block.get("records"), list):
            raise UsageError(f'{path}: its accelbench block is not {{"records": [...]}}')
        for record in block["records"]:
            validation.validate_or_raise("result", record, what=f"record in {path}")
        return [Record.from_json(record) for record in block["records"]]
    raise UsageError(f"{path}: neither an accelbench results file nor pytest-benchmark JSON with accelbench records")


def _backend_id(record: Record) -> str:
    """The run's label: its backend, and what sets it apart from the backend's other runs (the
    requirements of a version matrix, a lever), so that two versions of one framework, or a run
    with and without a lever, compare as two runs."""
    variation = record.variation()
    return f"{record.plugin.name}:{record.backend.name}" + (f" [{', '.join(variation)}]" if variation else "")


def config_key(record: Record) -> str:
    """What must match for two runs to be compared: model and variant, precision, device, batch,
    image size, and for train-mode records the dataset (their throughput includes its pipeline)."""
    d, model = record.device, record.model
    mode = f" train on {record.data.source}" if record.mode == "train" else ""
    return (
        f"{' '.join(filter(None, (model.name, model.variant)))} {record.precision} {d.kind}x{d.count} "
        f"batch {record.batch.global_} {record.image_size}px{mode}"
    )


def compare(runs: list[Run], tolerance: float | None, seed: int = 0, margin: float | None = None) -> list[Comparison]:
    results = comparisons(runs, tolerance, seed, margin=margin)
    if not results:
        raise UsageError("no two ok runs share a config (model, variant, precision, device, batch, image size)")
    return results


def runs_of(records: list[Record]) -> list[Run]:
    """The ``ok`` records of one invocation, labelled by backend."""
    return [Run(_backend_id(r), r) for r in records if r.ok]


def comparisons(
    runs: list[Run], tolerance: float | None, seed: int = 0, confidence: float | None = None, margin: float | None = None
) -> list[Comparison]:
    """Every pair of runs that share a config (none is fine). ``confidence`` is that of the
    intervals (their field is still named ``ci95``); None: 95%, or, for two records of one
    ``until`` run, the confidence of that run's last look, so that ``compare`` says what the run
    said when it stopped."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(config_key(run.record), []).append(run)
    results = [
        _compare_pair(a, b, key, tolerance, seed, confidence)
        for key, members in groups.items()
        for a, b in combinations(members, 2)
    ]
    if margin is not None:
        for result in results:
            _judge_margin(result, margin)
    return results


def margin_verdict(ci: tuple[float, float], margin: float) -> str:
    """Where A/B's interval stands against "A at least B", within ``margin``: ``ahead`` (wholly
    above 1), ``not behind`` (wholly above 1 - margin), ``behind`` (wholly below it), else
    ``undecided`` (and always without an interval)."""
    low, high = ci
    if low >= high:
        return "undecided"
    if low > 1:
        return "ahead"
    if low >= 1 - margin:
        return "not behind"
    return "behind" if high < 1 - margin else "undecided"


def _judge_margin(result: Comparison, margin: float) -> None:
    result.verdict = margin_verdict(result.ci95, margin)
    if result.single_sample:
        result.verdict = "undecided"
    if result.busy:
        result.verdict, result.note = "undecided", f"verdict withheld: {result.busy}"


def decided(records: list[Record], rule: StopRule, confidence: float, look: str) -> str:
    """Why an ``until`` run may stop at this look (every comparison among these records meets
    ``rule`` at the ``confidence`` the look may spend; ``look`` says which look that is), or ""
    to go on."""
    results = comparisons(runs_of(records), rule.tolerance, confidence=confidence)
    if not results:
        return "nothing left to compare (a run did not finish)"
    at = f"{confidence:.2%} CI at {look}"
    if rule.tolerance is not None and all(r.verdict in ("within", "outside") for r in results):
        return "decided: " + "; ".join(
            f"{r.a} / {r.b} {r.verdict} ±{rule.tolerance:.1%} (ratio {r.ratio:.3f}, {at}: {r.ci95[0]:.3f}–{r.ci95[1]:.3f})"
            for r in results
        )
    if rule.half_width is not None and all(
        not r.single_sample and not r.busy and relative_half_width(r) <= rule.half_width for r in results
    ):
        return "precise: " + "; ".join(f"{r.a} / {r.b} ratio {r.ratio:.3f} ±{relative_half_width(r):.2%} ({at})" for r in results)
    return ""


def efficiency(result: Comparison, a: Record, b: Record) -> Efficiency | None:
    """(ideal / reached half-width) squared of a lockstep comparison: the share of its run's wall
    time that a design counting every second, with the step noise the sides showed, would have
    needed for the interval the run reached (``stats.ideal_half_width``). None without the run's
    time split (a record before result schema 1.13)."""
    split = a.schedule.lockstep.time if a.schedule and a.schedule.lockstep else None
    if split is None or split.wall_s <= 0:
        return None
    noise = [_step_noise(a), _step_noise(b)]
    if any(step_s <= 0 for _, step_s in noise):
        return None
    ideal = stats.ideal_half_width(noise, split.wall_s)
    reached = relative_half_width(result)
    return Efficiency(min(1.0, (ideal / reached) ** 2) if reached > 0 else 1.0, ideal, reached)


def _step_noise(record: Record) -> tuple[float, float]:
    """(coefficient of variation, seconds) of a record's timed steps over its ok trials."""
    trials = record.ok_trials()
    steps = np.concatenate([np.asarray(t.step_times_s, float) for t in trials]) if trials else np.zeros(0)
    if steps.size < 2 or steps.mean() <= 0:
        return 0.0, 0.0
    seconds = sum(t.wall_time_s or 0.0 for t in trials) / steps.size
    return float(steps.std(ddof=1) / steps.mean()), seconds


def relative_half_width(result: Comparison) -> float:
    """The larger side of the 95% interval, relative to the ratio."""
    return max(result.ratio - result.ci95[0], result.ci95[1] - result.ratio) / result.ratio


def _compare_pair(a: Run, b: Run, key: str, tolerance: float | None, seed: int, confidence: float | None = None) -> Comparison:
    paired = _paired_rates(a.record, b.record)
    schedule = a.record.schedule
    lockstep = bool(paired) and schedule is not None and schedule.kind == "lockstep"
    if confidence is None:
        recorded = schedule.confidence if paired and schedule else None
        confidence = recorded if recorded is not None else 0.95
    per_unit: list[float] = []
    if paired:
        # a lockstep pair's blocks run A B | B A ... in an even number of rounds, so the order of
        # the sides is balanced inside every pair: regressing it out again would cost the
        # interval a degree of freedom for nothing (at three pairs, a t multiplier of 12.7 not 4.3)
        estimate = stats.paired_ratio(paired[0], paired[1], None if lockstep else paired[2], confidence=confidence)
        point, ci, count = estimate.ratio, estimate.ci95, estimate.samples
        unit = "pairs" if lockstep else "rounds"
        samples = f"{count} pair{'s' if count != 1 else ''} (lockstep)" if lockstep else f"{count} paired rounds"
        analysis = LOCKSTEP_ANALYSIS if lockstep else PAIRED_ANALYSIS
        per_unit = [x / y for x, y in zip(paired[0], paired[1])]
    else:
        point, ci, count, unit, samples = _unpaired(a.record, b.record, seed, confidence)
        analysis = UNPAIRED_ANALYSIS if unit == "trials" else "unpaired bootstrap over timed steps"
    result = Comparison(
        a.label,
        b.label,
        key,
        a.record.images_per_sec(),
        b.record.images_per_sec(),
        point,
        ci,
        samples,
        analysis=analysis,
        confidence=confidence,
        per_unit=per_unit,
    )
    single = (count < 2) if paired else (unit != "trials")
    result.single_sample = single
    if lockstep and schedule is not None and schedule.lockstep is not None:
        result.time_split = schedule.lockstep.time
        result.efficiency = None if single else efficiency(result, a.record, b.record)
    if lockstep:
        result.busy = busy_note(a, b)
        busy = busy_pairs(a.record) | busy_pairs(b.record)
        result.busy_units = [i for i, pair in enumerate(common_rounds(a.record, b.record)) if pair in busy]
    if tolerance is not None:
        result.verdict, result.note = verdict(point, ci, tolerance, count, unit)
        more = _more_samples(result.note)
        if more and result.time_split is not None and count:
            # the run's own pace: a pair's share of its wall time, every part of it included
            pace = result.time_split.wall_s / count
            result.note += f" (about {more * pace / 60:.0f} more minutes on this machine, at {pace:.0f} s a pair)"
        if single:  # more of the same would not help: the interval lacks run-to-run variation
            result.verdict = "undecided"
            result.note = (
                f"one {unit[:-1]}: no interval exists yet; run --trials >= 3"
                if paired
                else "one trial per side: its interval covers step-to-step noise only, not run-to-run "
                "variation; run both in one invocation with --trials >= 3 (paired rounds)"
            )
        if result.busy:  # a verdict a busy machine could have changed is never given
            result.verdict, result.note = "undecided", f"verdict withheld: {result.busy}"
    elif single and not paired:
        result.note = "interval covers step-to-step noise only: use --trials >= 3 for run-to-run variation"
    elif single:
        result.note = f"one {unit[:-1]}: no interval exists yet; run --trials >= 3"
    elif result.busy:
        result.note = result.busy
    return result


def busy_pairs(record: Record) -> set[int]:
    """The pairs (rounds) of a lockstep record with a counted block its run called busy."""
    limit = _busy_share(record)
    return {
        t.round
        for t in record.ok_trials()
        for b in t.blocks or ()
        if t.round is not None and b.counted and busy.is_busy(b.foreign_share, limit)
    }


def _busy_share(record: Record) -> float:
    """The share of the machine other processes may take before the record's run called it busy."""
    settings = record.schedule.lockstep if record.schedule else None
    return settings.busy_share if settings else busy.BUSY_SHARE


def busy_note(a: Run, b: Run) -> str:
    """Why the machine was too busy to compare these lockstep runs, or "" when it was quiet: a
    counted block of either side in which other processes took more than the run's busy share."""
    limit = _busy_share(a.record)
    blocks = {run.label: _counted_blocks(run.record) for run in (a, b)}
    if not any(busy.is_busy(share, limit) for found in blocks.values() for share, _ in found):
        return ""
    (first, found_a), (second, found_b) = blocks.items()
    return (
        f"the machine was busy: {_weighted_share(found_a):.0%} of CPU time went to other processes during "
        f"{first}'s blocks, {_weighted_share(found_b):.0%} during {second}'s"
    )


def _counted_blocks(record: Record) -> list[tuple[float, float]]:
    """(foreign share, seconds) of every counted block of the record's ok trials."""
    return [
        (block.foreign_share, block.seconds or 0.0)
        for trial in record.ok_trials()
        for block in trial.blocks or ()
        if block.counted and block.foreign_share is not None
    ]


def _weighted_share(blocks: list[tuple[float, float]]) -> float:
    seconds = sum(s for _, s in blocks)
    return sum(share * s for share, s in blocks) / seconds if seconds else 0.0


def _paired_rates(a: Record, b: Record) -> tuple[list[float], list[float], list[bool]] | None:
    """Per-round images/sec of both sides, and whether A ran first in each round, when they were
    interleaved in one run; else None."""
    if not (a.schedule and a.schedule.paired_with(b.schedule)):
        return None
    rounds_a, rounds_b = _trials_by_round(a), _trials_by_round(b)
    common = sorted(rounds_a.keys() & rounds_b.keys())
    if not common:
        return None
    pairs = [(rounds_a[r], rounds_b[r]) for r in common]
    return [_rate(x) for x, _ in pairs], [_rate(y) for _, y in pairs], [_ran_first(x, y) for x, y in pairs]


def _rate(trial: TrialRow) -> float:
    """A timed trial's images/sec (its images over its wall time, as the trial row holds them)."""
    if trial.images_per_sec is None:
        raise ValueError(f"trial {trial.index} timed no steps: it has no rate to compare")
    return trial.images_per_sec


def _ran_first(a: TrialRow, b: TrialRow) -> bool:
    """Whether A's trial ran before B's in their round: their positions (since result schema
    1.12), else their start times (records of earlier versions)."""
    if a.position is not None and b.position is not None:
        return a.position < b.position
    return str(a.started_utc) < str(b.started_utc)


def common_rounds(a: Record, b: Record) -> list[int]:
    """The rounds (or pairs) in which both records have an ok trial, in order: the paired samples."""
    return sorted(set(_trials_by_round(a)) & set(_trials_by_round(b)))


def _trials_by_round(record: Record) -> dict[int, TrialRow]:
    return {t.round: t for t in record.ok_trials() if t.round is not None and t.started_utc is not None and t.images_per_sec}


def _unpaired(a: Record, b: Record, seed: int, confidence: float) -> tuple[float, tuple[float, float], int, str, str]:
    """A/B of two runs of separate invocations: Welch's t on the trials' log-rates when both
    sides have several trials; else a bootstrap over timed steps, whose interval holds
    step-to-step noise only (the caller withholds a verdict from it)."""
    point = a.images_per_sec() / b.images_per_sec()
    if len(a.trials) > 1 and len(b.trials) > 1:
        rates = [[_rate(t) for t in r.trials] for r in (a, b)]
        ci = stats.welch_ratio_interval(rates[0], rates[1], point, confidence)
        count_a, count_b = len(a.trials), len(b.trials)
        return point, ci, min(count_a, count_b), "trials", f"{count_a} vs {count_b} trials"
    rng = np.random.default_rng(seed)
    samples_a, count_a = _throughput_samples(a, rng)
    samples_b, count_b = _throughput_samples(b, rng)
    tail = (1 - confidence) / 2 * 100
    low, high = (float(x) for x in np.percentile(samples_a / samples_b, [tail, 100 - tail]))
    return point, (low, high), min(count_a, count_b), "timed steps", f"{count_a} vs {count_b} timed steps"


def _throughput_samples(record: Record, rng: np.random.Generator) -> tuple[npt.NDArray[np.float64], int]:
    """Bootstrap images/sec over the timed steps of every trial (a side with one trial, beside
    which the other's trials are no help: the comparison rests on step-to-step noise)."""
    steps = np.concatenate([np.asarray(t.step_times_s, float) for t in record.trials])
    images_per_step = record.batch.global_
    idx = rng.integers(0, steps.size, size=(BOOTSTRAP_RESAMPLES, steps.size))
    return images_per_step / steps[idx].mean(axis=1), steps.size


def verdict(point: float, ci: tuple[float, float], tolerance: float, samples: int, unit: str) -> tuple[str, str]:
    low_bound, high_bound = 1 - tolerance, 1 + tolerance
    low, high = ci
    if low_bound <= low and high <= high_bound:
        return "within", ""
    if high < low_bound or low > high_bound:
        return "outside", ""
    margin = (
        min(point - low_bound, high_bound - point)
        if low_bound <= point <= high_bound
        else min(abs(point - low_bound), abs(point - high_bound))
    )
    if margin <= 0:
        return "undecided", "the estimate sits on the tolerance bound"
    half_width = (high - low) / 2
    more = max(1, math.ceil(samples * (half_width / margin) ** 2) - samples)
    return "undecided", f"about {more} more {unit} would likely decide it"


def _more_samples(note: str) -> int | None:
    """N of ``verdict``'s "about N more pairs would likely decide it"."""
    words = note.split()
    if len(words) > 2 and words[0] == "about" and words[1].isdigit() and words[2] == "more":
        return int(words[1])
    return None


def exit_code(results: list[Comparison]) -> int:
    verdicts = {r.verdict for r in results}
    if verdicts & {"outside", "behind"}:
        return EXIT_CODES["outside"]
    if "undecided" in verdicts:
        return EXIT_CODES["undecided"]
    return 0


def to_json(results: list[Comparison], tolerance: float | None, margin: float | None = None) -> str:
    return json.dumps({"tolerance": tolerance, "margin": margin, "comparisons": [asdict(r) for r in results]}, indent=1)


def time_lines(result: Comparison) -> list[str]:
    """Where a lockstep comparison's run spent its time, and how close its interval came to what
    that time allowed."""
    lines = [f"time: {result.time_split.describe()}"] if result.time_split else []
    if result.efficiency:
        e = result.efficiency
        lines.append(
            f"efficiency {e.efficiency:.0%}: reached ±{e.half_width:.2%}, where counting every second "
            f"would have given ±{e.ideal_half_width:.2%} (95%) with the steps' own noise"
        )
    return lines
