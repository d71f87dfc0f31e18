"""Units of the host: batch resolution, statistics, the timing loop, records and the schema."""

import copy
import json
import time
from pathlib import Path

import pytest

from accelbench import BackendInfo, RunConfig, hookspecs
from accelbench.analysis.stats import step_time_summary, throughput_ci
from accelbench.errors import UsageError
from accelbench.execution.timing import TimingPlan, run_timed
from accelbench.planning.plan import resolve
from accelbench.records import validation

PER_DEVICE = BackendInfo(
    name="b", framework="f", requires=(), models=("m",), batch_semantics="per_device", default_batch={"cpu": 8, "gpu": 256}
)
GLOBAL = BackendInfo(
    name="b", framework="f", requires=(), models=("m",), batch_semantics="global", default_batch={"cpu": 8, "gpu": 768}
)


@pytest.mark.parametrize(
    "info, config, device, count, expected",
    [
        (PER_DEVICE, RunConfig(), "gpu", 4, (1024, 256, "backend default")),
        (GLOBAL, RunConfig(), "gpu", 4, (768, 192, "backend default")),
        (GLOBAL, RunConfig(), "cpu", 1, (8, 8, "backend default")),
        (GLOBAL, RunConfig(per_device_batch=32), "gpu", 2, (64, 32, "config")),
        (PER_DEVICE, RunConfig(global_batch=12), "cpu", 3, (12, 4, "config")),
        (PER_DEVICE, RunConfig(per_device_batch=4, workers=2), "cpu", 1, (8, 4, "config")),
    ],
)
def test_batch_resolution(info, config, device, count, expected):
    resolved = resolve(config, info, device, count)
    assert (resolved.global_batch, resolved.per_device_batch, resolved.batch_source) == expected


@pytest.mark.parametrize(
    "config, message",
    [
        (RunConfig(global_batch=10), "global batch 10 does not divide by 4 devices"),
        (RunConfig(global_batch=8, per_device_batch=4), "global_batch 8 != per_device_batch 4 x 4 devices"),
    ],
)
def test_impossible_batches_are_refused(config, message):
    with pytest.raises(UsageError, match=message):
        resolve(config, GLOBAL, "gpu", 4)


def test_step_time_summary_on_known_values():
    summary = step_time_summary([1.0, 2.0, 3.0, 4.0, 100.0])
    assert summary.median_s == 3.0 and summary.mean_s == 22.0
    assert summary.iqr_s == 2.0  # 4 - 2
    assert summary.jitter_s == pytest.approx(1.4826 * 1.0)  # MAD of |x - 3| = [2,1,0,1,97] -> 1
    assert summary.cv == pytest.approx(summary.stdev_s / 22.0)


def test_throughput_interval_over_steps_brackets_the_pooled_rate():
    steps = [0.1, 0.11, 0.09, 0.1, 0.12, 0.1, 0.095, 0.105]
    (low, high), method = throughput_ci([8 * len(steps)], [sum(steps)], steps, images_per_step=8)
    assert method == "bootstrap over steps" and low < 8 * len(steps) / sum(steps) < high


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_timing_loop_excludes_warmup_and_divides_calls_into_steps():
    calls = []

    def step():
        calls.append(1)
        spin(0.004)
        return 1.0

    timing = run_timed(step, TimingPlan(warmup_calls=3, timed_calls=5, steps_per_call=2))
    assert len(calls) == 8 and len(timing.step_times) == 5 and timing.timed_steps == 10
    assert sum(timing.step_times) * 2 == pytest.approx(timing.wall_time_s)
    assert all(0.0019 < t < 0.01 for t in timing.step_times)  # each call of 4 ms covers 2 steps


def test_nan_losses_are_kept_as_null():
    values = iter([1.0, float("nan"), float("inf")])
    timing = run_timed(lambda: next(values), TimingPlan(warmup_calls=0, timed_calls=3))
    assert timing.losses == [1.0, None, None]


