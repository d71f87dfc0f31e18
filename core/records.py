"""Record assembly, validation before every write, and atomic results files."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import stats, validation
from .config import RunConfig
from .errors import UsageError
from .registry import BackendRef


class InvalidRecord(Exception):
    """A record failed its schema; it is never written."""


@dataclass
class TrialOutcome:
    """What one worker process produced."""

    status: str
    reason: str = ""
    timing: dict[str, Any] | None = None
    prepared: dict[str, Any] | None = None


@dataclass
class RunContext:
    ref: BackendRef
    config: RunConfig  # resolved
    environment: dict[str, Any]
    outcomes: list[TrialOutcome] = field(default_factory=list)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def build(ctx: RunContext) -> dict[str, Any]:
    """Assemble a record; statistics only when every trial is ok (a number is never invented)."""
    info = ctx.ref.backend.describe()
    cfg = ctx.config
    prepared = next((o.prepared for o in ctx.outcomes if o.prepared), None) or {}
    status, reason = _overall_status(ctx.outcomes)
    trials = [_trial(i, o, cfg.global_batch) for i, o in enumerate(ctx.outcomes)]
    record = {
        "schema_version": validation.RESULT_SCHEMA_VERSION,
        "status": status,
        "reason": reason,
        "timestamp_utc": utc_now(),
        "config_hash": cfg.config_hash(),
        "plugin": {"name": ctx.ref.plugin.name, "version": ctx.ref.plugin.version},
        "backend": {"name": info.name, "version": info.version},
        "framework": {"name": info.framework,
                      "version": prepared.get("framework_version", "")},
        "model": {"name": cfg.model, "variant": cfg.variant},
        "precision": cfg.precision,
        "device": {"kind": cfg.device, "count": cfg.device_count, "name": prepared.get("device_name", "")},
        "batch": {"global": cfg.global_batch, "per_device": cfg.per_device_batch,
                  "source": cfg.batch_source, "semantics": info.batch_semantics},
        "image_size": cfg.image_size,
        "data": {"source": cfg.data, "placement": prepared.get("data_placement")},
        "steps": _steps(cfg, prepared.get("steps_per_call", 1)),
        "trials": trials,
        "throughput": None,
        "step_time": None,
        "flops": None,
        "settings": prepared.get("settings", {}),
        "config": cfg.to_dict(),
        "environment": ctx.environment,
        "warnings": [],
    }
    if status == "ok":
        _add_statistics(record, ctx.outcomes, cfg)
    if prepared.get("flops_per_image"):
        ips = record["throughput"]["images_per_sec"] if record["throughput"] else None
        record["flops"] = {"per_image": prepared["flops_per_image"],
                           "achieved_per_s": ips * prepared["flops_per_image"] if ips else None}
    return record


def _steps(cfg: RunConfig, per_call: int) -> dict[str, int]:
    """Steps actually run: whole calls of ``per_call`` steps each (the worker rounds up)."""
    whole = lambda steps: math.ceil(steps / per_call) * per_call  # noqa: E731
    return {"warmup": whole(cfg.warmup_steps), "timed": whole(cfg.timed_steps), "steps_per_sample": per_call}


def _overall_status(outcomes: list[TrialOutcome]) -> tuple[str, str]:
    for outcome in outcomes:
        if outcome.status != "ok":
            return outcome.status, outcome.reason or outcome.status
    if not outcomes:
        return "skipped", "no trial ran"
    return "ok", ""


def _trial(index: int, outcome: TrialOutcome, global_batch: int) -> dict[str, Any]:
    timing = outcome.timing
    if not timing:
        return {"index": index, "status": outcome.status, "reason": outcome.reason, "images": None,
                "wall_time_s": None, "images_per_sec": None, "step_times_s": [], "losses": []}
    images = global_batch * timing["timed_calls"] * timing["steps_per_call"]
    return {"index": index, "status": outcome.status, "reason": outcome.reason, "images": images,
            "wall_time_s": timing["wall_time_s"], "images_per_sec": images / timing["wall_time_s"],
            "step_times_s": timing["step_times"], "losses": timing["losses"]}


def _add_statistics(record: dict[str, Any], outcomes: list[TrialOutcome], cfg: RunConfig) -> None:
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


def check(record: dict[str, Any]) -> None:
    problems = validation.errors("result", record)
    if problems:
        raise InvalidRecord("; ".join(problems))


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
            json.dump(document, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Records of an accelbench results file; UsageError when it is unreadable or invalid."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON ({exc})") from None
    validation.validate_or_raise("results", document, what=f"results file {path}")
    return document["records"]
