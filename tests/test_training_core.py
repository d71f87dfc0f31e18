"""Train mode's core, without a framework: the schedule, the epoch loop and its stopping rule,
the record's training block, the dataset converter's checks and clean-up."""

import json
from pathlib import Path

import pytest

from accelbench.environments import datasets
from accelbench.errors import UsageError
from accelbench.execution import training
from accelbench.planning.config import RunConfig, TrainSpec


def spec(**changes) -> TrainSpec:
    base = dict(dataset="d", target_top1=0.9, max_epochs=10, base_learning_rate=0.1, warmup_epochs=5, decay_epochs=(30, 60, 80))
    return TrainSpec(**{**base, **changes})


def test_schedule_scales_with_batch_warms_up_linearly_and_decays_in_steps():
    s = spec()
    assert s.peak_learning_rate(1024) == pytest.approx(0.4)
    assert s.learning_rate(2.5, 1024) == pytest.approx(0.2)  # half-way through the 5-epoch warm-up
    assert s.learning_rate(5, 1024) == pytest.approx(0.4)
    assert s.learning_rate(29.9, 1024) == pytest.approx(0.4)
    assert s.learning_rate(30, 1024) == pytest.approx(0.04)
    assert s.learning_rate(60, 1024) == pytest.approx(0.004)
    assert s.learning_rate(85, 1024) == pytest.approx(0.0004)


class ScriptedBackend:
    """Accuracies given in advance, one per evaluation; records every learning rate it was given."""

    def __init__(self, accuracies):
        self.accuracies, self.rates, self.evaluations = list(accuracies), [], 0

    def train_step(self, learning_rate):
        self.rates.append(learning_rate)
        return 1.0 / len(self.rates)

    def evaluate(self):
        self.evaluations += 1
        return {"top1": self.accuracies.pop(0), "top5": 1.0, "loss": 0.5}


def test_stops_at_the_first_evaluation_reaching_the_target():
    backend = ScriptedBackend([0.5, 0.8, 0.93, 0.99])
    result = training.train(backend, spec(warmup_epochs=0, decay_epochs=()), steps_per_epoch=4, global_batch=256)
    assert result.epochs_to_target == 3
    assert [row.epoch_num for row in result.curve] == [1, 2, 3]
    assert [row.eval_accuracy for row in result.curve] == [0.5, 0.8, 0.93]
    assert result.time_to_target_s == result.curve[-1].wall_time_s
    assert len(backend.rates) == 12 and set(backend.rates) == {0.1}
    assert result.steady.timed_calls == 8  # epochs 2 and 3; the first is the warm-up


def test_warm_up_rates_rise_every_step_and_evaluation_follows_eval_every():
    backend = ScriptedBackend([0.1, 0.2])
    result = training.train(
        backend, spec(warmup_epochs=2, decay_epochs=(), max_epochs=4, eval_every=2), steps_per_epoch=4, global_batch=256
    )
    assert backend.rates[:9] == pytest.approx([0.1 * i / 8 for i in range(8)] + [0.1])
    assert [row.eval_accuracy for row in result.curve] == [None, 0.1, None, 0.2]
    assert backend.evaluations == 2


def test_a_target_not_reached_is_recorded_with_the_best_accuracy():
    backend = ScriptedBackend([0.3, 0.6, 0.5])
    raw = training.train(backend, spec(max_epochs=3, target_top1=0.99), steps_per_epoch=2, global_batch=64)
    block = training.summary(raw, spec(max_epochs=3, target_top1=0.99), global_batch=64)
    assert block.target_reached is False and block.epochs_to_target is None
    assert block.time_to_target_s is None
    assert (block.best_eval_accuracy, block.best_epoch, block.epochs_run) == (0.6, 2, 3)
    assert block.train_images_per_sec == pytest.approx(3 * 2 * 64 / raw.train_time_s)


def test_presets_give_defaults_and_the_user_overrides_them():
    dataset = datasets.DatasetManifest(
        schema_version="1.0.0",
        name="digits",
        source="/d/images",
        preset="small",
        classes=[str(i) for i in range(10)],
        num_classes=10,
        splits={"train": datasets.SplitSize(1437), "val": datasets.SplitSize(360)},
        image=datasets.ImageFacts(height=8, width=8, channels=1, mean=[0.5], std=[0.2], statistics_images=1437),
        formats={},
        verified="",
        root="/d",
    )
    data = training.run_config_data(dataset, {"global_batch": None, "precision": "bf16"}, {"max_epochs": 7, "target_top1": None})
    assert data["model"] == "resnet_small" and data["image_size"] == 8 and data["global_batch"] == 64
    assert data["train"]["max_epochs"] == 7 and data["train"]["target_top1"] == 0.95
    assert data["precision"] == "bf16" and data["mode"] == "train"
    per_device = training.run_config_data(dataset, {"per_device_batch": 16}, {})
    assert "global_batch" not in per_device  # the per-device batch decides


