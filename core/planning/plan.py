"""Planning: the request checked against every selected backend's own vocabulary, resolved into
one plan per (backend, sweep point) -- all before any worker starts.

Core knows no model, variant, precision, device kind or engine by name: what a run may ask for is
what the selected backends declare (``BackendInfo``). A value no selected backend offers is a
usage error (exit 2) naming what each offers; a value some offer gives the others an
``unavailable`` record, so a run over every framework still covers those that can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accelbench.backend import BackendInfo, option_spec
from accelbench.environments import datasets
from accelbench.environments import machine as environment
from accelbench.environments import python_envs as envs
from accelbench.errors import UsageError
from accelbench.execution import allocators, memwatch, training
from accelbench.planning import config as configuration
from accelbench.planning.config import RunConfig
from accelbench.records.results import TrialOutcome
from accelbench.registry import BackendRef


@dataclass
class Plan:
    ref: BackendRef
    config: RunConfig  # resolved (as far as a refused run allows)
    #: the host's refusal (framework missing, unsupported request), when there is one
    precheck: TrialOutcome | None = None
    #: the Python its workers run (the host's, the user's, or an environment made on first use)
    setup: envs.WorkerSetup = envs.HOST


def plan(
    refs: list[BackendRef], config: RunConfig, pythons: dict[str, str] | None = None, matrix: list[tuple[str, ...]] | None = None
) -> list[Plan]:
    """Resolve every (backend, worker setup, sweep point) up front, so bad input fails before
    anything runs. ``pythons``: plugin name -> a Python the user made (``--python``);
    ``matrix``: requirement sets, one run of every backend under each (``--env``)."""
    _refuse_unknown_options(refs, config)
    _refuse_bad_option_values(refs, config)
    _refuse_bad_levers(refs, config)
    _refuse_unoffered(refs, config)
    _refuse_unknown_plugins(refs, pythons or {})
    allocators.library(config.allocator)  # one that cannot be had here is refused now, not per worker
    _refuse_unavailable_huge_pages(refs, config)
    counts = environment.device_counts()
    dataset = datasets.load(config.train_spec.dataset) if config.mode == "train" else None
    plans = []
    for ref in refs:
        for setup in envs.setups_for(ref, pythons, matrix):
            for point in configuration.expand_sweep(config):
                plans += _plans_of(ref, setup, point, counts, dataset)
    _refuse_levers_resolved_to_nothing(plans)
    return plans


def _refuse_levers_resolved_to_nothing(plans: list[Plan]) -> None:
    """A lever whose run, resolved, is every selected backend's run as configured (``allocator=
    system`` where "auto" already picks it) would compare a run with itself: refused, after the
    resolution that shows it and before any worker starts."""
    resolved = {
        (id(p.ref), p.setup, p.config.workers, p.config.global_batch, configuration.lever_text(p.config.lever)): p for p in plans
    }
    idle: dict[str, bool] = {}
    for (ref, setup, workers, batch, text), lever_plan in resolved.items():
        base = resolved.get((ref, setup, workers, batch, ""))
        if text and base is not None:
            same = lever_plan.config.replace(lever={}) == base.config
            idle[text] = idle.get(text, True) and same
    for text, unchanged in idle.items():
        if unchanged:
            raise UsageError(f"--lever {text}: every selected backend runs so as configured, so it changes nothing")


def _plans_of(
    ref: BackendRef, setup: envs.WorkerSetup, point: RunConfig, counts: dict[str, int], dataset: datasets.DatasetManifest | None
) -> list[Plan]:
    refusal = _host_precheck(ref, point, setup) or _dataset_precheck(ref, dataset)
    if refusal:
        return [Plan(ref, _resolve_for_record(ref, point, counts), refusal, setup)]
    resolved = _resolve(ref, point, counts)
    if dataset and training.steps_per_epoch(dataset, resolved.resolved_global_batch) < 1:
        raise UsageError(
            f"global batch {resolved.global_batch} is larger than the training split ({dataset.count('train')} images)"
        )
    if resolved.workers > 1 and resolved.scaling_baseline:
        return [Plan(ref, configuration.single_worker_baseline(resolved), setup=setup), Plan(ref, resolved, setup=setup)]
    return [Plan(ref, resolved, setup=setup)]


def _refuse_unknown_plugins(refs: list[BackendRef], pythons: dict[str, str]) -> None:
    selected = {ref.plugin.name for ref in refs}
    for name in pythons:
        if name not in selected:
            raise UsageError(
                f"--python {name}=...: no selected backend is from plugin {name!r} "
                f"(selected: {', '.join(sorted(selected)) or 'none'})"
            )


def offers(info: BackendInfo, model: str | None) -> dict[str, tuple[str, ...]]:
    """What a backend offers a run of ``model`` (its first model when None), by config field."""
    model = model or info.models[0]
    return {"model": info.models, "variant": info.variants.get(model, ()), "precision": info.precisions, "device": info.devices}


def _unoffered(info: BackendInfo, config: RunConfig) -> tuple[str, str] | None:
    """The first (field, value) of the request this backend does not offer, or None."""
    offered = offers(info, config.model)
    requested = {
        "model": config.model,
        "variant": config.variant,
        "precision": config.precision,
        "device": None if config.device == "auto" else config.device,
    }
    for what, value in requested.items():
        if value is not None and value not in offered[what]:
            return what, value
    return None


def _refuse_unoffered(refs: list[BackendRef], config: RunConfig) -> None:
    """A value none of the selected backends offers is the user's mistake: one line, exit 2."""
    if not refs:
        return
    misses = [miss for ref in refs if (miss := _unoffered(ref.backend.describe(), config))]
    if len(misses) == len(refs):
        what, value = misses[0]
        offered = "; ".join(f"{r.id}: {', '.join(offers(r.backend.describe(), config.model)[what]) or 'none'}" for r in refs)
        raise UsageError(f"{what} {value!r}: no selected backend offers it ({what}s offered: {offered})")


