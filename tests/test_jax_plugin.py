"""jax_flax through the host, in its own environment (JAX needs numpy 2; the host has numpy 1.26
for MXNet), with tiny shapes on the CPU. The first test makes the environment (cached)."""

import pytest
from conftest import assert_measured_allocator, assert_measured_huge_pages, executed, load_records, loss_falls, run_backend

from accelbench.environments.machine import cpu_flags
from accelbench.plugins.jax_flax import hlo
from accelbench.plugins.shared.cpu_features import bf16_emulation_warning

pytestmark = pytest.mark.jax
SMALL = dict(model="resnet_small", image_size=16, num_classes=10)
# forward multiply-adds of one 224x224 image, conv + dense layers, ResNet-50 v1.5
RESNET50_V15_MACS = 4.089e9
# the small ResNet's 15 convolutions (stem, 2 per basic block, 2 shortcuts), each once forward and
# once for its kernel's gradient, and all but the stem (it takes the images) for its input's
SMALL_STEP_CONVOLUTIONS = 3 * 15 - 1


def test_flax_resnet50_has_the_reference_parameters_and_flops():
    record = run_backend(
        "jax_flax",
        num_classes=1000,
        image_size=224,
        global_batch=2,
        timed_steps=2,
        warmup_steps=1,
        precision="fp32",
        timeout_s=900,
    )
    assert record["status"] == "ok", record["reason"]
    assert record["model"] == {"name": "resnet50", "variant": "v1.5"}
    # the TF, MXNet and PyTorch plugins' ResNet-50 has exactly these trainable parameters
    assert record["settings"]["parameters"] == 25_557_032
    assert record["flops"]["per_image"] == pytest.approx(6 * RESNET50_V15_MACS, rel=1e-3)
    worker = record["environment"]["worker"]
    assert worker["kind"] == "environment" and worker["packages"]["numpy"].startswith("2.")
    assert record["environment"]["packages"]["jax"] == record["framework"]["version"] == worker["packages"]["jax"]
    assert record["settings"]["frameworks_loaded"] == ["flax", "jax", "optax"]
    assert_measured_allocator(record, "tcmalloc")
    assert_measured_huge_pages(record, measured=False)
    assert record["settings"]["xla_convolution_operands"] == {"f32": 3 * 53 - 1}  # its 53 convolutions, as above


def test_the_bf16_peak_says_what_xla_compiled_its_product_to():
    import io

    from rich.console import Console

    from accelbench.cli.console import PeakTable
    from accelbench.execution import matmul_peak as peak_measure
    from accelbench.registry import PluginHost

    [ref] = PluginHost().select(["jax_flax"])
    outcome = peak_measure.measure(ref, "bf16", "cpu", size=128, repeats=1)
    assert outcome.status == "ok", outcome.reason
    compiled = outcome.settings["xla_dot_operands"]
    assert sum(compiled.values()) == 1, compiled  # jnp.dot: one product
    emulated = [w for w in outcome.warnings if "emulated" in w]
    assert bool(emulated) == (not hlo.computes_in(compiled, "bf16") or bool(bf16_emulation_warning(cpu_flags())))
    shown = io.StringIO()
    with PeakTable(Console(file=shown, width=400)) as table:
        table.add(outcome)
    assert all(warning[:60] in shown.getvalue() for warning in outcome.warnings)  # in the table's note


def test_flax_loss_falls_with_bf16_compute_and_fp32_parameters():
    record = run_backend("jax_flax", precision="bf16", timed_steps=25, warmup_steps=0, **SMALL)
    assert record["status"] == "ok", record["reason"]
    assert record["precision"] == "bf16"
    # read back from the model: its layers ask for bf16, the parameters stay fp32
    assert record["settings"]["compute_dtype"] == "bfloat16" and record["settings"]["variable_dtype"] == "float32"
    assert loss_falls(record["trials"][0]["losses"]), record["trials"][0]["losses"]
    # and from the compiled step, what XLA made of them: every convolution of the forward and
    # backward passes, each counted by the type it multiplies
    compiled = record["settings"]["xla_convolution_operands"]
    assert sum(compiled.values()) == SMALL_STEP_CONVOLUTIONS, compiled
    emulated = [w for w in record["warnings"] if "emulated" in w]
    if hlo.computes_in(compiled, "bf16"):  # XLA kept bf16: the CPU's flags tell (Zen 3: emulated)
        flags_say = bf16_emulation_warning(cpu_flags())
        assert emulated == ([flags_say] if flags_say else [])
    else:  # XLA's CPU backend (jaxlib without oneDNN) computes bf16 convolutions in f32, whatever the CPU
        assert len(emulated) == 1 and emulated[0].startswith(
            f"bf16 is emulated: XLA's CPU backend compiled the step's convolutions with f32 operands "
            f"({SMALL_STEP_CONVOLUTIONS}, none in bf16"
        ), emulated


@pytest.fixture(scope="module")
def fp32_record():
    """One fp32 run of the small model, shared by the tests that read it (a JAX worker's start-up
    and compile take seconds)."""
    return run_backend("jax_flax", precision="fp32", timed_steps=3, warmup_steps=1, **SMALL)