@pytest.fixture
def good_record(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    assert accelbench_cli("run", "--plugin", "sleepy", "--timed-steps", "5", "-o", str(out)).returncode == 0
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.update(timestamp_utc="yesterday"), "$.timestamp_utc: 'yesterday' is not a 'date-time'"),
        (lambda r: r.update(status="failed"), "$.reason: '' should be non-empty"),
        (lambda r: r.update(status="failed", reason="x"), "$.throughput: "),
        (lambda r: r["batch"].update(per_device=0), "$.batch.per_device: 0 is less than the minimum of 1"),
        (lambda r: r.pop("environment"), "'environment' is a required property"),
        (
            lambda r: r["environment"].update(memory_returned_to_host="yes"),
            "$.environment.memory_returned_to_host: 'yes' is not of type 'boolean'",
        ),
    ],
)
def test_hand_made_bad_records_are_rejected_naming_the_field(good_record, accelbench_cli, tmp_path, change, message):
    document = copy.deepcopy(good_record)
    change(document["records"][0])
    assert any(message in e for e in validation.errors("result", document["records"][0]))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    result = accelbench_cli("validate", str(bad))
    assert result.returncode == 1 and f"{bad}: $.records[0]" in result.stdout


def test_a_record_that_fails_its_schema_is_never_written(tmp_path):
    from accelbench.records import results as records

    out = tmp_path / "r.json"
    from conftest import a_record

    with pytest.raises(records.InvalidRecord, match="schema_version"):
        records.write_results(out, [a_record(schema_version="no version")])
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_every_hook_is_typed_and_documented_in_the_generated_table():
    """The docs' hook table is made from the hook list itself (``docgen``), so a hook without a
    'Called ...' docstring or annotations fails here, not silently on the page."""
    from accelbench.authoring import docgen

    hooks = [name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "accelbench_spec")]
    assert sorted(docgen.hooks()) == hooks == ["register_backends"]
    table = docgen.hooks_table()
    for name in hooks:
        function = getattr(hookspecs, name)
        assert function.__doc__ and "Called" in function.__doc__
        assert function.__annotations__
        assert f"| `{name}(" in table and "Called" in table.split(f"`{name}(")[1]


def test_readme_test_command_is_what_ci_runs():
    from pathlib import Path

    root = Path(__file__).parents[1]
    head = (root / "README.md").read_text().splitlines()[:8]
    assert any("accelbench run" in line and "pip install" in line for line in head)
    test_line = next(line for line in head if line.rstrip().endswith("pytest"))
    command = test_line.split(". .venv/bin/activate && ", 1)[1]  # after the venv
    assert command == "pip install -e '.[all,test]' && pip check && python tests/lint.py && pytest"
    assert command in (root / ".ci" / "run").read_text().splitlines()


def test_every_run_config_field_is_declared_once():
    """The dataclass is the one declaration: the config schema has exactly its fields, and every
    command-line option of a field is made from the field's own flag (name, type, help)."""
    import dataclasses

    from accelbench.cli.run import run
    from accelbench.cli.train import TRAIN_RUN_FLAGS, train
    from accelbench.planning.config import RunConfig
    from accelbench.records import validation

    declared = {f.name: f for f in dataclasses.fields(RunConfig)}
    # batch_source is the resolver's note of where the batch came from, never an input
    assert set(validation.load("config")["properties"]) == set(declared) - {"batch_source"}
    run_options = {p.name: p for p in run.params}
    flagged = [f for f in declared.values() if "flag" in f.metadata]
    assert len(flagged) >= 20
    for f in flagged:
        spec = f.metadata["flag"]
        option = run_options[f.name]
        assert option.help == spec.help
        assert ("--" + (spec.name or f.name).replace("_", "-")) in option.opts
    # train's run-config options are the same declarations (some with train's own help)
    train_options = {p.name: p for p in train.params}
    assert {name for name in TRAIN_RUN_FLAGS} <= set(train_options)
    assert train_options["precision"].help == declared["precision"].metadata["flag"].help


def test_every_train_recipe_field_is_declared_once():
    """train's recipe options are made from TrainSpec's own field declarations, every field but
    the dataset (``--data``) has one, and the option's name, help and value kind are the field's."""
    import dataclasses

    from accelbench.cli.options import flagged_fields
    from accelbench.cli.train import train
    from accelbench.planning.config import TrainSpec

    train_options = {p.name: p for p in train.params}
    fields = {f.name: f for f in dataclasses.fields(TrainSpec)}
    assert set(flagged_fields(TrainSpec)) == set(fields) - {"dataset"}
    for name in flagged_fields(TrainSpec):
        spec, option = fields[name].metadata["flag"], train_options[name]
        assert option.help == spec.help
        assert ("--" + (spec.name or name).replace("_", "-")) in option.opts
        assert bool(option.secondary_opts) == (spec.kind == "bool")  # --x/--no-x
    assert "--base-lr" in train_options["base_learning_rate"].opts


