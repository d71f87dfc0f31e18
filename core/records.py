"""Record assembly, validation before every write, and atomic results files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import stats, validation
from .config import RunConfig
from .errors import UsageError
from .backend import Prepared
from .registry import BackendRef
from .timing import Timing

if TYPE_CHECKING:
    from .training import TrainingResult


class InvalidRecord(Exception):
    """A record failed its schema; it is never written."""


@dataclass
class TrialOutcome:
    """What one worker process produced."""

    status: str
    reason: str = ""
    timing: Timing | None = None
    prepared: Prepared | None = None
    #: what ``teardown`` returned (e.g. a weights checksum)
    final: dict[str, Any] | None = None
    #: train mode: the epoch loop's result
    training: TrainingResult | None = None
    #: the schedule's round this trial ran in, and when it started and ended (UTC)
    round: int | None = None
    started_utc: str | None = None
    ended_utc: str | None = None


@dataclass
class RunContext:
    ref: BackendRef
    config: RunConfig  # resolved
    environment: dict[str, Any]
    outcomes: list[TrialOutcome] = field(default_factory=list)
    #: the ``distributed`` block of a multi-worker run
    distributed: dict[str, Any] | None = None
    #: the ``schedule`` block: the run this record's trials were interleaved in, and why it stopped
    schedule: dict[str, Any] | None = None
    #: ``environment.worker``: the Python the workers ran when it was not the host's
    worker: dict[str, Any] | None = None


def utc_now(timespec: str = "seconds") -> str:
    return datetime.now(timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


def build(ctx: RunContext) -> dict[str, Any]:
    """The run's record, always schema-valid. When what the backend reported breaks the schema
    (a third-party plugin broke the contract), the record is ``failed`` with the validation error
    as its reason, and none of the backend's figures are kept."""
    try:
        record = _assemble(ctx)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # values no record can hold
        problems = [f"{type(exc).__name__}: {exc}"]
    else:
        problems = validation.errors("result", record)
        if not problems:
            return record
    reason = f"the backend's results broke the result schema: {problems[0]}"
    failed = [TrialOutcome("failed", reason, round=o.round, started_utc=o.started_utc, ended_utc=o.ended_utc)
              for o in ctx.outcomes] or [TrialOutcome("failed", reason)]
    return _assemble(RunContext(ctx.ref, ctx.config, ctx.environment, failed, schedule=ctx.schedule, worker=ctx.worker))


def _assemble(ctx: RunContext) -> dict[str, Any]:
    """Assemble a record; statistics only when every trial is ok (a number is never invented)."""
    info = ctx.ref.backend.describe()
    cfg = ctx.config
    reported = next((o.prepared for o in ctx.outcomes if o.prepared), None)
    prepared = reported or Prepared(device_name="")  # a run that never prepared reports nothing
    status, reason = _overall_status(ctx.outcomes)
    trials = [trial_row(i, o, cfg.global_batch) for i, o in enumerate(ctx.outcomes)]
    record = {
        "schema_version": validation.RESULT_SCHEMA_VERSION,
        "status": status,
        "reason": reason,
        "timestamp_utc": utc_now(),
        "config_hash": cfg.config_hash(),
        "plugin": {"name": ctx.ref.plugin.name, "version": ctx.ref.plugin.version},
        "backend": {"name": info.name, "version": info.version},
        # as the framework reports itself, else its installed distribution's version
        "framework": {"name": info.framework,
                      "version": prepared.framework_version or ctx.ref.framework_version()},
        "model": {"name": cfg.model, "variant": cfg.variant},
        "precision": cfg.precision,
        "device": {"kind": cfg.device, "count": cfg.device_count, "name": prepared.device_name},
        "batch": {"global": cfg.global_batch, "per_device": cfg.per_device_batch,
                  "source": cfg.batch_source, "semantics": info.batch_semantics},
        "image_size": cfg.image_size,
        "data": {"source": cfg.data, "placement": reported.data_placement if reported else None},
        "steps": _steps(cfg, prepared.steps_per_call, ctx.outcomes),
        "trials": trials,
        "throughput": None,
        "step_time": None,
        "flops": None,
        # a copy: the record is rebuilt after every trial, and its building edits settings
        "settings": dict(prepared.settings),
        "config": cfg.to_dict(),
        "environment": _environment(ctx),
        "warnings": list(prepared.warnings),
    }
    if ctx.distributed:
        record["distributed"] = dict(ctx.distributed)
    if ctx.schedule:
        record["schedule"] = ctx.schedule
    if cfg.mode == "train":
        record["mode"] = "train"
        _add_training(record, cfg, ctx.outcomes[-1])
    if status == "ok":
        _add_statistics(record, cfg)
        _add_scaling_efficiency(record)
    if prepared.flops_per_image:
        record["flops"] = {"per_image": prepared.flops_per_image, "achieved_per_s": None}
        _add_achieved_flops(record)
    return record


