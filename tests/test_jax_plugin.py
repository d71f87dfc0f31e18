"""jax_flax through the host, in its own environment (JAX needs numpy 2; the host has numpy 1.26
for MXNet), with tiny shapes on the CPU. The first test makes the environment (cached)."""

import pytest

from accelbench.environment import cpu_flags
from accelbench.plugins.cpu_features import bf16_emulation_warning
from conftest import assert_measured_allocator, assert_measured_huge_pages, loss_falls, run_backend

pytestmark = pytest.mark.jax
SMALL = dict(model="resnet_small", image_size=16, num_classes=10)
# forward multiply-adds of one 224x224 image, conv + dense layers, ResNet-50 v1.5
RESNET50_V15_MACS = 4.089e9


def test_flax_resnet50_has_the_reference_parameters_and_flops():
    record = run_backend("jax_flax", num_classes=1000, image_size=224, global_batch=2, timed_steps=2,
                         warmup_steps=1, precision="fp32", timeout_s=900)
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


def test_flax_loss_falls_with_bf16_compute_and_fp32_parameters():
    record = run_backend("jax_flax", precision="bf16", timed_steps=25, warmup_steps=0, **SMALL)
    assert record["status"] == "ok", record["reason"]
    assert record["precision"] == "bf16"
    # read back from the model: the convolutions compute in bf16, the parameters stay fp32
    assert record["settings"]["compute_dtype"] == "bfloat16" and record["settings"]["variable_dtype"] == "float32"
    assert loss_falls(record["trials"][0]["losses"]), record["trials"][0]["losses"]
    # a CPU without bf16 (Zen 3): the record says its bf16 is emulated; one with it: no such warning
    emulated = bf16_emulation_warning(cpu_flags())
    assert [w for w in record["warnings"] if "emulated" in w] == ([emulated] if emulated else [])


def test_flax_fp32_computes_in_fp32():
    record = run_backend("jax_flax", precision="fp32", timed_steps=2, warmup_steps=1, **SMALL)
    assert record["status"] == "ok", record["reason"]
    assert record["settings"]["compute_dtype"] == "float32"


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
    from accelbench import records, runner
    from accelbench.config import RunConfig
    from accelbench.registry import PluginHost

    refs = PluginHost().select(["jax_flax"])
    [merged] = runner.execute(runner.plan(refs, RunConfig(workers=2, per_device_batch=2, scaling_baseline=False,
                                                          warmup_steps=1, timed_steps=4, timeout_s=600, **SMALL)),
                              records.check_all)
    assert merged["status"] == "ok", merged["reason"]
    dist = merged["distributed"]
    assert dist["engine"] == "jax_distributed" and dist["workers"] == 2 and merged["batch"]["global"] == 4
    assert merged["settings"]["processes"] == 2 and len(merged["settings"]["devices"]) == 2
    checksums = [w["final"]["weights_checksum"] for w in dist["per_worker"]]
    assert checksums[0] == checksums[1]
    assert merged["throughput"]["images"] == 4 * 4
