"""Train mode end to end on the CPU: `accelbench data` writes TFRecord and RecordIO that read back
equal to the source, and every framework trains the digits to the target from them."""

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import executed, load_records

# the test process never imports a framework: only workers do
MISSING = [name for name in ("tensorflow", "mxnet") if importlib.util.find_spec(name) is None]
if MISSING:
    pytest.skip(f"train-mode tests need TensorFlow and MXNet ({', '.join(MISSING)} missing)", allow_module_level=True)
pytestmark = [pytest.mark.tf, pytest.mark.mxnet]

DIGITS_EPOCH_BUDGET = 15
TARGET = 0.95


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> Path:
    """The digits, converted once for the session through `accelbench data`'s code path."""
    from accelbench.execution import conversion
    from accelbench.registry import PluginHost

    out = tmp_path_factory.mktemp("data") / "digits"
    conversion.convert_dataset("digits", out, PluginHost().backends())
    return out


def train(digits: Path, plugin: str, **changes) -> dict:
    """One train-mode run through the host (worker process, core's epoch loop), schema-checked."""
    from accelbench.environments import datasets
    from accelbench.execution import runner, training
    from accelbench.planning.config import RunConfig
    from accelbench.registry import PluginHost

    run = {k: v for k, v in changes.items() if k not in training.TrainSpec.__dataclass_fields__}
    spec = {"max_epochs": DIGITS_EPOCH_BUDGET, **{k: v for k, v in changes.items() if k not in run}}
    config = RunConfig.from_dict(training.run_config_data(datasets.load(digits), run, spec))
    [record] = executed(runner.plan(PluginHost().select([plugin]), config))
    return record


def test_both_formats_read_back_equal_to_the_digits(digits):
    from PIL import Image

    from accelbench.environments import datasets
    from accelbench.execution.conversion import dataset_writers
    from accelbench.registry import PluginHost

    manifest = datasets.load(digits)
    # the image folder: torch_ref's and jax_flax's (whose environment is made on first use)
    assert set(manifest.formats) == {"tfrecord", "recordio", "imagefolder"}
    pixels, labels = datasets.digits_pixels()
    sources = {
        split: sorted((digits / "images" / split).glob("*/*.png"), key=lambda p: (int(p.parent.name), p.name))
        for split in ("train", "val")
    }
    for path in sources["train"] + sources["val"]:  # each stored image is the digit itself
        index = int(path.stem)
        assert labels[index] == int(path.parent.name)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(path.read_bytes()))), pixels[index])
    with dataset_writers(PluginHost().backends()) as writers:
        stored = {(fmt, split): writer.read(manifest.files(fmt, split)) for fmt, writer in writers.items() for split in sources}
    for (fmt, split), read_back in stored.items():
        expected = [(datasets.file_digest(str(p)), int(p.parent.name)) for p in sources[split]]
        assert sorted(read_back) == sorted(expected), f"{fmt} {split}"
    for split in sources:  # one order in every format; the training split shuffled, not class by class
        assert stored["tfrecord", split] == stored["recordio", split] == stored["imagefolder", split]
    first_labels = [label for _, label in stored["tfrecord", "train"][:50]]
    assert len(set(first_labels)) == 10
    assert manifest.count("train") + manifest.count("val") == len(pixels) == 1797


