"""mxnet_ngc through the host, with tiny shapes on the CPU."""

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import (
    assert_cpu_footprint,
    assert_emulated_under_plain_avx512,
    assert_measured_allocator,
    assert_measured_huge_pages,
    loss_falls,
    run_backend,
)

# not importorskip: importing mxnet here would need numpy's removed aliases in the test process
if importlib.util.find_spec("mxnet") is None:
    pytest.skip("MXNet not installed (pip install accelbench[mxnet])", allow_module_level=True)
pytestmark = pytest.mark.mxnet


def test_mxnet_trains_and_records_fp32():
    record = run_backend("mxnet_ngc", timed_steps=20, warmup_steps=0)
    assert record["status"] == "ok", record["reason"]
    assert record["precision"] == "fp32" and record["model"]["variant"] == "v1"
    assert record["batch"]["semantics"] == "global"
    assert record["settings"]["omp_num_threads"] == str(record["config"]["threads"])
    assert record["settings"]["frameworks_loaded"] == ["mxnet"]
    assert record["settings"]["conv_biases"] is False
    assert_measured_allocator(record, "jemalloc")
    assert_measured_huge_pages(record, measured=False)
    assert loss_falls(record["trials"][0]["losses"]), record["trials"][0]["losses"]
    assert_cpu_footprint(record)


def test_mxnet_default_batch_is_the_study_global_768_on_gpu():
    from accelbench.planning.plan import resolve
    from accelbench.plugins.mxnet_ngc import NgcResNet50

    config = resolve(__import__("accelbench").RunConfig(), NgcResNet50.info, "gpu", 4)
    assert (config.global_batch, config.per_device_batch) == (768, 192)


def test_mxnet_splits_the_global_batch_over_two_contexts():
    record = run_backend("mxnet_ngc", device="cpu", device_count=2, global_batch=8)
    assert record["status"] == "ok", record["reason"]
    assert record["batch"]["per_device"] == 4
    assert record["settings"]["contexts"] == ["cpu(0)", "cpu(1)"]


