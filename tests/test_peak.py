"""accelbench peak with each installed framework: its matrix product at each precision, in a worker."""

import importlib.util
import os

import pytest
from conftest import a_record

from accelbench.environments.machine import cpu_flags, cpu_model
from accelbench.execution import matmul_peak as peak_measure
from accelbench.execution.protocol import Check, PrepareMatmul, TimeMatmul
from accelbench.execution.timing import Timing
from accelbench.registry import PluginHost

FRAMEWORKS = {"tf_benchmarks": "tensorflow", "mxnet_ngc": "mxnet", "torch_ref": "torch"}
NATIVE_BF16 = bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def _ref(plugin):
    if importlib.util.find_spec(FRAMEWORKS[plugin]) is None:
        pytest.skip(f"{FRAMEWORKS[plugin]} not installed")
    [ref] = PluginHost().select([plugin])
    return ref


@pytest.mark.framework
@pytest.mark.parametrize("plugin", FRAMEWORKS)
def test_each_framework_measures_its_fp32_peak_on_the_cpu(plugin):
    outcome = peak_measure.measure(_ref(plugin), "fp32", "cpu", size=256, repeats=2)
    assert outcome.status == "ok", outcome.reason
    m = outcome.measurement
    assert m.framework_version and m.device_kind == "cpu" and m.size == 256 and m.repeats == 2
    assert m.flops_per_s > 1e8  # 2 x 256^3 FLOPs in well under a second on any CPU of this decade
    assert m.machine.startswith(f"{cpu_model()} / {os.cpu_count()} cores / flags ")  # a CPU peak is the machine's


@pytest.mark.mxnet
@pytest.mark.skipif(not NATIVE_BF16, reason="MXNet's oneDNN has no bf16 kernels without AVX-512 bf16 or AMX")
def test_mxnet_peak_runs_bf16_through_amp():
    outcome = peak_measure.measure(_ref("mxnet_ngc"), "bf16", "cpu", size=256, repeats=1)
    assert outcome.status == "ok", outcome.reason
    assert outcome.settings["operator"] == "FullyConnected" and outcome.settings["output_dtype"] == "bfloat16"


@pytest.mark.torch
def test_fp16_on_a_cpu_is_refused_with_the_backends_reason():
    outcome = peak_measure.measure(_ref("torch_ref"), "fp16", "cpu", size=64, repeats=1)
    assert outcome.status == "unavailable" and "needs a GPU" in outcome.reason and outcome.measurement is None


def test_the_cache_keeps_the_higher_of_two_measurements_of_one_key(tmp_path, monkeypatch):
    from accelbench.analysis import peaks

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    entry = dict(
        machine="m",
        device_kind="cpu",
        device_name="cpu",
        framework="fw",
        framework_version="1",
        precision="fp32",
        size=2048,
        repeats=3,
        measured_utc="2026-12-01T00:00:00Z",
    )
    peaks.save_measured([peaks.Measured(**entry, flops_per_s=180e9)])
    peaks.save_measured([peaks.Measured(**entry, flops_per_s=94e9)])  # measured on a busy machine
    assert [m.flops_per_s for m in peaks.load_measured().values()] == [180e9]
    peaks.save_measured([peaks.Measured(**entry, flops_per_s=190e9)])
    assert [m.flops_per_s for m in peaks.load_measured().values()] == [190e9]


def test_a_record_above_its_peak_is_warned_about_not_clamped(monkeypatch):
    from accelbench.analysis import peaks
    from accelbench.records import results as records

    monkeypatch.setattr(peaks, "published", lambda *args: peaks.Peak(100e9, "a low figure"))
    flops = records.Flops(per_image=1e9)
    throughput = records.Throughput(150.0, 1500, 10.0, (140.0, 160.0), "bootstrap over steps")
    warnings = records.complete_flops(
        flops, throughput, "fp32", records.DeviceRef("cpu", 1, "cpu"), records.Named("fw", "1"), a_record().environment, devices=1
    )
    assert flops.achieved_per_s == 150e9 and flops.utilisation == 1.5 and flops.peak_source == "a low figure"
    assert len(warnings) == 1 and "achieved 150% of the peak" in warnings[0]


@pytest.mark.torch
def test_torch_fp32_peak_times_the_faster_of_its_two_cpu_libraries():
    outcome = peak_measure.measure(_ref("torch_ref"), "fp32", "cpu", size=256, repeats=1)
    assert outcome.status == "ok", outcome.reason
    probed = outcome.settings["gemm_probe_gflops"]
    assert "onednn" in probed and len(probed) == 2  # its BLAS (MKL in PyPI's wheels) and oneDNN
    assert outcome.settings["gemm_library"] == max(probed, key=probed.get)
    assert all(rate > 0.1 for rate in probed.values())  # 2 x 256^3 FLOPs each, timed


@pytest.mark.torch
def test_torch_cpu_products_agree_whichever_library_multiplies():
    torch = pytest.importorskip("torch")
    from accelbench.plugins.torch_ref import gemm

    generator = torch.Generator().manual_seed(0)
    left, right = torch.randn(64, 48, generator=generator), torch.randn(48, 32, generator=generator)
    expected = left.double() @ right.double()
    for name, product in gemm.products(torch, left, right).items():
        result = product()
        result = result.to_dense() if result.is_mkldnn else result
        assert result.shape == (64, 32), name
        assert torch.allclose(result.double(), expected, rtol=1e-4, atol=1e-4), name