def _refuse_unavailable_huge_pages(refs: list[BackendRef], config: RunConfig) -> None:
    """``--huge-pages on`` where a selected backend's allocator or this kernel cannot give them."""
    if config.huge_pages != allocators.ON:
        return
    for ref in refs:
        problem = allocators.huge_pages_problem(allocators.resolve(config.allocator, ref.backend.describe().allocator))
        if problem:
            raise UsageError(f"{problem} ({ref.id})")


def _refuse_unknown_options(refs: list[BackendRef], config: RunConfig) -> None:
    known = {key for ref in refs for key in ref.backend.describe().options}
    unknown = sorted(set(config.options) - known)
    if unknown:
        raise UsageError(f"unknown option {unknown[0]!r} for the selected backends (known: {', '.join(sorted(known)) or 'none'})")


def _refuse_bad_option_values(refs: list[BackendRef], config: RunConfig) -> None:
    """Each value against every selected backend's declaration of its key."""
    for key, value in config.options.items():
        for ref in refs:
            declared = ref.backend.describe().options.get(key)
            problem = option_spec(declared).problem(value) if declared is not None else None
            if problem:
                raise UsageError(f"--option {key}: {problem} ({ref.id})")


def _refuse_bad_levers(refs: list[BackendRef], config: RunConfig) -> None:
    """A lever's options are checked as ``--option``'s and its run fields as the flags', its
    allocator and huge pages as this machine can give them; a lever that changes nothing would
    compare a run with itself; a run named by a lever it does not have (a config file's
    ``lever``) would be labelled with what it did not ask for."""
    for lever in config.levers or ():
        _refuse_bad_lever(refs, config, lever)
    if config.lever and len(configuration.lever_unchanged(config, config.lever)) != len(config.lever):
        raise UsageError(f"lever {configuration.lever_text(config.lever)}: a run's lever must be among its settings")


def _refuse_bad_lever(refs: list[BackendRef], config: RunConfig, lever: dict[str, Any]) -> None:
    text = configuration.lever_text(lever)
    fields, options = configuration.split_lever(lever)
    try:
        _refuse_unknown_options(refs, RunConfig(options=options))
        _refuse_bad_option_values(refs, RunConfig(options=options))
        RunConfig.from_dict(fields)  # each field's value as the config schema has it
        applied = configuration.with_lever(config.replace(levers=None), lever)
        allocators.library(applied.allocator)
        _refuse_unavailable_huge_pages(refs, applied)
    except UsageError as error:
        raise UsageError(f"--lever {text}: {error}") from None
    if configuration.lever_unchanged(config, lever) == list(lever):
        raise UsageError(f"--lever {text}: the run as configured already has it, so it changes nothing")


def _resolve(ref: BackendRef, config: RunConfig, counts: dict[str, int]) -> RunConfig:
    info = ref.backend.describe()
    device = pick_device(info.devices, config.device, counts)
    count = config.device_count or max(1, counts.get(device, 0))
    resolved = resolve(config, info, device, count)
    if resolved.mode == "train" and resolved.memory_limit_mb is None:
        # a runaway input pipeline stops with a record, before the kernel's OOM killer picks a victim
        resolved = resolved.replace(memory_limit_mb=memwatch.default_train_limit_mb())
    return resolved