def test_option_declarations_accept_and_refuse_values():
    from accelbench import Option

    steps = Option("steps", kind="int", minimum=1)
    assert steps.problem(3) is None
    assert steps.problem(0) == "must be at least 1, got 0"
    assert steps.problem(True) == "must be an integer, got True"  # a bool is not an int here
    assert Option("rate", kind="float").problem(float("nan")) == "must be a finite number, got nan"
    assert Option("rate", kind="float").problem(2) is None
    assert Option("store", choices=("a", "b")).problem("c") == "must be one of a, b, got 'c'"
    assert Option("anything").problem([1, "x"]) is None
    info = BackendInfo(name="b", framework="f", requires=(), models=("m",), options={"x": Option("x", kind="complex"), "y": 3})
    assert "options must map option names to an accelbench.Option or a description" in info.problems()
    info = BackendInfo(name="b", framework="f", requires=(), models=("m",), options={"x": Option("x", kind="complex")})
    assert any("kind must be one of" in p for p in info.problems())


def test_built_in_environments_are_the_distributions_extras_and_the_host_may_satisfy_them():
    import tomllib
    from pathlib import Path

    from accelbench.environments import python_envs as envs
    from accelbench.plugins.shared.extras import extra
    from accelbench.registry import PluginHost

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = declared["project"]["optional-dependencies"]
    infos = {ref.plugin.name: ref.backend.describe() for ref in PluginHost().backends()}
    for plugin, name in {
        "tf_benchmarks": "tf",
        "tpu_official": "tf",
        "mxnet_ngc": "mxnet",
        "torch_ref": "torch",
        "jax_flax": "jax",
    }.items():
        # the same requirements as pyproject's extra (packaging may reorder a specifier's clauses)
        assert [r.split("=")[0].split("<")[0].split(">")[0] for r in infos[plugin].environment] == [
            r.split("=")[0].split("<")[0].split(">")[0] for r in extras[name]
        ]
        assert infos[plugin].environment == extra(name)
    assert not envs.host_satisfies(("six==1.16.0",)) and envs.host_satisfies(("six>=1",))
    assert not envs.host_satisfies(("accelbench-no-such-package",))
    # jax needs numpy 2; the host holds mxnet 1.9.1's numpy 1.26: jax_flax gets its own environment
    [setup] = envs.setups(infos["jax_flax"].environment, "jax_flax", {}, [])
    assert setup.kind == "environment"
    assert envs.setups(infos["jax_flax"].environment, "jax_flax", {"jax_flax": "/usr/bin/python3"}, [])[0].kind == "user"


def _virtio_device(root, name, device_id, features):
    device = root / name
    device.mkdir(parents=True)
    (device / "device").write_text(f"0x{device_id:04x}\n")
    (device / "features").write_text(features + "\n")


@pytest.mark.parametrize(
    "devices, expected",
    [
        # a network device (id 1) and a balloon (id 5) with bit 5, free page reporting: the host takes pages back
        ([("virtio0", 0x0001, "110001011011101100000000"), ("virtio1", 0x0005, "011001010000000000000000")], True),
        ([("virtio0", 0x0005, "011000000000000000000000")], False),  # a balloon without reporting
        ([("virtio0", 0x0001, "111111000000000000000000")], False),  # bit 5 of another device means nothing
        ([], False),
    ],
)
def test_free_page_reporting_is_read_from_the_balloons_negotiated_features(tmp_path, devices, expected):
    from accelbench.environments.machine import memory_returned_to_host

    root = tmp_path / "virtio" / "devices"
    root.mkdir(parents=True)
    for name, device_id, features in devices:
        _virtio_device(root, name, device_id, features)
    assert memory_returned_to_host.__wrapped__(str(root)) is expected
    assert memory_returned_to_host.__wrapped__(str(tmp_path / "no-sysfs" / "devices")) is None


def test_a_record_says_whether_this_machine_hands_memory_back_to_its_host(good_record):
    from accelbench.environments.machine import memory_returned_to_host

    environment = good_record["records"][0]["environment"]
    assert environment.get("memory_returned_to_host") is memory_returned_to_host()