def test_flax_fp32_computes_in_fp32(fp32_record):
    record = fp32_record
    assert record["status"] == "ok", record["reason"]
    assert record["settings"]["compute_dtype"] == "float32"
    assert record["settings"]["xla_convolution_operands"] == {"f32": SMALL_STEP_CONVOLUTIONS}
    assert not [w for w in record["warnings"] if "emulated" in w]
    # XLA compiles the step in prepare, ahead of the first call: the record says how long it took
    startup = record["trials"][0]["startup"]
    assert 0 < startup["compile_s"] < startup["worker_to_first_step_s"]
    assert record["startup"]["compile_s"] == startup["compile_s"]
    assert record["memory"]["device_reason"].startswith("a CPU run")
    assert record["settings"]["learning_rate_argument"] == "Python float (converted at every call)"


def test_the_step_argument_levers_are_read_back_and_compute_the_same(fp32_record):
    """The learning rate passed as an array on the device, made once, and XLA flags through the
    plugin: the record reads both back from the worker, and the losses are the float's, exactly."""
    flag = "--xla_cpu_enable_fast_math=false"  # XLA's CPU default: changes nothing but the flags
    default = fp32_record
    levers = run_backend(
        "jax_flax",
        precision="fp32",
        timed_steps=3,
        warmup_steps=1,
        options={"learning_rate_on_device": True, "xla_flags": flag},
        **SMALL,
    )
    assert levers["status"] == "ok", levers["reason"]
    assert levers["settings"]["learning_rate_argument"] == "float32 array on 1 device(s), made once per rate"
    assert flag in levers["settings"]["xla_flags"].split() and flag not in default["settings"]["xla_flags"]
    assert levers["trials"][0]["losses"] == default["trials"][0]["losses"]


def test_flax_data_parallel_over_two_local_devices():
    record = run_backend("jax_flax", device_count=2, global_batch=8, timed_steps=3, warmup_steps=1, **SMALL)
    assert record["status"] == "ok", record["reason"]
    assert record["device"]["count"] == 2 and record["batch"]["per_device"] == 4
    devices = record["settings"]["devices"]
    assert len(devices) == len(set(devices)) == 2
    assert "--xla_force_host_platform_device_count=2" in record["settings"]["xla_flags"]
    assert record["throughput"]["images"] == 8 * 3


def test_two_jax_processes_merge_into_one_record_with_identical_weights():
    """jax.distributed through the plugin's engine: coordinator on loopback, gloo between CPUs."""
    from accelbench.execution import runner
    from accelbench.planning.config import RunConfig
    from accelbench.registry import PluginHost

    refs = PluginHost().select(["jax_flax"])
    [merged] = executed(
        runner.plan(
            refs,
            RunConfig(
                workers=2, per_device_batch=2, scaling_baseline=False, warmup_steps=1, timed_steps=4, timeout_s=600, **SMALL
            ),
        )
    )
    assert merged["status"] == "ok", merged["reason"]
    dist = merged["distributed"]
    assert dist["engine"] == "jax_distributed" and dist["workers"] == 2 and merged["batch"]["global"] == 4
    assert merged["settings"]["processes"] == 2 and len(merged["settings"]["devices"]) == 2
    checksums = [w["final"]["weights_checksum"] for w in dist["per_worker"]]
    assert checksums[0] == checksums[1]
    assert merged["throughput"]["images"] == 4 * 4


def test_a_lockstep_run_beside_mxnet_names_each_workers_own_packages(accelbench_cli, tmp_path):
    """#70: each side's record names what its worker imported -- JAX's environment has numpy 2,
    MXNet runs on the host's numpy 1.26 -- with the lock read in that worker."""
    out = tmp_path / "r.json"
    small = ["--model", "resnet_small", "--image-size", "16", "--num-classes", "10", "--precision", "fp32"]
    done = accelbench_cli(
        "run", "--plugin", "jax_flax", "--plugin", "mxnet_ngc", *small, "--global-batch", "8",
        "--schedule", "lockstep", "--blocks", "2", "--block-time", "0.3", "--warmup-steps", "2", "-o", str(out),
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = {r["plugin"]["name"]: r for r in load_records(out)}
    jax, mxnet = records["jax_flax"], records["mxnet_ngc"]
    assert jax["status"] == mxnet["status"] == "ok", (jax["reason"], mxnet["reason"])
    jax_worker, mxnet_worker = jax["environment"]["worker"], mxnet["environment"]["worker"]
    assert jax_worker["kind"] == "environment" and mxnet_worker["kind"] == "host"
    assert jax["environment"]["packages"]["numpy"].startswith("2.") and jax_worker["packages"]["numpy"].startswith("2.")
    assert mxnet["environment"]["packages"]["numpy"].startswith("1.26")
    jax_lock = dict(pin.split("==", 1) for pin in jax_worker["lock"]["distributions"])
    assert jax_lock["numpy"] == jax_worker["packages"]["numpy"] and jax_lock["jax"] == jax["framework"]["version"]
    assert "mxnet" not in jax_lock and "mxnet" in dict(p.split("==", 1) for p in mxnet_worker["lock"]["distributions"])