def _environment(ctx: RunContext) -> dict[str, Any]:
    """The host's environment, with the worker's Python and the packages installed there (read
    in the worker) when the workers ran another Python than the host's."""
    if not ctx.worker:
        return ctx.environment
    packages = {**ctx.environment["packages"], **ctx.worker.get("packages", {})}
    return {**ctx.environment, "packages": packages, "worker": ctx.worker}


def _add_achieved_flops(record: dict[str, Any]) -> None:
    if record["flops"] and record["throughput"]:
        record["flops"]["achieved_per_s"] = record["throughput"]["images_per_sec"] * record["flops"]["per_image"]
        _add_utilisation(record)


def _add_utilisation(record: dict[str, Any]) -> None:
    """Achieved / the run's peak: its accelerators' published one, else one ``accelbench peak``
    measured here with its framework."""
    from . import peaks

    device = record["device"]
    names = [device["name"]] + [a["name"] for a in record["environment"]["accelerators"] if a["kind"] == device["kind"]]
    devices = device["count"] * record.get("distributed", {}).get("workers", 1)
    peak = next((p for p in (peaks.published(device["kind"], n, record["precision"], devices) for n in names if n) if p),
                None) or peaks.measured(record["environment"], device["kind"], device["name"] or "",
                                        record["framework"]["name"], record["framework"]["version"] or "",
                                        record["precision"], devices)
    if peak:
        utilisation = record["flops"]["achieved_per_s"] / peak.flops_per_s
        record["flops"].update(peak_per_sec=peak.flops_per_s, peak_source=peak.source, utilisation=utilisation)
        if utilisation > 1:  # reported as measured, never clamped: the peak is what is wrong
            record["warnings"].append(
                f"this run achieved {utilisation:.0%} of the peak it is compared with: that peak "
                f"({peak.flops_per_s / 1e9:.0f} GFLOP/s) is too low (measured while the machine was busy?); "
                f"run `accelbench peak` again")


def _add_scaling_efficiency(record: dict[str, Any]) -> None:
    """Multi-worker throughput / (workers x the 1-worker baseline of the same per-worker batch)."""
    dist = record.get("distributed")
    if dist and dist["baseline_images_per_sec"]:
        dist["scaling_efficiency"] = record["throughput"]["images_per_sec"] / (
            dist["workers"] * dist["baseline_images_per_sec"])


def _add_training(record: dict[str, Any], cfg: RunConfig, outcome: TrialOutcome) -> None:
    """Train mode's block: the curve and time to target (absent when the run did not finish)."""
    from . import training

    if outcome.training is None:
        return
    preprocessing = record["settings"].pop("preprocessing", {})
    spec = training.TrainSpec.from_dict(cfg.train)
    record["training"] = {**training.summary(outcome.training, spec, cfg.global_batch),
                          "preprocessing": preprocessing, "cost_to_target": None}


def _steps(cfg: RunConfig, per_call: int, outcomes: list[TrialOutcome]) -> dict[str, Any]:
    """Steps actually run (the first trial's; every trial row has its own), and how their number
    was decided. In train mode: the first epoch is the warm-up, the later epochs' steps the timed
    ones. A run that never stepped shows the counts it was given (0 timed steps for a time box)."""
    trained = next((o.training for o in outcomes if o.training), None)
    if trained:
        return {"warmup": trained.steps_per_epoch, "timed": max(1, len(outcomes[-1].timing.step_times)),
                "steps_per_sample": 1}
    timing = next((o.timing for o in outcomes if o.timing), None)
    if timing:
        return {"warmup": timing.warmup_calls * per_call, "timed": timing.timed_calls * per_call,
                "steps_per_sample": per_call, "warmup_rule": timing.warmup_rule,
                "timed_rule": timing.timed_rule}
    whole = lambda steps: math.ceil(steps / per_call) * per_call  # noqa: E731
    return {"warmup": whole(cfg.warmup_steps), "timed": whole(cfg.timed_steps or 0), "steps_per_sample": per_call}


def _overall_status(outcomes: list[TrialOutcome]) -> tuple[str, str]:
    for outcome in outcomes:
        if outcome.status != "ok":
            return outcome.status, outcome.reason or outcome.status
    if not outcomes:
        return "skipped", "no trial ran"
    return "ok", ""


def trial_row(index: int, outcome: TrialOutcome, batch: int) -> dict[str, Any]:
    """One trial's (or one worker's) figures: ``batch`` images per step, as that process timed them."""
    timing = outcome.timing
    when = {key: value for key, value in (("round", outcome.round), ("started_utc", outcome.started_utc),
                                          ("ended_utc", outcome.ended_utc)) if value is not None}
    if not timing:
        return {"index": index, "status": outcome.status, "reason": outcome.reason, "images": None,
                "wall_time_s": None, "images_per_sec": None, "step_times_s": [], "losses": [], **when}
    images = batch * timing.timed_calls * timing.steps_per_call
    return {"index": index, "status": outcome.status, "reason": outcome.reason, "images": images,
            "wall_time_s": timing.wall_time_s, "images_per_sec": images / timing.wall_time_s,
            "step_times_s": list(timing.step_times), "losses": list(timing.losses),
            "warmup_steps": timing.warmup_calls * timing.steps_per_call, **when,
            **({"process": dataclasses.asdict(timing.usage)} if timing.usage else {})}