def test_the_fastest_product_is_the_one_with_the_least_seconds():
    import time

    from accelbench.plugins.torch_ref import gemm

    name, seconds = gemm.fastest({"slow": lambda: time.sleep(0.02), "quick": lambda: None}, calls=2)
    assert name == "quick" and seconds["slow"] >= 0.02 > seconds["quick"]


class _FakeWorker:
    """A worker whose one product of side N takes ``seconds_per_flop`` x 2N³ seconds."""

    def __init__(self, seconds_per_flop):
        self.seconds_per_flop, self.side, self.calls = seconds_per_flop, None, []

    def call(self, request):
        from accelbench.execution.timing import Timing

        self.calls.append(request)
        if isinstance(request, PrepareMatmul):
            self.side = request.size
            return None
        timed = request.calls
        seconds = 2 * self.side**3 * self.seconds_per_flop
        return [Timing(step_times=[seconds] * timed, wall_time_s=timed * seconds, timed_calls=timed, steps_per_call=1)]


@pytest.mark.parametrize("gflops, side", [(100, 2048), (2, 1024), (0.3, 512), (0.01, 512)])
def test_a_slow_product_is_measured_on_a_smaller_side(gflops, side):
    worker = _FakeWorker(1 / (gflops * 1e9))
    chosen, warning = peak_measure.fitted_size(worker, 2048)
    assert chosen == side and worker.calls == [PrepareMatmul(512), TimeMatmul(1, 1)]
    # one product of the chosen side fits the bound, one of twice the side would not
    assert 2 * chosen**3 / (gflops * 1e9) <= peak_measure.SLOW_PRODUCT_S or chosen == peak_measure.PROBE_SIDE
    assert chosen == 2048 or 2 * (2 * chosen) ** 3 / (gflops * 1e9) > peak_measure.SLOW_PRODUCT_S
    assert (warning is None) == (side == 2048)
    if warning:
        assert warning.startswith("a 512² product took ") and warning.endswith(f"the peak is of {side}² products")


@pytest.mark.torch
@pytest.mark.skipif(NATIVE_BF16, reason="PyTorch's bf16 product is fast where the CPU has bf16")
def test_an_emulated_bf16_peak_is_quick_and_says_so():
    outcome = peak_measure.measure(_ref("torch_ref"), "bf16", "cpu", repeats=1)
    assert outcome.status == "ok", outcome.reason
    assert [w for w in outcome.warnings if w.startswith("bf16 is emulated")], outcome.warnings
    if outcome.measurement.size < 2048:  # slow enough to be measured smaller: the warning says why
        assert any(w.endswith(f"the peak is of {outcome.measurement.size}² products") for w in outcome.warnings)


class _KnownTimeWorker:
    """A worker whose products take known wall times: the peak's arithmetic is checked against
    them exactly (2·n³ FLOPs a product, the best repeat), where a factor of two would pass a
    '> 0 GFLOP/s' check."""

    walls = [0.50, 0.40, 0.45]

    def __init__(self, ref, config, label, python=None):
        pass

    def call(self, request):
        if isinstance(request, Check):
            return None
        if isinstance(request, PrepareMatmul):
            from accelbench import Prepared

            return Prepared(device_name="known cpu", framework_version="1.0")
        calls, repeats = request.calls, request.repeats
        assert repeats == len(self.walls)
        return [Timing(step_times=[w / calls] * calls, wall_time_s=w, timed_calls=calls, steps_per_call=1) for w in self.walls]

    def close(self):
        pass


def test_the_peak_is_two_n_cubed_per_product_over_the_best_repeats_time(testplugins_path, monkeypatch):
    monkeypatch.syspath_prepend(str(testplugins_path))
    monkeypatch.setattr(peak_measure, "Worker", _KnownTimeWorker)
    [ref] = PluginHost().select(backends=["sleepy:fixed-time"])
    outcome = peak_measure.measure(ref, "fp32", "cpu", size=256, repeats=3)
    assert outcome.status == "ok", outcome.reason
    expected = peak_measure.CALLS_PER_REPEAT * 2 * 256**3 / 0.40
    assert outcome.measurement.flops_per_s == pytest.approx(expected, rel=1e-12)
    assert outcome.measurement.size == 256 and outcome.measurement.device_name == "known cpu"


@pytest.mark.mxnet
def test_mxnet_names_its_peak_as_its_records_name_the_device(monkeypatch):
    """A peak is found by the records of the device it was measured on, by name: MXNet's own
    'gpu(0)' would never match the nvidia-smi name its records carry."""
    from accelbench import api
    from accelbench.planning.config import RunConfig
    from accelbench.plugins.mxnet_ngc import training

    monkeypatch.setattr(api, "gpus", lambda: [{"name": "NVIDIA H100 NVL", "driver": "580"}])
    assert training.device_name(RunConfig(device="gpu")) == "NVIDIA H100 NVL"
    outcome = peak_measure.measure(_ref("mxnet_ngc"), "fp32", "cpu", size=128, repeats=1)
    assert outcome.status == "ok", outcome.reason
    assert outcome.measurement.device_name == cpu_model() == training.device_name(RunConfig(device="cpu"))