def test_mxnet_replicas_keep_identical_weights():
    code = (
        "from accelbench import RunConfig\n"
        "from accelbench.plugins.mxnet_ngc.training import GluonRun\n"
        "cfg = RunConfig(image_size=32, num_classes=10, global_batch=8, per_device_batch=4,\n"
        "                device='cpu', device_count=2, precision='fp32', variant='v1')\n"
        "run = GluonRun(cfg)\n"
        "losses = [run.step() for _ in range(3)]\n"
        "print(run.replica_weights_max_difference())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout.split()[-1]) == 0.0


def test_mxnet_conv_biases_stay_zero_while_the_weights_train():
    code = (
        "from accelbench import RunConfig\n"
        "from accelbench.plugins.mxnet_ngc.training import GluonRun, CONV_BIASES\n"
        "cfg = RunConfig(image_size=32, num_classes=10, global_batch=4, per_device_batch=4,\n"
        "                device='cpu', device_count=1, precision='fp32', variant='v1')\n"
        "run = GluonRun(cfg)\n"
        "biases = run.net.collect_params(CONV_BIASES).values()\n"
        "weight = run.net.features[5][0].body[0].weight\n"
        "run.step()  # the zoo's layers initialise their shapes on the first forward pass\n"
        "before = weight.data().asnumpy().copy()\n"
        "losses = [run.step() for _ in range(2)]\n"
        "print(len(biases), max(float(b.data().abs().max().asscalar()) for b in biases),\n"
        "      float(abs(weight.data().asnumpy() - before).max()) > 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-3:] == ["32", "0.0", "True"]


def test_mxnet_bf16_runs_through_amp():
    from accelbench.environments import machine as environment
    from accelbench.plugins.mxnet_ngc.training import cpu_bf16_problem

    record = run_backend("mxnet_ngc", precision="bf16")
    problem = cpu_bf16_problem(environment.cpu_flags())
    if problem:  # an AVX2-only CPU: the check must say so before any kernel fails
        assert (record["status"], record["reason"]) == ("unavailable", problem)
        pytest.skip(problem)
    assert record["status"] == "ok", record["reason"]
    assert record["precision"] == "bf16" and record["settings"]["amp"] == "bfloat16"
    # what oneDNN ran, read back from oneDNN: AMX wherever the CPU has it (oneDNN 2.4 alone would not)
    kernel, isa = record["settings"]["onednn_convolution"], record["settings"]["onednn_isa"]
    if "amx_bf16" in environment.cpu_flags():
        assert record["settings"]["onednn_max_cpu_isa"] == "AVX512_CORE_AMX"
        assert kernel.endswith("avx512_core_amx_bf16") and "AMX" in isa, (kernel, isa)
    else:
        assert record["settings"]["onednn_max_cpu_isa"] == os.environ.get("DNNL_MAX_CPU_ISA")  # None: oneDNN's own
        assert "amx" not in kernel and "AMX" not in isa, (kernel, isa)
    # native bf16 (oneDNN names it in its instruction set) or a record that says it is emulated
    emulated = [w for w in record["warnings"] if "emulated" in w]
    assert bool(emulated) == ("bfloat16" not in isa), (isa, record["warnings"])


def test_a_users_onednn_ceiling_stands_and_the_record_reads_what_onednn_ran(monkeypatch):
    from accelbench.environments import machine as environment
    from accelbench.plugins.mxnet_ngc.training import cpu_bf16_problem

    if cpu_bf16_problem(environment.cpu_flags()):
        pytest.skip("no AVX-512 on this CPU")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE")  # the worker inherits the host's environment
    record = run_backend("mxnet_ngc", precision="bf16")
    assert_emulated_under_plain_avx512(record, "MXNet")
    assert record["settings"]["onednn_max_cpu_isa"] == "AVX512_CORE"


def test_fp32_records_its_onednn_kernel_too(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no probe kept: this run's probe reads it
    record = run_backend("mxnet_ngc", timed_steps=2, warmup_steps=0)
    assert record["status"] == "ok", record["reason"]
    assert record["settings"]["onednn_convolution"] and record["settings"]["onednn_isa"]
    assert "bf16" not in record["settings"]["onednn_convolution"]
    assert record["settings"]["onednn_probe"] == "a probe process of this run"
    kept = run_backend("mxnet_ngc", timed_steps=2, warmup_steps=0)["settings"]  # the next worker reads it kept
    assert "kept in the cache" in kept["onednn_probe"]
    assert (kept["onednn_isa"], kept["onednn_convolution"]) == (
        record["settings"]["onednn_isa"],
        record["settings"]["onednn_convolution"],
    )


def test_a_run_that_asks_no_onednn_probe_says_so_in_the_keys_tensorflows_use(monkeypatch):
    from types import SimpleNamespace

    from accelbench.plugins.mxnet_ngc.training import GluonRun

    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    gpu_run = SimpleNamespace(onednn_probe=None)  # on a GPU no probe is started
    assert GluonRun._onednn_settings(gpu_run) == {
        "onednn_max_cpu_isa": "AVX2",
        "onednn_isa": None,
        "onednn_convolution": None,
        "onednn_probe": None,
    }


@pytest.mark.parametrize(
    "flags, permitted, asked, ceiling",
    [
        ({"avx512f", "amx_tile", "amx_bf16"}, True, None, "AVX512_CORE_AMX"),  # Sapphire Rapids and later
        ({"avx512f", "amx_tile", "amx_bf16"}, True, "AVX512_CORE_BF16", "AVX512_CORE_BF16"),  # the user's stands
        ({"avx512f", "amx_tile", "amx_bf16"}, False, None, None),  # the kernel refused: no SIGILL, no AMX
        ({"avx512f", "avx512_bf16"}, True, None, None),  # AMD Zen 4: nothing to allow
    ],
)
def test_onednn_is_allowed_amx_only_where_the_cpu_and_the_kernel_give_it(monkeypatch, flags, permitted, asked, ceiling):
    from accelbench.plugins.mxnet_ngc import onednn

    asked_for = []
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(onednn, "request_amx_tiles", lambda: asked_for.append(True) or permitted)
    monkeypatch.setenv(onednn.ISA_VARIABLE, asked or "")  # so that undoing restores the test process's own
    if asked is None:
        monkeypatch.delenv(onednn.ISA_VARIABLE)
    onednn.allow_amx()
    assert onednn.os.environ.get(onednn.ISA_VARIABLE) == ceiling
    assert asked_for == ([True] if "amx_bf16" in flags else [])


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"avx2", "fma"}, "this CPU has AVX2 only"),  # AMD Zen 3
        ({"sse4_2"}, "this CPU has no AVX-512"),
        ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}, None),  # emulated bf16, but it runs
        ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}, None),  # Zen 4, Xeon
        (set(), None),  # unknown flags: the worker finds out by running
    ],
)
def test_mxnet_bf16_needs_avx512_on_the_cpu(flags, expected):
    from accelbench.plugins.mxnet_ngc.training import cpu_bf16_problem

    problem = cpu_bf16_problem(frozenset(flags))
    assert problem == expected or (expected and problem.endswith(expected)), problem


def test_mxnet_fp16_on_cpu_is_unavailable():
    record = run_backend("mxnet_ngc", precision="fp16")
    assert record["status"] == "unavailable" and "fp16 needs a GPU" in record["reason"]


def test_mxnet_v15_moves_the_stride_and_costs_more_flops():
    v1 = run_backend("mxnet_ngc", image_size=224, num_classes=1000, global_batch=1, warmup_steps=0, timed_steps=1)
    v15 = run_backend(
        "mxnet_ngc", image_size=224, num_classes=1000, global_batch=1, warmup_steps=0, timed_steps=1, variant="v1.5"
    )
    assert v1["flops"]["per_image"] == pytest.approx(6 * 3.858e9, rel=0.002)
    assert v15["flops"]["per_image"] == pytest.approx(6 * 4.089e9, rel=0.002)


def test_tensorflow_and_mxnet_share_one_environment():
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    assert "tensorflow" not in sys.modules and "mxnet" not in sys.modules  # only ever in workers