def _add_statistics(record: dict[str, Any], cfg: RunConfig) -> None:
    trials = record["trials"]
    images = sum(t["images"] for t in trials)
    wall = sum(t["wall_time_s"] for t in trials)
    steps = [s for t in trials for s in t["step_times_s"]]
    ci, method = stats.throughput_ci([t["images"] for t in trials], [t["wall_time_s"] for t in trials],
                                     steps, images_per_step=cfg.global_batch, seed=cfg.seed)
    record["throughput"] = {"images_per_sec": images / wall, "images": images, "wall_time_s": wall,
                            "ci95": list(ci), "ci_method": method}
    record["step_time"] = stats.step_time_summary(steps)
    cv = record["step_time"]["cv"]
    if cv > stats.CV_WARNING:
        record["warnings"].append(f"step-time coefficient of variation {cv:.1%} exceeds "
                                  f"{stats.CV_WARNING:.0%}: the machine was noisy or the run too short")
    if any(loss is None for t in trials for loss in t["losses"]):
        record["warnings"].append("the training loss was NaN or infinite during timed steps")
    _add_trend(record)


def _add_trend(record: dict[str, Any]) -> None:
    """Drift diagnostic: does images/sec move with the round index? (interleaved runs only)"""
    trials = [t for t in record["trials"] if "round" in t]
    found = stats.trend([t["round"] for t in trials], [t["images_per_sec"] for t in trials])
    if found is None:
        return
    record["throughput"]["trend"] = {"slope_per_round": found.slope_per_round, "p_value": found.p_value,
                                     "rounds": found.rounds}
    if found.significant:
        record["warnings"].append(
            f"images/sec trended {found.slope_per_round:+.2%} per round over {found.rounds} rounds "
            f"({found.change_over_run:+.1%} in all, p={found.p_value:.3f}): the machine's speed drifted; "
            f"compare runs interleaved in one invocation (paired rounds), not across invocations")


def check(record: dict[str, Any]) -> None:
    problems = validation.errors("result", record)
    if problems:
        raise InvalidRecord("; ".join(problems))


def check_all(records: list[dict[str, Any]]) -> None:
    for record in records:
        check(record)


def results_document(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema_version": validation.RESULT_SCHEMA_VERSION, "created_utc": utc_now(), "records": records}


def write_results(path: Path, records: list[dict[str, Any]]) -> None:
    """Validate every record, then write atomically (temp file in the same folder + rename)."""
    for record in records:
        check(record)
    document = results_document(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(document, fh, indent=1, allow_nan=False)  # NaN is not JSON: never write it
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide results from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: str | Path) -> Any:
    """A JSON document; UsageError naming the file when it is unreadable, not UTF-8 or not strict
    JSON (NaN and Infinity are not JSON)."""
    from . import inputs

    return inputs.read_json(path, "file")


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Records of an accelbench results file; UsageError when it is unreadable or invalid."""
    document = read_json(path)
    validation.validate_or_raise("results", document, what=f"results file {path}")
    return document["records"]


def merge_ranks(rank_records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from the per-rank records of a multi-host job (``accelbench merge``).

    Global images/sec = all workers' images / the slowest worker's wall time; every worker's
    figures stay in ``distributed.per_worker``.
    """
    import copy

    if not rank_records or any("distributed" not in r for r in rank_records):
        raise UsageError("merge needs the per-rank records written by `accelbench worker`")
    if len({r["config_hash"] for r in rank_records}) != 1:
        raise UsageError("these records come from different run configs")
    rows = sorted((row for r in rank_records for row in r["distributed"]["per_worker"]), key=lambda row: row["rank"])
    workers = rank_records[0]["distributed"]["workers"]
    if [row["rank"] for row in rows] != list(range(workers)):
        raise UsageError(f"need exactly one record per rank 0..{workers - 1}, got ranks {[row['rank'] for row in rows]}")
    merged = copy.deepcopy(next(r for r in rank_records if r["distributed"]["per_worker"][0]["rank"] == 0))
    merged["distributed"]["per_worker"] = rows
    failed = next((r for r in rank_records if r["status"] != "ok"), None)
    merged["timestamp_utc"] = utc_now()
    merged["throughput"] = merged["step_time"] = None
    merged["warnings"] = []
    if failed:
        merged["status"], merged["reason"] = failed["status"], f"rank {failed['distributed']['per_worker'][0]['rank']}: {failed['reason']}"
        return merged
    slowest = max(rows, key=lambda row: row["wall_time_s"])
    images = sum(row["images"] for row in rows)
    merged["trials"] = [{**merged["trials"][0], "images": images, "wall_time_s": slowest["wall_time_s"],
                         "images_per_sec": images / slowest["wall_time_s"], "step_times_s": slowest["step_times_s"]}]
    _add_statistics(merged, RunConfig(**merged["config"]))
    _add_achieved_flops(merged)
    return merged