def _resolve_for_record(ref: BackendRef, config: RunConfig, counts: dict[str, int]) -> RunConfig:
    """A resolved config for a refused run's record: the batch cannot be wrong here."""
    try:
        return _resolve(ref, config, counts)
    except Exception:  # noqa: BLE001 - the refusal reason is what the record reports
        info = ref.backend.describe()
        device = config.device if config.device != "auto" else "cpu"
        return resolve(config.replace(global_batch=None, per_device_batch=None), info, device, 1)


def pick_device(supported: tuple[str, ...], requested: str, counts: dict[str, int]) -> str:
    """The requested device kind; for 'auto' the first kind the backend lists that this machine
    has besides its CPU (an accelerator), else the CPU."""
    if requested != "auto":
        return requested
    present = [kind for kind in supported if kind != "cpu" and counts.get(kind, 0) > 0]
    return present[0] if present else "cpu"


def _host_precheck(ref: BackendRef, config: RunConfig, setup: envs.WorkerSetup = envs.HOST) -> TrialOutcome | None:
    """Refusals the host can decide without a worker: missing framework, unsupported request."""
    info = ref.backend.describe()
    # a framework in another Python is looked for there, by its worker
    missing = ref.unavailable_reason() if setup.kind == "host" else None
    if missing:
        return TrialOutcome("unavailable", missing)
    miss = _unoffered(info, config)
    if miss:
        what, value = miss
        offered = offers(info, config.model)[what]
        return TrialOutcome("unavailable", f"{info.name} does not offer {what} {value} (offers: {', '.join(offered) or 'none'})")
    if config.workers > 1 and ref.backend.engine is None:
        return TrialOutcome("unavailable", f"{info.name} has no multi-worker engine")
    return None


def _dataset_precheck(ref: BackendRef, dataset: datasets.DatasetManifest | None) -> TrialOutcome | None:
    """Train mode: the backend must train from a format this dataset was converted into."""
    if dataset is None:
        return None
    fmt = ref.backend.describe().data_format
    if fmt is None:
        return TrialOutcome("unavailable", f"{ref.id} has no train mode")
    if fmt not in dataset.formats:
        return TrialOutcome(
            "unavailable",
            f"the dataset at {dataset.root} has no {fmt} files "
            f"(formats: {', '.join(dataset.formats)}); convert it again "
            f"with `accelbench data` where {ref.backend.describe().framework} is installed",
        )
    return None


def resolve(config: RunConfig, info: BackendInfo, device: str, device_count: int) -> RunConfig:
    """Fill every backend-dependent default and derive the missing batch size.

    Raises UsageError for a batch that cannot be split evenly over the devices.
    """
    global_batch, per_device, source = _resolve_batch(config, info, device, device_count * config.workers)
    model = config.model or info.models[0]
    allocator = allocators.resolve(config.allocator, info.allocator)
    return config.replace(
        # train mode times epochs, not a warm-up and a timed phase: it claims neither
        **(configuration.timed_phase(config) if config.mode == "throughput" else {}),
        model=model,
        # a model the backend declares no variants of has none
        variant=config.variant or info.default_variant(model),
        allocator=allocator,
        huge_pages=allocators.resolve_huge_pages(config.huge_pages, info.huge_pages, allocator),
        precision=config.precision or info.precisions[0],
        device=device,
        device_count=device_count,
        global_batch=global_batch,
        per_device_batch=per_device,
        # a resolved config (a record's, replayed by ``accelbench rerun``) keeps where its batch came from
        batch_source=config.batch_source or source,
        threads=config.effective_threads,
    )


def _resolve_batch(config: RunConfig, info: BackendInfo, device: str, count: int) -> tuple[int, int, str]:
    if config.global_batch is not None and config.per_device_batch is not None:
        if config.global_batch != config.per_device_batch * count:
            raise UsageError(
                f"global_batch {config.global_batch} != per_device_batch {config.per_device_batch}"
                f" x {count} devices: give one of them"
            )
        return config.global_batch, config.per_device_batch, "config"
    if config.global_batch is not None:
        return (*_split_global(config.global_batch, count), "config")
    if config.per_device_batch is not None:
        return config.per_device_batch * count, config.per_device_batch, "config"
    default = info.default_batch.get(device) or info.default_batch.get("cpu") or 8
    if info.batch_semantics == "global":
        return (*_split_global(default, count), "backend default")
    return default * count, default, "backend default"


def _split_global(global_batch: int, count: int) -> tuple[int, int]:
    if global_batch % count:
        raise UsageError(f"global batch {global_batch} does not divide by {count} devices")
    return global_batch, global_batch // count
