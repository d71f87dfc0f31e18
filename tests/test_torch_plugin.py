"""torch_ref through the host, with tiny shapes on the CPU."""

import importlib.util
import json

import pytest
from conftest import (
    assert_cpu_footprint,
    assert_emulated_under_plain_avx512,
    assert_measured_allocator,
    assert_measured_huge_pages,
    assert_onednn_read_back,
    executed,
    load_records,
    loss_falls,
    run_backend,
)

from accelbench.execution import runner
from accelbench.planning.config import RunConfig
from accelbench.registry import PluginHost

if importlib.util.find_spec("torch") is None:
    pytest.skip("PyTorch not installed (pip install accelbench[torch])", allow_module_level=True)
pytestmark = pytest.mark.torch

SMALL = dict(model="resnet_small", image_size=16, num_classes=10)


def test_torch_trains_resnet50_with_the_reference_parameter_count():
    record = run_backend("torch_ref", num_classes=1000, timed_steps=3, warmup_steps=1, global_batch=4)
    assert record["status"] == "ok", record["reason"]
    assert record["model"] == {"name": "resnet50", "variant": "v1.5"} and record["precision"] == "fp32"
    settings = record["settings"]
    # the TF and MXNet plugins' ResNet-50 has exactly these trainable parameters
    assert settings["parameters"] == 25_557_032 and settings["conv_biases"] is False
    assert settings["memory_format"] == "channels_last" and settings["autocast_dtype"] is None
    assert settings["sgd_implementation"] == "fused"  # the plugin's kept update on a CPU, read back
    assert_measured_allocator(record, "tcmalloc")
    assert_measured_huge_pages(record, measured=False)
    assert settings["variable_dtype"] == "float32" and settings["frameworks_loaded"] == ["torch", "torchvision"]
    assert settings["intra_op_threads"] == record["config"]["threads"]
    assert record["framework"]["name"] == "pytorch" and record["framework"]["version"].startswith("2.")
    assert record["throughput"]["images_per_sec"] == pytest.approx(4 * 3 / record["throughput"]["wall_time_s"])
    assert_cpu_footprint(record)


def test_torch_loss_falls_on_fixed_data():
    record = run_backend("torch_ref", timed_steps=25, warmup_steps=0, **SMALL)
    assert record["status"] == "ok", record["reason"]
    assert record["model"] == {"name": "resnet_small", "variant": None}
    assert loss_falls(record["trials"][0]["losses"]), record["trials"][0]["losses"]


def test_torch_levers_are_read_back_and_train_the_same():
    """PyTorch's own SGD update (the fused kernel is the plugin's default on a CPU) and the contiguous
    (NCHW) format change how the step runs, not what it computes: the record reads both back, and
    the losses of a few steps match the default's."""
    default = run_backend("torch_ref", timed_steps=4, warmup_steps=0, **SMALL)
    levers = run_backend(
        "torch_ref",
        timed_steps=4,
        warmup_steps=0,
        inter_op_threads=1,
        options={"fused_sgd": False, "memory_format": "contiguous"},
        **SMALL,
    )
    assert levers["status"] == "ok", levers["reason"]
    assert levers["settings"]["inter_op_threads"] == 1
    assert levers["settings"]["sgd_implementation"] == "for-loop"  # PyTorch's choice for CPU tensors
    assert levers["settings"]["memory_format"] == "contiguous"
    # each loss after the first follows the updates before it: equal losses, equal updates
    assert levers["trials"][0]["losses"] == pytest.approx(default["trials"][0]["losses"], rel=1e-3)


def test_the_fused_sgd_update_gives_pytorchs_own_weights_bit_for_bit():
    fused = run_backend("torch_ref", timed_steps=5, warmup_steps=0, **SMALL)
    own = run_backend("torch_ref", timed_steps=5, warmup_steps=0, options={"fused_sgd": False}, **SMALL)
    assert (fused["settings"]["sgd_implementation"], own["settings"]["sgd_implementation"]) == ("fused", "for-loop")
    # the loss of step k is computed from the weights after k - 1 updates: exactly equal, not close
    assert fused["trials"][0]["losses"] == own["trials"][0]["losses"]


def test_torch_bf16_is_autocast_and_fp16_needs_a_gpu():
    bf16 = run_backend("torch_ref", precision="bf16", **SMALL)
    assert bf16["status"] == "ok", bf16["reason"]
    assert bf16["precision"] == "bf16" and bf16["settings"]["autocast_dtype"] == "bfloat16"
    assert bf16["settings"]["variable_dtype"] == "float32"  # autocast: fp32 weights, bf16 compute
    assert_onednn_read_back(bf16)
    fp16 = run_backend("torch_ref", precision="fp16", **SMALL)
    assert fp16["status"] == "unavailable" and "needs a GPU" in fp16["reason"]


def test_fp32_records_the_onednn_kernel_it_ran():
    from accelbench.environments.machine import cpu_flags

    if "avx2" not in cpu_flags():
        pytest.skip("oneDNN's x86 kernels are what this reads back")
    record = run_backend("torch_ref", timed_steps=1, warmup_steps=0, **SMALL)
    kernel, isa = record["settings"]["onednn_convolution"], record["settings"]["onednn_isa"]
    assert kernel and ":" in kernel and "bf16" not in kernel, kernel
    assert isa.startswith("Intel"), isa  # oneDNN's own words ("Intel AVX2", "Intel AVX-512 with ...")


