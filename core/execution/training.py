"""Train mode: time to accuracy on a real dataset, with one recipe for every framework.

The epoch loop lives here, in core, like the timing loop: a backend only prepares the model and
its input pipeline, runs one synced step at the learning rate it is given, and evaluates the
held-out split. So the learning-rate schedule (scaled by batch/256, linear warm-up, step decays),
the evaluation cadence and the stopping rule are the same in every framework, and a difference in
accuracy is the framework's, not the recipe's. Key names follow MLPerf Training's
(``epoch_num``, ``eval_accuracy``, ``global_batch_size``, ``opt_base_learning_rate``, ...).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field, fields
from importlib import resources
from typing import TYPE_CHECKING, Any, Callable

from accelbench.errors import UsageError
from accelbench.execution.energy import EnergyUse, Meter
from accelbench.execution.timing import ProcessUsage, Timing, TimingPlan, run_timed
from accelbench.planning.config import TrainSpec
from accelbench.records.blocks import CurvePoint, Training

if TYPE_CHECKING:
    from accelbench.backend import Backend
    from accelbench.environments.datasets import DatasetManifest
    from accelbench.planning.config import RunConfig


def presets() -> dict[str, dict[str, Any]]:
    """Defaults per dataset preset (the manifest says which), every field overridable. Recipes
    are data (``data/train_presets.json``), including the model each was written for."""
    found: dict[str, dict[str, Any]] = json.loads(resources.files("accelbench").joinpath("data/train_presets.json").read_text())
    return found


#: the central crop kept for ImageNet evaluation (224 of 256), in every framework
EVAL_CROP_FRACTION = 0.875


@dataclass
class TrainingResult:
    steps_per_epoch: int
    curve: list[CurvePoint] = field(default_factory=list)
    #: the wall clock (seconds since the epoch) when the first step began: the run's start, which
    #: every ``*_s`` time of the curve counts from
    run_start_unix_s: float = 0.0
    #: images in the dataset's splits (MLPerf's ``train_samples`` and ``eval_samples``)
    train_samples: int | None = None
    eval_samples: int | None = None
    epochs_to_target: int | None = None
    time_to_target_s: float | None = None
    train_time_s: float = 0.0
    eval_time_s: float = 0.0
    wall_time_s: float = 0.0
    #: the timing loop's result for the epochs after the first (the first includes compilation),
    #: or for the first when no other ran
    steady: Timing | None = None


def train(
    backend: Backend,
    spec: TrainSpec,
    steps_per_epoch: int,
    global_batch: int,
    progress: Callable[[str, int, int | None], None] | None = None,
    meter: Meter | None = None,
) -> TrainingResult:
    """Train epoch by epoch, evaluating every ``eval_every`` epochs (and after the last one).

    Wall time counts everything from the first step: training, evaluation, the input pipeline,
    as MLPerf's time to train does. ``train_time_s`` is the training steps alone. The first epoch
    is the warm-up of the steady figures (and of the record's start-up); ``meter`` reads the energy
    of the later epochs' steps, which the steady figures time.
    """
    result = TrainingResult(steps_per_epoch)
    # one reading of each clock: the curve counts from ``start``, the MLPerf log places it by the wall clock
    result.run_start_unix_s, start = time.time(), time.perf_counter()
    steady_times: list[float] = []
    steady_losses: list[float | None] = []
    energies: list[EnergyUse | None] = []
    usages: list[ProcessUsage | None] = []
    for epoch in range(1, spec.max_epochs + 1):
        rates = epoch_rates(spec, epoch, steps_per_epoch, global_batch)
        feed = iter(rates)
        started = time.perf_counter() - start
        timing = run_timed(
            lambda: backend.train_step(next(feed)),
            TimingPlan(0, timed_calls=steps_per_epoch),
            meter=meter if epoch > 1 else None,
            first_steps=epoch == 1,
        )
        result.train_time_s += timing.wall_time_s
        finite = [x for x in timing.losses if x is not None]
        trained = time.perf_counter() - start
        row = CurvePoint(
            epoch,
            rates[-1],
            sum(finite) / len(finite) if finite else None,
            result.train_time_s,
            trained,
            started_s=started,
            trained_s=trained,
        )
        if epoch == 1:
            first = timing
            marks = timing.startup and dataclasses.replace(timing.startup, warmup_ended=time.monotonic())
        else:
            steady_times += timing.step_times
            steady_losses += timing.losses
            energies.append(timing.energy)
            usages.append(timing.usage)
        if epoch % spec.eval_every == 0 or epoch == spec.max_epochs:
            _evaluate(backend, row, result, start)
            reached = row.eval_accuracy is not None and row.eval_accuracy >= spec.target_top1
            if result.epochs_to_target is None and reached:
                result.epochs_to_target, result.time_to_target_s = epoch, row.wall_time_s
        result.curve.append(row)
        if progress:
            progress("epoch", epoch, spec.max_epochs)
        if result.epochs_to_target is not None and spec.stop_at_target:
            break
    result.wall_time_s = time.perf_counter() - start
    if steady_times:
        result.steady = Timing(
            step_times=steady_times,
            wall_time_s=sum(steady_times),
            timed_calls=len(steady_times),
            steps_per_call=1,
            losses=steady_losses,
            warmup_calls=first.timed_calls,
            warmup_rule="the first epoch",
            timed_rule="the epochs after the first",
            energy=EnergyUse.summed(energies) if meter else None,
            startup=marks,
            usage=ProcessUsage.summed(usages),
        )
    else:  # one epoch only: its steps, graph building included, are all there is, and none was excluded
        result.steady = Timing(
            step_times=first.step_times,
            wall_time_s=first.wall_time_s,
            timed_calls=first.timed_calls,
            steps_per_call=1,
            losses=first.losses,
            warmup_rule="none: one epoch ran, so it is timed, graph building included",
            timed_rule="the one epoch",
            startup=marks,
            usage=first.usage,
        )
    return result


def steps_per_epoch(dataset: DatasetManifest, global_batch: int) -> int:
    """Whole batches per pass over the training split (the last partial batch is dropped)."""
    return dataset.count("train") // global_batch


def epoch_rates(spec: TrainSpec, epoch: int, steps_per_epoch: int, global_batch: int) -> list[float]:
    """The learning rate of every step of epoch ``epoch`` (1-based), at the fractional epoch where
    the step starts (as the official TPU ResNet computes it: warm-up from 0, per step)."""
    return [spec.learning_rate(epoch - 1 + step / steps_per_epoch, global_batch) for step in range(steps_per_epoch)]


def _evaluate(backend: Backend, row: CurvePoint, result: TrainingResult, start: float) -> None:
    began = time.perf_counter()
    row.eval_started_s = began - start
    scores = backend.evaluate()
    result.eval_time_s += time.perf_counter() - began
    row.eval_accuracy, row.eval_top5_accuracy, row.eval_loss = scores["top1"], scores.get("top5"), scores.get("loss")
    row.wall_time_s = time.perf_counter() - start


def summary(
    result: TrainingResult,
    spec: TrainSpec,
    global_batch: int,
    preprocessing: dict[str, Any] | None = None,
    init_s: float | None = None,
) -> Training:
    """The record's ``training`` block from the worker's result (no cost yet: ``accelbench.analysis.cost``
    prices it). ``init_s``: from the host starting the worker to the first step (MLPerf's
    initialisation: interpreter, imports, model and input pipeline)."""
    evaluated = [row for row in result.curve if row.eval_accuracy is not None]
    best = max(evaluated, key=lambda row: row.eval_accuracy or 0.0, default=None)
    epochs = len(result.curve)
    return Training(
        dataset=spec.dataset,
        target_top1=spec.target_top1,
        target_reached=result.epochs_to_target is not None,
        epochs_to_target=result.epochs_to_target,
        time_to_target_s=result.time_to_target_s,
        best_eval_accuracy=best.eval_accuracy if best else None,
        best_epoch=best.epoch_num if best else None,
        epochs_run=epochs,
        wall_time_s=result.wall_time_s,
        train_time_s=result.train_time_s,
        eval_time_s=result.eval_time_s,
        train_images_per_sec=epochs * result.steps_per_epoch * global_batch / result.train_time_s
        if result.train_time_s > 0
        else None,
        global_batch_size=global_batch,
        opt_base_learning_rate=spec.peak_learning_rate(global_batch),
        recipe=spec.to_dict(),
        curve=list(result.curve),
        preprocessing=preprocessing or {},
        run_start_unix_s=result.run_start_unix_s or None,
        init_s=init_s,
        train_samples=result.train_samples,
        eval_samples=result.eval_samples,
    )


def run_config_data(dataset: DatasetManifest, run: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """RunConfig data for train mode: the dataset preset's defaults, under what the user gave.

    ``run`` holds RunConfig fields, ``spec`` TrainSpec fields; None means "not given".
    """
    preset = presets()[dataset.preset]
    spec_fields = {f.name for f in fields(TrainSpec)}
    train = {k: v for k, v in preset.items() if k in spec_fields}
    train.update({k: v for k, v in spec.items() if v is not None})
    train["dataset"] = dataset.root
    train = TrainSpec.from_dict(train).to_dict()  # every field, defaults included, in the record
    given = {k: v for k, v in run.items() if v is not None}
    data = {
        "mode": "train",
        "data": dataset.name,
        "model": preset["model"],
        "trials": 1,
        "num_classes": dataset.num_classes,
        "train": train,
        "warmup_steps": 0,
    }
    if "global_batch" not in given and "per_device_batch" not in given:
        data["global_batch"] = preset["global_batch"]
    data["image_size"] = preset["image_size"] or dataset.image.height
    data.update(given)
    if data["image_size"] is None:
        raise UsageError(f"the images of {dataset.root} differ in size: give --image-size")
    return data


def describe_preprocessing(
    config: RunConfig, dataset: DatasetManifest, imagenet: dict[str, str], pipeline: str
) -> dict[str, Any]:
    """What a backend's input pipelines did, for the record; ``imagenet`` says how this
    framework's pipeline crops for training and evaluation under the ImageNet augmentation."""
    augmentation = config.train_spec.augmentation
    steps = (
        imagenet
        if augmentation == "imagenet"
        else {"train": "none (resize only if the stored size differs)", "eval": "same as train"}
    )
    return {
        "augmentation": augmentation,
        **steps,
        "normalise": "per-channel (x - mean) / std of the training split",
        "mean": dataset.image.mean,
        "std": dataset.image.std,
        "image_size": config.image_size,
        "pipeline": pipeline,
    }
