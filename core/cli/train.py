"""``accelbench data`` (a dataset in every framework's format) and ``accelbench train`` (train to a
target top-1: accuracy curves, time and cost to accuracy)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from accelbench.cli.app import cli
from accelbench.cli.options import (
    View,
    field_options,
    flagged_fields,
    force_option,
    int_list,
    price_options,
    selected,
    wide_option,
)
from accelbench.cli.run import execute
from accelbench.errors import UsageError
from accelbench.planning import inputs
from accelbench.planning.config import TrainSpec
from accelbench.planning.inputs import TIMEOUT
from accelbench.records.mlperf_log import Submission

if TYPE_CHECKING:
    from collections.abc import Callable

    from accelbench.environments.datasets import DatasetManifest
    from accelbench.records.results import Record


@cli.command()
@click.argument("source")
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--preset",
    type=click.Choice(["small", "imagenet"]),
    help="Training defaults for this dataset (default: small for digits, imagenet for a folder).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the digits' train/val split.")
def data(source: str, out: str, preset: str | None, seed: int) -> None:
    """Convert SOURCE into the dataset format of every installed backend that trains under OUT.

    SOURCE is 'digits' (scikit-learn's bundled handwritten digits, no download) or an image folder
    with train/<class>/* and val/<class>/* (ImageNet's layout). Every record is read back and
    checked against its source file; OUT/dataset.json is written last.
    """
    from accelbench.environments import datasets
    from accelbench.execution import conversion
    from accelbench.registry import PluginHost

    datasets.check_source(source)  # both before any framework's worker starts
    datasets.check_out(Path(out))
    try:
        manifest = conversion.convert_dataset(source, Path(out), PluginHost().backends(), preset, seed)
    except RuntimeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    counts = ", ".join(f"{split} {size.count}" for split, size in manifest.splits.items())
    click.echo(
        f"{manifest.name}: {manifest.num_classes} classes, {counts} images; "
        f"formats: {', '.join(manifest.formats)} (verified) -> {out}"
    )


# the RunConfig fields train mode takes from its command line (the rest are the timing loop's)
TRAIN_RUN_FLAGS = (
    "model",
    "variant",
    "global_batch",
    "per_device_batch",
    "device",
    "device_count",
    "precision",
    "image_size",
    "threads",
    "seed",
    "memory_limit_mb",
)


@cli.command()
@click.option("--plugin", "plugin_names", multiple=True, help="Train this plugin's backends (repeatable).")
@click.option("--backend", "backend_names", multiple=True, help="Train this backend, by name or plugin:name.")
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False),
    help="A dataset converted by `accelbench data` (default: the embedded digits).",
)
@field_options(
    TRAIN_RUN_FLAGS,
    help={
        "model": "Model, as the backend names it (default: the dataset preset's).",
        "global_batch": "Global batch (default: the preset's, 64 digits / 256 ImageNet).",
        "image_size": "Square training image side (default: the dataset's, or 224).",
        "seed": "Random seed (initialisation, shuffling, augmentation).",
    },
)
@click.option("--timeout", type=TIMEOUT, default=24 * 3600.0, show_default=True, help="Seconds before a run is stopped.")
@field_options(declared=TrainSpec)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Results file (default results/accelbench-train-<time>.json)."
)
@click.option(
    "--runs",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Train each backend N times, with seeds --seed, --seed+1, ... (MLPerf scores 5 ResNet runs).",
)
@click.option(
    "--mlperf-log",
    "mlperf_dir",
    type=click.Path(file_okay=False),
    help="Write every run as an MLPerf Training log under DIR, checked by MLCommons' compliance checker "
    "and scored by its result summarizer (needs accelbench[mlperf]).",
)
@click.option("--submission-org", help="The MLPerf logs' submission_org (default: the machine's hostname).")
@click.option(
    "--submission-platform", help="The MLPerf logs' submission_platform (default: the run's CPU or accelerator, and framework)."
)
@force_option
@wide_option
@price_options
def train(
    plugin_names: tuple[str, ...],
    backend_names: tuple[str, ...],
    data_dir: str | None,
    timeout: float,
    runs: int,
    mlperf_dir: str | None,
    submission_org: str | None,
    submission_platform: str | None,
    output: str | None,
    force: bool,
    wide: bool,
    prices: str | None,
    price: str | None,
    price_per_hour: float | None,
    price_per_kwh: float | None,
    epochs: int,
    **flags: Any,
) -> None:
    """Train to a target top-1 on a real dataset: accuracy curves, time and cost to accuracy;
    with --mlperf-log, MLPerf Training logs of the runs, checked and scored by MLCommons' tools."""
    from accelbench.analysis import cost
    from accelbench.cli.console import TrainingTable
    from accelbench.environments import datasets
    from accelbench.execution import conversion, runner
    from accelbench.planning.config import RunConfig

    refs = selected(plugin_names, backend_names, training=True)
    if isinstance(flags.get("decay_epochs"), str):
        flags["decay_epochs"] = int_list(flags["decay_epochs"], "--decay-epochs")
    target = flags.get("target_top1")
    if target is not None and not 0 < target <= 1:
        raise UsageError(f"--target-top1 must be in (0, 1], got {target:g}")
    # everything the user gave is checked before the digits are converted (workers) or a run starts
    pricing = cost.Pricing.from_flags(prices, price, price_per_hour, epochs, price_per_kwh)
    path = Path(output or f"results/accelbench-train-{datetime.now():%Y%m%d-%H%M%S}.json")
    inputs.check_output(path, force)
    finish = mlperf_packaging(mlperf_dir, force, Submission(submission_org, submission_platform))
    dataset = datasets.load(data_dir, what="--data") if data_dir is not None else datasets.load(conversion.default_dataset(refs))
    config = RunConfig.from_dict({**training_config(dataset, flags), "timeout_s": timeout})
    # run by run, every backend in each: a machine drifting over the runs shifts every backend alike
    plans = [plan for seed in range(config.seed, config.seed + runs) for plan in runner.plan(refs, config.replace(seed=seed))]
    execute(plans, path, pricing, TrainingTable, view=View(wide=wide), force=force, finish=finish)


def mlperf_packaging(folder: str | None, force: bool, submission: Submission) -> Callable[[list[Record]], list[Record]] | None:
    """What --mlperf-log does once the runs are done (None without it), checked before any run:
    MLCommons' package is installed and the folder holds no earlier submission (--force: replaced)."""
    if folder is None:
        given = "--submission-org" if submission.org is not None else "--submission-platform" if submission.platform else None
        if given:
            raise UsageError(f"{given} names the MLPerf logs: give it with --mlperf-log DIR")
        return None
    from accelbench.analysis import mlperf_checks
    from accelbench.records import mlperf_log

    mlperf_log.require()
    out = Path(folder)
    try:
        taken = mlperf_checks.check_folder(out)
        if taken and not (force and out.is_dir()):
            raise UsageError(f"--mlperf-log {taken}")
        inputs.check_writable_folder(out, "--mlperf-log")
    except OSError as exc:  # a name too long for the file system, say
        raise UsageError(f"--mlperf-log {folder!r}: {exc.strerror or exc}") from None

    def package(records: list[Record]) -> list[Record]:
        if force:
            mlperf_checks.clear(out)
        try:
            packaged = mlperf_checks.package(records, out, submission)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:  # the runs' records are written already
            click.echo(f"error: --mlperf-log: {exc}", err=True)
            sys.exit(1)
        for line in mlperf_checks.summary_lines(packaged):
            click.echo(f"mlperf: {line}", err=True)
        return packaged

    return package


def training_config(dataset: DatasetManifest, flags: dict[str, Any]) -> dict[str, Any]:
    from accelbench.execution import training

    return training.run_config_data(
        dataset, {k: flags.get(k) for k in TRAIN_RUN_FLAGS}, {k: flags.get(k) for k in flagged_fields(TrainSpec)}
    )
