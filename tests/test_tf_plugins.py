"""tf_benchmarks and tpu_official through the host, with tiny shapes on the CPU."""

import importlib.util
import subprocess
import sys

import pytest
from conftest import (
    assert_cpu_footprint,
    assert_emulated_under_plain_avx512,
    assert_measured_huge_pages,
    assert_onednn_read_back,
    loss_falls,
    run_backend,
)

# not importorskip: the test process itself must never import a framework (only workers do)
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow not installed (pip install accelbench[tf])", allow_module_level=True)
pytestmark = pytest.mark.tf

#: the small thumbnail ResNet: for what does not depend on the model (a setting read back, the
#: strategy, the loop's accounting), it builds and traces in a fraction of ResNet-50's time
SMALL = dict(model="resnet_small", image_size=16)

# forward multiply-adds of one 224x224 image, conv + dense layers (ResNet-50 v1 / v1.5)
RESNET50_V1_MACS = 3.858e9
RESNET50_V15_MACS = 4.089e9


def test_tf_benchmarks_trains_and_records_fp32():
    record = run_backend("tf_benchmarks", timed_steps=30, warmup_steps=0)
    assert record["status"] == "ok", record["reason"]
    assert record["precision"] == "fp32" and record["model"]["variant"] == "v1"
    assert record["settings"]["variable_dtype"] == "float32"
    assert record["settings"]["compute_dtype"] == "float32"
    assert record["settings"]["conv_biases"] is False  # tf_cnn's ResNet-50: none before a batch norm
    assert record["settings"]["frameworks_loaded"] == ["tensorflow", "tf_keras"]
    assert record["framework"]["name"] == "tensorflow" and record["framework"]["version"].startswith("2.")
    assert loss_falls(record["trials"][0]["losses"]), record["trials"][0]["losses"]
    assert_measured_huge_pages(record, measured=True)
    assert_cpu_footprint(record)


@pytest.mark.parametrize("asked, used", [("0", "off"), ("1", "on")])
def test_the_onednn_setting_is_read_back_from_tensorflow(monkeypatch, asked, used):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", asked)  # the worker inherits the host's environment
    record = run_backend("tf_benchmarks", timed_steps=2, warmup_steps=1, **SMALL)
    assert record["status"] == "ok", record["reason"]
    assert record["settings"]["onednn"] == f"{used} (TF_ENABLE_ONEDNN_OPTS={asked})"
    # what oneDNN ran, from its own log: nothing where TensorFlow sent it no convolution
    kernel, isa = record["settings"]["onednn_convolution"], record["settings"]["onednn_isa"]
    if used == "off":
        assert kernel is None and isa is None, (kernel, isa)
    else:  # oneDNN's words: "brg_conv_fwd:avx512_core", "Intel AVX2", "Intel AVX-512 with ..."
        assert ":" in kernel and "bf16" not in kernel and isa.startswith("Intel"), (kernel, isa)


#: the CPU features TF 2.21 turns its oneDNN ops on for by itself (x86 Linux)
TF_ONEDNN_BY_DEFAULT = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize("onednn", [None, False])
def test_the_plugin_turns_onednn_on_unless_its_option_says_false(monkeypatch, onednn):
    from accelbench.environments.machine import cpu_flags

    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    options = {} if onednn is None else {"onednn": onednn}
    record = run_backend("tf_benchmarks", timed_steps=2, warmup_steps=1, options=options, **SMALL)
    assert record["status"] == "ok", record["reason"]
    if onednn is None:  # on everywhere, where TensorFlow itself leaves it off too (AVX2-only Zen 3)
        assert record["settings"]["onednn"] == "on (TF_ENABLE_ONEDNN_OPTS=1, set by the plugin's option onednn)"
        assert ":" in record["settings"]["onednn_convolution"], record["settings"]
    else:  # TensorFlow's own choice, from the CPU
        used = "on" if cpu_flags() & TF_ONEDNN_BY_DEFAULT else "off"
        assert record["settings"]["onednn"] == f"{used} (TensorFlow's default on this CPU)"
        assert (record["settings"]["onednn_convolution"] is None) == (used == "off")


def test_tf_benchmarks_mirrored_over_two_logical_cpus():
    record = run_backend("tf_benchmarks", device="cpu", device_count=2, per_device_batch=4, **SMALL)
    assert record["status"] == "ok", record["reason"]
    assert record["batch"]["global"] == 8 == 2 * record["batch"]["per_device"]
    assert record["settings"]["strategy"] == "MirroredStrategy"
    assert record["settings"]["replicas"] == 2 and len(record["settings"]["devices"]) == 2
    assert record["throughput"]["images"] == 8 * 5