def test_index_folder_names_what_is_missing(tmp_path):
    (tmp_path / "train" / "cat").mkdir(parents=True)
    with pytest.raises(UsageError, match="no val/ folder"):
        datasets.index_folder(tmp_path)
    (tmp_path / "val" / "dog").mkdir(parents=True)
    with pytest.raises(UsageError, match="at least 2 class folders"):
        datasets.index_folder(tmp_path)
    (tmp_path / "train" / "bird").mkdir()
    with pytest.raises(UsageError, match="'dog' is not in train/"):
        datasets.index_folder(tmp_path)


def copying_writer(examples, stem):
    """A pure-Python format: one file listing the sources; 'reads back' the source digests."""
    Path(stem + ".txt").write_text("\n".join(e.path for e in examples))
    return [stem + ".txt"], [(datasets.file_digest(e.path), e.label) for e in examples]


def test_digits_convert_into_a_verified_manifest(tmp_path):
    manifest = datasets.convert("digits", tmp_path / "out", {"copy": copying_writer})
    assert (manifest.count("train"), manifest.count("val")) == (1437, 360)
    assert manifest.num_classes == 10 and manifest.image.channels == 1
    assert (manifest.image.height, manifest.image.width) == (8, 8)
    loaded = datasets.load(tmp_path / "out")
    assert loaded == manifest and loaded.formats["copy"]["train"] == ["copy/train.txt"]
    assert loaded.files("copy", "train") == [str((tmp_path / "out" / "copy" / "train.txt").resolve())]
    assert "root" not in json.loads((tmp_path / "out" / "dataset.json").read_text())  # where it is read from says that
    with pytest.raises(TypeError, match=r"DatasetManifest since plugin API 2.3: read .image"):
        loaded["image"]  # a plugin written for API 2.2 is told what to read instead


def test_a_failed_round_trip_leaves_nothing_behind(tmp_path):
    def corrupting_writer(examples, stem):
        files, digests = copying_writer(examples, stem)
        digests[3] = ("0" * 64, digests[3][1])
        return files, digests

    with pytest.raises(RuntimeError, match="example 3 .* differs after the round trip"):
        datasets.convert("digits", tmp_path / "out", {"bad": corrupting_writer})
    assert not (tmp_path / "out").exists()


def test_a_folder_without_manifest_is_not_a_dataset(tmp_path):
    with pytest.raises(UsageError, match="not a converted dataset"):
        datasets.load(tmp_path)
    (tmp_path / "dataset.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(UsageError, match="invalid dataset manifest"):
        datasets.load(tmp_path)


def test_a_single_epoch_run_times_that_epoch_and_says_nothing_was_excluded():
    result = training.train(ScriptedBackend([0.99]), spec(max_epochs=1), steps_per_epoch=5, global_batch=64)
    assert result.steady.timed_calls == 5 and result.steady.wall_time_s == pytest.approx(result.train_time_s)
    assert result.steady.warmup_calls == 0 and result.steady.warmup_rule.startswith("none: one epoch ran")


def test_a_run_of_several_epochs_excludes_exactly_the_first():
    result = training.train(
        ScriptedBackend([0.5, 0.6, 0.7]), spec(max_epochs=3, target_top1=0.99), steps_per_epoch=5, global_batch=64
    )
    assert result.steady.warmup_calls == 5 and result.steady.timed_calls == 10
    assert result.steady.warmup_rule == "the first epoch" and result.steady.timed_rule == "the epochs after the first"


def test_a_train_config_holds_a_typed_spec_and_hashes_as_its_json():
    """``RunConfig.train`` is a TrainSpec (read as attributes, by core and the plugins alike); its
    record form is the same JSON object as before, so a config hash does not change with the type."""
    data = {"mode": "train", "data": "digits", "train": {"dataset": "/d", "target_top1": 0.9, "max_epochs": 3}}
    config = RunConfig.from_dict(data)
    assert isinstance(config.train, TrainSpec) and config.train_spec.max_epochs == 3
    assert config.to_dict()["train"] == TrainSpec.from_dict(data["train"]).to_dict()
    assert RunConfig.from_fields(config.to_dict()) == config
    assert RunConfig.from_fields(config.to_dict()).config_hash() == config.config_hash()
    with pytest.raises(TypeError, match=r"TrainSpec since plugin API 2.3: read .momentum, not \['momentum'\]"):
        config.train_spec["momentum"]