@pytest.mark.parametrize(
    "plugin, precision",
    [
        ("tf_benchmarks", "fp32"),
        ("mxnet_ngc", "fp32"),
        ("tpu_official", "bf16"),
        pytest.param(
            "torch_ref",
            "fp32",
            marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed"),
        ),
        ("jax_flax", "bf16"),
    ],
)  # in its own environment, made on first use
def test_each_framework_trains_the_digits_to_the_target(digits, plugin, precision):
    record = train(digits, plugin, precision=precision)
    assert record["status"] == "ok", record["reason"]
    assert record["mode"] == "train" and record["precision"] == precision
    t = record["training"]
    assert t["target_reached"], t["curve"]
    assert t["epochs_to_target"] <= DIGITS_EPOCH_BUDGET
    assert t["best_eval_accuracy"] >= TARGET
    curve = t["curve"]
    assert curve[-1]["eval_accuracy"] >= TARGET > curve[0]["eval_accuracy"]
    assert curve[-1]["train_loss"] < curve[0]["train_loss"]
    assert len(curve) == t["epochs_to_target"]  # stopped at the target
    assert t["time_to_target_s"] == curve[-1]["wall_time_s"] > t["train_time_s"] > 0
    assert record["model"] == {"name": "resnet_small", "variant": None}
    assert record["config"]["time_s"] is None and record["config"]["warmup"] is None  # epochs, not a time box
    assert record["image_size"] == 8 and record["batch"]["global"] == 64
    # a default resident-memory limit, watched by the host: 3/4 of this machine's memory
    from accelbench.execution import memwatch

    assert record["config"]["memory_limit_mb"] == int(memwatch.machine_memory_mb() * 0.75)
    assert t["preprocessing"]["augmentation"] == "none"
    assert record["throughput"]["images_per_sec"] > 0
    # train mode's worker, too, says what it ran (#70: every path that starts a worker)
    worker = record["environment"]["worker"]
    assert worker["python_version"] and worker["lock"]["sha256"] and worker["packages"], worker
    # its warm-up is the first epoch: the start-up runs to the first step's end, the warm-up the epoch
    startup, memory = record["startup"], record["memory"]
    assert startup["worker_to_first_step_s"] > startup["first_step_s"] > 0 and startup["warmup_s"] >= startup["first_step_s"]
    assert memory["host_peak_bytes"] > 100 * 2**20 and memory["device_reason"].startswith("a CPU run")
    energy = record["energy"]
    assert (energy["joules"] is None) == bool(energy.get("reason"))


def test_the_same_seed_gives_the_same_curve_twice(digits):
    for plugin in ("tf_benchmarks", "mxnet_ngc"):
        first, second = (train(digits, plugin, seed=5, max_epochs=3, stop_at_target=False) for _ in range(2))
        curves = [[(row["eval_accuracy"], row["train_loss"]) for row in r["training"]["curve"]] for r in (first, second)]
        assert curves[0] == curves[1], plugin
        other = train(digits, plugin, seed=6, max_epochs=3, stop_at_target=False)
        assert [(row["eval_accuracy"], row["train_loss"]) for row in other["training"]["curve"]] != curves[0]


def test_a_target_out_of_reach_is_recorded_as_not_reached(digits):
    # the whole 20-epoch budget: MXNet's iterator crosses many of its own epochs (a hang once)
    record = train(digits, "mxnet_ngc", max_epochs=20, target_top1=0.9999, timeout_s=120)
    assert record["status"] == "ok", record["reason"]
    t = record["training"]
    assert not t["target_reached"] and t["epochs_to_target"] is None and t["time_to_target_s"] is None
    assert t["epochs_run"] == 20 and t["best_eval_accuracy"] == max(r["eval_accuracy"] for r in t["curve"])
    assert t["best_eval_accuracy"] >= 0.97  # the decays at 12 and 16 keep it converging