def test_throughput_over_trials_is_pooled_images_over_wall_never_a_mean_of_rates():
    """Trials of different speeds: 80 images in 10 s and 80 in 20 s pool to 160 / 30 = 5.33
    images/sec; the mean of the trials' rates would say 6.0."""
    from accelbench.planning.config import RunConfig
    from accelbench.records import results as records

    trials = [
        records.TrialRow(i, "ok", "", 80, wall, 80 / wall, [wall / 10] * 10, [1.0] * 10) for i, wall in enumerate((10.0, 20.0))
    ]
    throughput, _, _ = records.statistics(trials, RunConfig(global_batch=8))
    assert throughput.images_per_sec == pytest.approx(160 / 30, rel=1e-12)
    assert throughput.images == 160 and throughput.wall_time_s == 30.0
    low, high = throughput.ci95
    assert low < 160 / 30 < high and throughput.ci_method == "t-interval on log trial rates"


def test_a_record_without_a_peak_says_why_and_the_table_says_how_to_get_one(monkeypatch, tmp_path):
    from rich.console import Console

    from accelbench.cli.console import ResultsTable
    from accelbench.records import results as records

    flops = records.Flops(per_image=1e9, achieved_per_s=5e10)
    assert records.add_utilisation(flops, None, "cpu") is None
    assert flops.utilisation is None and "run `accelbench peak`" in flops.peak_reason
    record = records.Record.from_json(
        json.loads((Path(__file__).parent / "fixtures" / "records-1.9.0.json").read_text())["records"][0]
    )
    record.flops = flops
    out = Console(width=200, record=True)
    ResultsTable([record]).print(out)
    assert "no peak to compare with for sleepy:fixed-time (fp32): `accelbench peak` measures" in out.export_text()


@pytest.mark.parametrize(
    "data, message",
    [
        ({"train": {"dataset": "d", "target_top1": 0.9, "max_epochs": 0}}, "--max-epochs must be at least 1 (got 0)"),
        (
            {"train": {"dataset": "d", "target_top1": 0.9, "max_epochs": 3, "base_learning_rate": -1.0}},
            "--base-lr must be more than 0",
        ),
        ({"global_batch": 0}, "--global-batch must be at least 1 (got 0)"),
        ({"warmup": "sometimes"}, "--warmup must be one of"),
        ({"timeout_s": "soon"}, "--timeout must be number"),
    ],
)
def test_a_refused_config_value_names_its_flag_and_the_rule(data, message):
    """#66: one line that says which flag and what it must be, not the whole block's JSON."""
    from accelbench.errors import UsageError
    from accelbench.execution import training  # noqa: F401 - declares the train block's flags
    from accelbench.planning.config import RunConfig

    with pytest.raises(UsageError) as refused:
        RunConfig.from_dict(data)
    assert message in str(refused.value) and "{" not in str(refused.value), str(refused.value)


def test_a_folder_lock_is_exclusive_bounded_and_leaves_nothing(tmp_path):
    """A second holder (another open of the folder: flock locks belong to open descriptions, so
    this holds between two processes as between two opens in one) waits, here past its bound."""
    from accelbench.environments import locks

    order, waited = [], []
    with locks.folder_lock(tmp_path):
        with pytest.raises(TimeoutError, match=str(tmp_path)):
            with locks.folder_lock(tmp_path, timeout_s=0.1, on_wait=lambda: waited.append(1)):
                order.append("never")
        order.append("held")
    with locks.folder_lock(tmp_path, timeout_s=0.1):  # free again once released
        order.append("again")
    assert order == ["held", "again"] and waited == [1] and list(tmp_path.iterdir()) == []


def test_evidence_made_by_a_replaced_method_stands_only_as_superseded(tmp_path):
    """#66: a results file whose intervals are the bootstrap over trials (replaced in schema 1.10)
    or whose looks spent their error one at a time (replaced in 1.13) stops the docs' build,
    unless it sits in a superseded/ folder, where it is rendered as such."""
    import shutil

    from accelbench.analysis import evidence

    kept = Path(__file__).parent.parent / "benchmarks" / "results" / "xeon-amx-2core" / "superseded"
    source = sorted(kept.glob("*.json"))[0]
    (tmp_path / "machine" / "superseded").mkdir(parents=True)
    shutil.copy(source, tmp_path / "machine" / source.name)
    with pytest.raises(evidence.EvidenceError, match="no longer uses .*bootstrap over trials.*superseded/"):
        evidence.load(tmp_path)
    (tmp_path / "machine" / source.name).rename(tmp_path / "machine" / "superseded" / source.name)
    [found] = evidence.load(tmp_path)
    assert found.superseded and "**Superseded**" in evidence.markdown([found], tmp_path)
    current = Path(__file__).parent.parent / "benchmarks" / "results" / "zen4-2core"
    assert all(not evidence.stale(f.records) for f in evidence.load(current) if not f.superseded)