def test_tf_benchmarks_bf16_records_bf16(monkeypatch, tmp_path):
    from accelbench.environments.machine import cpu_flags
    from accelbench.plugins.shared.cpu_features import bf16_emulation_warning

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no probe kept: this run's probe reads oneDNN

    # the thumbnail ResNet: what is read back does not depend on the model, and a CPU without bf16
    # (Zen 3) emulates every bf16 product of the step, ResNet-50's at great cost
    record = run_backend("tf_benchmarks", precision="bf16", timed_steps=2, warmup_steps=1, **SMALL)
    # native here (Zen 4, Xeon): no warning; emulated (Zen 3): the record says so
    emulated = bf16_emulation_warning(cpu_flags())
    assert (emulated in record["warnings"]) if emulated else not any("emulated" in w for w in record["warnings"])
    assert "cpu_flags" in record["environment"] and set(record["environment"]["cpu_flags"]) <= cpu_flags()
    assert record["status"] == "ok", record["reason"]
    assert_onednn_read_back(record)
    assert record["precision"] == "bf16"
    assert record["settings"]["compute_dtype"] == "bfloat16"
    assert record["settings"]["variable_dtype"] == "float32"
    assert record["settings"]["onednn_probe"] == "a probe process of this run"


@pytest.mark.parametrize(
    "environment, emulated_by",
    [
        ({"TF_ENABLE_ONEDNN_OPTS": "0"}, "bf16 is emulated: TensorFlow's oneDNN ops are off (TF_ENABLE_ONEDNN_OPTS=0)"),
        ({"TF_ENABLE_ONEDNN_OPTS": "1"}, None),
    ],
)
def test_a_bf16_record_says_where_tensorflow_emulates_it(monkeypatch, environment, emulated_by):
    from accelbench.environments.machine import cpu_flags
    from accelbench.plugins.shared.cpu_features import bf16_emulation_warning

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    for variable, value in environment.items():  # the worker inherits the host's environment
        monkeypatch.setenv(variable, value)
    record = run_backend("tf_benchmarks", precision="bf16", timed_steps=2, warmup_steps=1, **SMALL)
    assert record["status"] == "ok", record["reason"]
    emulated = [w for w in record["warnings"] if "emulated" in w]
    # a CPU without bf16 (Zen 3): said always, from the flags, or from the kernel where oneDNN ran one
    on_this_cpu = bf16_emulation_warning(cpu_flags())
    if on_this_cpu:
        ran = "bf16 is emulated: TensorFlow's oneDNN ran its bf16 convolution with"
        assert len(emulated) == 1 and emulated[0].startswith((on_this_cpu, ran)), emulated
    elif emulated_by:
        assert len(emulated) == 1 and emulated[0].startswith(emulated_by), emulated
    else:
        assert emulated == []


def test_a_onednn_ceiling_below_bf16_is_read_back_as_emulation(monkeypatch):
    from accelbench.environments.machine import cpu_flags
    from accelbench.plugins.shared.cpu_features import NATIVE_BF16_FLAGS

    if not cpu_flags() & NATIVE_BF16_FLAGS:
        pytest.skip("TensorFlow sends oneDNN bf16 convolutions only where the CPU has bf16")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")  # the worker inherits the host's environment
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    record = run_backend("tf_benchmarks", precision="bf16", timed_steps=2, warmup_steps=1, **SMALL)
    assert_emulated_under_plain_avx512(record, "TensorFlow")


def test_fp16_on_cpu_is_unavailable_not_a_crash():
    record = run_backend("tf_benchmarks", precision="fp16")
    assert record["status"] == "unavailable"
    assert "fp16 mixed precision needs a GPU" in record["reason"]


def test_flops_counted_from_the_model_v1_and_v15():
    v1 = run_backend("tf_benchmarks", image_size=224, num_classes=1000, global_batch=1, warmup_steps=0, timed_steps=1)
    v15 = run_backend(
        "tf_benchmarks", image_size=224, num_classes=1000, global_batch=1, warmup_steps=0, timed_steps=1, variant="v1.5"
    )
    assert v1["flops"]["per_image"] == pytest.approx(6 * RESNET50_V1_MACS, rel=0.002)
    assert v15["flops"]["per_image"] == pytest.approx(6 * RESNET50_V15_MACS, rel=0.002)
    assert v1["flops"]["achieved_per_s"] == pytest.approx(v1["flops"]["per_image"] * v1["throughput"]["images_per_sec"])