def test_train_command_on_an_image_folder_with_imagenet_preprocessing(accelbench_cli, tmp_path):
    """The path a real ImageNet copy takes: folder → `accelbench data` → `accelbench train`,
    random crops and flips, ResNet-50 (tiny images so it takes seconds), a price for the cost."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 16), ("val", 6)):
        for label, name in enumerate(("n01440764", "n01443537")):
            folder = tmp_path / "folder" / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                height, width = rng.integers(36, 60, 2)
                image = (rng.random((height, width, 3)) * 80 + 120 * label).astype(np.uint8)
                Image.fromarray(image).save(folder / f"{i}.JPEG")
    converted = accelbench_cli("data", str(tmp_path / "folder"), str(tmp_path / "data"))
    assert converted.returncode == 0, converted.stderr
    manifest = json.loads((tmp_path / "data" / "dataset.json").read_text())
    assert manifest["preset"] == "imagenet" and manifest["image"]["height"] is None
    result = accelbench_cli(
        "train",
        "--data",
        str(tmp_path / "data"),
        "--image-size",
        "32",
        "--global-batch",
        "8",
        "--max-epochs",
        "2",
        "--warmup-epochs",
        "1",
        "--target-top1",
        "0.5",
        "--price-per-hour",
        "12.24",
        "--plugin",
        "tf_benchmarks",
        "--plugin",
        "mxnet_ngc",
        "-o",
        str(tmp_path / "r.json"),
    )
    assert result.returncode == 0, result.stderr
    records = load_records(tmp_path / "r.json")
    assert [r["status"] for r in records] == ["ok", "ok"], [r["reason"] for r in records]
    for record in records:
        t = record["training"]
        assert record["model"] == {"name": "resnet50", "variant": "v1"}
        assert t["preprocessing"]["augmentation"] == "imagenet" and "crop" in t["preprocessing"]["train"]
        assert len(t["curve"]) >= 1 and all(0 <= r["eval_accuracy"] <= 1 for r in t["curve"])
        assert t["recipe"]["warmup_epochs"] == 1 and t["recipe"]["decay_epochs"] == [30, 60, 80]
        if t["target_reached"]:
            assert t["cost_to_target"]["cost"] == pytest.approx(t["time_to_target_s"] / 3600 * 12.24)
        else:
            assert t["cost_to_target"] is None


def test_converting_into_a_non_empty_folder_is_refused(accelbench_cli, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result = accelbench_cli("data", "digits", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "not empty" in result.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_the_readme_train_command_then_the_report(accelbench_cli, tmp_path, monkeypatch):
    """`accelbench train` with no arguments: the embedded digits (converted once into the cache),
    every built-in backend to 95%; the report then shows the curves and the table to target."""
    # a fresh accelbench cache, as on a new machine, but for the worker environments: making
    # JAX's costs half a minute and is the session's (test_open_world makes one afresh and uses it)
    from accelbench.environments import python_envs as envs

    (tmp_path / "cache" / "accelbench").mkdir(parents=True)
    envs.root().mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache" / "accelbench" / "envs").symlink_to(envs.root(), target_is_directory=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    result = accelbench_cli("train", "--price-per-hour", "6.50", "-o", str(tmp_path / "train.json"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cache" / "accelbench" / "datasets" / "digits" / "dataset.json").is_file()
    records = load_records(tmp_path / "train.json")
    assert {r["plugin"]["name"] for r in records} == {"tf_benchmarks", "mxnet_ngc", "tpu_official", "jax_flax"} | (
        {"torch_ref"} if importlib.util.find_spec("torch") else set()
    )
    [jax] = [r for r in records if r["plugin"]["name"] == "jax_flax"]  # in its own environment
    assert jax["environment"]["worker"]["kind"] == "environment", jax["environment"]
    assert all(r["training"]["target_reached"] for r in records), [r["training"]["curve"] for r in records]
    assert "epochs to target" in result.stdout
    report = accelbench_cli("report", str(tmp_path / "train.json"), "--out", str(tmp_path / "report"), "--price-per-hour", "6.50")
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    assert "accuracy_vs_epoch.png" in page and (tmp_path / "report" / "accuracy_vs_epoch.png").stat().st_size > 10_000
    for record in records:
        t = record["training"]
        assert f"{t['time_to_target_s'] / 3600:.4f}" in page
        assert t["cost_to_target"]["cost"] == pytest.approx(t["time_to_target_s"] / 3600 * 6.50)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "{tmp}/nowhere"], "not a converted dataset"),
        (["--data", "{digits}", "--target-top1", "1.5"], "--target-top1 must be in (0, 1], got 1.5"),
        (["--data", "{digits}", "--global-batch", "5000"], "larger than the training split (1437 images)"),
        (["--data", "{digits}", "--decay-epochs", "ten"], "--decay-epochs must be comma-separated integers"),
    ],
)
def test_bad_train_input_is_one_line_exit_2_nothing_written(accelbench_cli, tmp_path, digits, args, message):
    args = [a.format(tmp=tmp_path, digits=digits) for a in args]
    result = accelbench_cli("train", *args, "-o", str(tmp_path / "r.json"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert not (tmp_path / "r.json").exists()