def test_a_onednn_ceiling_below_bf16_is_read_back_as_emulation(monkeypatch):
    from accelbench.environments.machine import cpu_flags

    if not {"avx512f", "avx512bw", "avx512vl"} <= cpu_flags():
        pytest.skip("no AVX-512 on this CPU")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")  # the worker inherits the host's environment
    record = run_backend("torch_ref", precision="bf16", timed_steps=2, warmup_steps=1, **SMALL)
    assert_emulated_under_plain_avx512(record, "PyTorch")


def test_a_onednn_ceiling_below_bf16_is_recorded_as_emulation(monkeypatch):
    from accelbench.environments.machine import cpu_flags
    from accelbench.plugins.shared.cpu_features import bf16_emulation_warning

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the worker inherits the host's environment
    record = run_backend("torch_ref", precision="bf16", timed_steps=2, warmup_steps=1, **SMALL)
    assert record["status"] == "ok", record["reason"]
    expected = bf16_emulation_warning(cpu_flags()) or "bf16 is emulated: oneDNN's instruction-set ceiling "
    emulated = [w for w in record["warnings"] if "emulated" in w]
    assert len(emulated) == 1 and emulated[0].startswith(expected), record["warnings"]


def test_torch_two_workers_on_ddp_keep_identical_weights():
    refs = PluginHost().select(["torch_ref"])
    config = RunConfig(workers=2, per_device_batch=4, warmup_steps=1, timed_steps=5, timeout_s=240, **SMALL)
    baseline, merged = executed(runner.plan(refs, config))
    assert baseline["status"] == merged["status"] == "ok", merged["reason"]
    dist = merged["distributed"]
    assert dist["engine"] == "torch_distributed" and dist["workers"] == 2
    assert merged["settings"]["process_group_backend"] == "gloo" and merged["settings"]["world_size"] == 2
    checksums = [w["final"]["weights_checksum"] for w in dist["per_worker"]]
    assert checksums[0] == checksums[1]
    assert merged["throughput"]["images"] == 2 * 4 * 5
    assert dist["scaling_efficiency"] == pytest.approx(
        merged["throughput"]["images_per_sec"] / (2 * baseline["throughput"]["images_per_sec"])
    )


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")
def test_torch_and_tensorflow_records_of_one_config_compare(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    done = accelbench_cli(
        "run",
        "--plugin",
        "torch_ref",
        "--plugin",
        "tf_benchmarks",
        "--variant",
        "v1.5",
        "--image-size",
        "32",
        "--num-classes",
        "10",
        "--global-batch",
        "4",
        "--warmup-steps",
        "2",
        "--timed-steps",
        "4",
        "--trials",
        "1",
        "-o",
        str(out),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    torch_record, tf_record = load_records(out)
    # FLOPs counted on each framework's own model: the same ResNet-50 v1.5, so the same count
    assert torch_record["flops"]["per_image"] == tf_record["flops"]["per_image"]
    compared = accelbench_cli("compare", str(out), "--json")
    assert compared.returncode == 0, compared.stderr
    [pair] = json.loads(compared.stdout)["comparisons"]
    assert {pair["a"], pair["b"]} == {"torch_ref:resnet50", "tf_benchmarks:resnet50"}
    assert pair["analysis"].startswith("lockstep pairs")  # two runs of one invocation: lockstep


def test_torch_compiles_mode_is_read_back_from_the_compiled_module():
    """``compile_mode`` is read back from what torch.compile set in its compiler's config (no
    compilation needed: the config is fixed when the module is wrapped)."""
    import torch

    from accelbench.plugins.torch_ref.training import compile_read_back

    layer = torch.nn.Linear(2, 2)
    assert compile_read_back(torch.compile(layer)) == {"compile_cudagraphs": False, "compile_max_autotune": False}
    assert compile_read_back(torch.compile(layer, mode="reduce-overhead"))["compile_cudagraphs"] is True
    assert compile_read_back(torch.compile(layer, mode="max-autotune-no-cudagraphs")) == {
        "compile_cudagraphs": False,
        "compile_max_autotune": True,
    }
    assert compile_read_back(layer) == {"compile_cudagraphs": None, "compile_max_autotune": None}  # not compiled: not said


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        (dict(device="cpu", precision="fp32"), "needs a GPU"),
        (dict(device="gpu", precision="fp16"), "gradient scaler"),
        (dict(device="gpu", precision="bf16", workers=2), "one process"),
        (dict(device="gpu", precision="bf16", options={"compile": True}), "compile_mode=reduce-overhead"),
        (dict(device="gpu", precision="bf16", mode="train"), "train mode"),
        (dict(device="gpu", precision="bf16"), None),
    ],
)
def test_the_whole_step_cuda_graph_says_what_it_cannot_hold(config, problem):
    from accelbench.plugins.torch_ref.training import cuda_graph_problem

    options = {"cuda_graph": True, **config.pop("options", {})}
    said = cuda_graph_problem(RunConfig(options=options, **config))
    assert (said is None) if problem is None else (problem in said), said
    assert cuda_graph_problem(RunConfig(device="cpu", precision="fp32")) is None  # not asked


def test_a_cuda_graph_on_the_cpu_is_an_unavailable_record():
    record = run_backend("torch_ref", options={"cuda_graph": True}, **SMALL)
    assert record["status"] == "unavailable" and "cuda_graph: a CUDA graph needs a GPU" in record["reason"], record