def test_v15_moves_the_stride_into_the_3x3_and_no_conv_has_a_bias():
    code = (
        "import tf_keras as k\n"
        "from accelbench.plugins.shared.tf_common import resnet50\n"
        "m = resnet50(k, 'v1.5', (224, 224, 3), 1000)\n"
        "s = {l.name: l.strides for l in m.layers if l.name.startswith('conv3_block1_') and hasattr(l, 'strides')}\n"
        "convs = [l for l in m.layers if type(l).__name__ == 'Conv2D']\n"
        "print(s['conv3_block1_1_conv'], s['conv3_block1_2_conv'], s['conv3_block1_0_conv'], m.output_shape,\n"
        "      len(convs), sum(l.use_bias for l in convs), sum(v.shape.num_elements() for v in m.trainable_weights))"
    )
    # 53 convolutions, none with a bias: the 25,557,032 trained parameters of the reference ResNet-50
    assert last_line_printed(code) == "(1, 1) (2, 2) (2, 2) (None, 1000) 53 0 25557032"


def test_the_stem_pools_with_same_padding_as_the_tensorflow_references():
    # tf_cnn_benchmarks, the official TPU model and the Model Garden: max_pool(3, 2, "SAME") on the
    # stem's ReLU, no padded copy of it (Keras' ResNet50 has a ZeroPadding2D + "valid" there)
    code = (
        "import numpy as np, tensorflow as tf, tf_keras as k\n"
        "from accelbench.plugins.shared.tf_common import resnet50\n"
        "m = resnet50(k, 'v1', (64, 64, 3), 10)\n"
        "pads = [l.name for l in m.layers if type(l).__name__ == 'ZeroPadding2D']\n"
        "relu, pool = m.get_layer('conv1_relu'), m.get_layer('pool1_pool')\n"
        "r, p = k.Model(m.input, [relu.output, pool.output])(\n"
        "    np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype('float32'), training=False)\n"
        "print(pads, pool.padding, tuple(p.shape), float(tf.reduce_max(tf.abs(p - tf.nn.max_pool2d(r, 3, 2, 'SAME')))))"
    )
    assert last_line_printed(code) == "['conv1_pad'] same (2, 16, 16, 64) 0.0"


def last_line_printed(code: str) -> str:
    """The last line ``code`` prints, run in a fresh Python (this process imports no framework)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[-1]


def test_tpu_official_bf16_v15_with_fp32_variables():
    record = run_backend("tpu_official", options={"steps_per_loop": 2}, timed_steps=4, warmup_steps=2)
    assert record["status"] == "ok", record["reason"]
    assert record["precision"] == "bf16" and record["model"]["variant"] == "v1.5"
    assert record["device"]["kind"] == "cpu"
    assert record["settings"]["variable_dtype"] == "float32"
    assert record["settings"]["compute_dtype"] == "bfloat16"
    assert record["settings"]["mixed_precision_policy"] == "mixed_bfloat16"
    assert record["batch"]["semantics"] == "global"
    assert_measured_huge_pages(record, measured=True)


def test_tpu_official_loss_falls():
    record = run_backend("tpu_official", options={"steps_per_loop": 1}, timed_steps=30, warmup_steps=0, **SMALL)
    assert loss_falls(record["trials"][0]["losses"]), record["trials"][0]["losses"]


def test_steps_per_loop_accounting_matches_one_step_per_call():
    one = run_backend("tpu_official", options={"steps_per_loop": 1}, timed_steps=12, warmup_steps=4, **SMALL)
    four = run_backend("tpu_official", options={"steps_per_loop": 4}, timed_steps=12, warmup_steps=4, **SMALL)
    assert four["steps"] == {
        "warmup": 4,
        "timed": 12,
        "steps_per_sample": 4,
        "warmup_rule": "fixed: 4 steps",
        "timed_rule": "counted: 12 steps",
    }
    assert len(four["trials"][0]["step_times_s"]) == 3  # 12 steps in 3 host round-trips
    assert four["throughput"]["images"] == one["throughput"]["images"] == 12 * 8
    ratio = four["throughput"]["images_per_sec"] / one["throughput"]["images_per_sec"]
    # same work; a per-call accounting slip would be 4x off (or 1/4). Not tighter: of 12 steps on 2
    # busy cores, fewer host round trips alone made the loops 1.63x as fast once (CI, 2026-12-07)
    assert 0.5 < ratio < 2.5, ratio


def test_tpu_requested_without_tpu_is_unavailable():
    record = run_backend("tpu_official", device="tpu")
    assert record["status"] == "unavailable"
    assert record["reason"].startswith("no TPU reachable")
    assert record["device"]["kind"] == "tpu" and record["throughput"] is None
