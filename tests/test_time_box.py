"""Time-boxed runs, the stable warm-up, counted protocols, and output that works in logs."""

import io
import json
import os
import subprocess
import sys
import time
from datetime import datetime

import pytest
from conftest import load_records

from accelbench.cli.console import LogLines
from accelbench.execution import timing


@pytest.fixture(autouse=True)
def _testplugins_on_path(testplugins_path, monkeypatch):
    monkeypatch.syspath_prepend(str(testplugins_path))


def one_record(accelbench_cli, tmp_path, *args):
    out = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"  # a new file each: -o appends
    result = accelbench_cli("run", "--plugin", "sleepy", *args, "-o", str(out))
    assert result.returncode == 0, result.stderr
    [record] = load_records(out)
    return record


@pytest.mark.slow
def test_a_time_box_stops_on_time_and_keeps_the_figure_exact(accelbench_cli, tmp_path):
    record = one_record(accelbench_cli, tmp_path, "--time", "3s", "--option", "step_ms=20")
    tp = record["throughput"]
    assert tp["wall_time_s"] == pytest.approx(3.0, rel=0.10)
    assert tp["images_per_sec"] == pytest.approx(8 / 0.020, rel=0.02)  # batch 8, 20 ms a step
    assert record["config"]["time_s"] == 3.0 and record["config"]["timed_steps"] is None
    steps = record["steps"]
    assert steps["timed"] == len(record["trials"][0]["step_times_s"]) >= 100
    assert steps["timed_rule"] == f"time box 3 s: {steps['timed']} steps"


@pytest.mark.slow
def test_the_stable_warm_up_ends_when_the_step_time_settles(accelbench_cli, tmp_path):
    record = one_record(
        accelbench_cli, tmp_path, "--time", "1s", "--option", "step_ms=10", "--option", "slow_first=4", "--warmup-steps", "20"
    )
    # 4 slow steps, then 3 steady ones make the window stable
    assert record["steps"]["warmup"] == 7 == record["trials"][0]["warmup_steps"]
    assert record["steps"]["warmup_rule"] == "stable after 7 steps (last 3 within 5% of their median)"
    assert max(record["trials"][0]["step_times_s"]) < 0.02  # no slow step was timed
    capped = one_record(
        accelbench_cli, tmp_path, "--time", "1s", "--option", "step_ms=10", "--option", "slow_first=8", "--warmup-steps", "5"
    )
    assert capped["steps"]["warmup"] == 5
    assert capped["steps"]["warmup_rule"] == "cap of 5 steps reached before the step time was stable"


def test_the_default_is_a_time_box_and_tf_cnn_counts(accelbench_cli, tmp_path):
    from accelbench.planning.config import DEFAULT_TIME_S, RunConfig, timed_phase

    assert timed_phase(RunConfig()) == {"timed_steps": None, "time_s": DEFAULT_TIME_S, "warmup": "stable"}
    assert timed_phase(RunConfig(workers=2)) == {"timed_steps": 100, "time_s": None, "warmup": "fixed"}
    record = one_record(accelbench_cli, tmp_path, "--protocol", "tf_cnn", "--option", "step_ms=1")
    assert record["steps"] == {
        "warmup": 10,
        "timed": 100,
        "steps_per_sample": 1,
        "warmup_rule": "fixed: 10 steps",
        "timed_rule": "counted: 100 steps",
    }


@pytest.mark.parametrize(
    "args, message",
    [
        (["--time", "2s", "--timed-steps", "5"], "give one of --timed-steps and --time"),
        (["--time", "forever"], "--time must be a duration"),
        (["--workers", "2", "--time", "5s"], "multi-worker runs count steps in lock step"),
    ],
)
def test_bad_time_boxes_are_refused_before_any_worker(accelbench_cli, tmp_path, args, message):
    out = tmp_path / "x.json"
    result = accelbench_cli("run", "--plugin", "sleepy", *args, "-o", str(out))
    assert result.returncode == 2 and message in result.stderr and not out.exists()


def test_a_time_box_shorter_than_a_step_still_times_two_calls():
    calls = []
    result = timing.run_timed(lambda: calls.append(1) or time.sleep(0.05), timing.TimingPlan(0, time_box_s=0.01))
    assert result.timed_calls == len(calls) == timing.MIN_TIMED_CALLS


@pytest.mark.slow
def test_a_log_gets_a_line_per_trial_while_the_run_goes(testplugins_path, tmp_path):
    log = tmp_path / "run.log"
    env = {"PYTHONPATH": str(testplugins_path), "PATH": "/usr/bin:/bin"}
    with open(log, "w") as fh:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "accelbench",
                "run",
                "--plugin",
                "sleepy",
                "--time",
                "2s",
                "--trials",
                "3",
                "--option",
                "step_ms=5",
                "-o",
                str(tmp_path / "r.json"),
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
        )
        seen_while_running = ""
        deadline = time.monotonic() + 60
        while run.poll() is None and time.monotonic() < deadline:
            seen_while_running = log.read_text()
            if "end sleepy:fixed-time trial 1: ok" in seen_while_running:
                break
            time.sleep(0.1)
        still_running = run.poll() is None
        assert run.wait(60) == 0
    assert still_running and "start sleepy:fixed-time trial 1 (round 1; trial 1/3 of this run)" in seen_while_running
    text = log.read_text()
    assert "end sleepy:fixed-time trial 3: ok" in text and "img/s over 3 trial(s) (95% CI" in text
    assert "accelbench results" in text and "\x1b[" not in text  # the table, no terminal escapes


def test_log_lines_report_progress_at_most_every_interval(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    lines = LogLines(out, total_trials=1)
    lines.started("p:b", 0, 0)
    for second in range(1, 95):
        clock[0] = 1000.0 + second
        lines.progress("p:b", 0, "timed", second, None)
    progress = [line for line in out.getvalue().splitlines() if "..." in line]
    assert [line.split("] ")[1] for line in progress] == [
        "... p:b trial 1: timed 30 steps, 30 s",
        "... p:b trial 1: timed 60 steps, 60 s",
        "... p:b trial 1: timed 90 steps, 90 s",
    ]


@pytest.mark.slow
def test_json_and_quiet_are_for_scripts(accelbench_cli, tmp_path):
    result = accelbench_cli("run", "--plugin", "sleepy", "--time", "0.5s", "--json", "-o", str(tmp_path / "j.json"))
    assert result.returncode == 0
    document = json.loads(result.stdout)
    assert document["records"][0]["status"] == "ok" and "results:" in result.stderr
    quiet = accelbench_cli("run", "--plugin", "sleepy", "--time", "0.5s", "-q", "-o", str(tmp_path / "q.json"))
    assert quiet.returncode == 0 and quiet.stdout.strip() == f"results: {tmp_path / 'q.json'}"


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"avx2", "fma"}, True),
        ({"avx2", "avx512f", "avx512bw", "avx512vl"}, True),
        ({"avx512f", "avx512_bf16"}, False),
        ({"amx_bf16", "avx512f"}, False),
        (set(), False),
    ],
)
def test_bf16_emulation_is_told_from_the_cpu_flags(flags, expected):
    from accelbench.plugins.shared.cpu_features import bf16_emulation_warning

    warning = bf16_emulation_warning(frozenset(flags))
    assert (warning is not None) == expected
    if expected:
        assert warning.startswith("bf16 is emulated on this CPU")


@pytest.mark.parametrize(
    "ceiling, expected",
    [
        ("ONEDNN_MAX_CPU_ISA=AVX512_CORE", True),
        ("DNNL_MAX_CPU_ISA=avx2", True),
        ("ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI", True),
        ("ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16", False),
        ("DNNL_MAX_CPU_ISA=AVX512_CORE_AMX", False),
        (None, False),
    ],
)
def test_a_onednn_ceiling_below_bf16_emulates_it_whatever_the_cpu_has(ceiling, expected):
    from accelbench.plugins.shared.cpu_features import bf16_emulation_warning

    warning = bf16_emulation_warning(frozenset({"avx512f", "avx512_bf16", "amx_bf16"}), ceiling)
    assert (warning is not None) == expected
    if expected:
        assert warning.startswith(f"bf16 is emulated: oneDNN's instruction-set ceiling {ceiling} holds no bf16")
    # a CPU without bf16 is told first: it holds whatever the ceiling
    assert bf16_emulation_warning(frozenset({"avx2"}), ceiling).startswith("bf16 is emulated on this CPU")


def test_the_onednn_ceiling_is_read_where_onednn_reads_it(monkeypatch):
    from accelbench.plugins.shared.cpu_features import onednn_ceiling

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert onednn_ceiling() is None
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    assert onednn_ceiling() == "DNNL_MAX_CPU_ISA=AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")  # oneDNN 3.x: the newer name first
    assert onednn_ceiling() == "ONEDNN_MAX_CPU_ISA=AVX512_CORE"
    assert onednn_ceiling(("DNNL_MAX_CPU_ISA",)) == "DNNL_MAX_CPU_ISA=AVX2"  # oneDNN 2.x knows only the old


# oneDNN's own lines: 2.4 (mxnet 1.9.1's) and 3.12 (PyTorch 2.14's), as they printed on this project's machines
ONEDNN_2_LOG = """dnnl_verbose,info,oneDNN v2.4.4 (commit 1234)
dnnl_verbose,info,cpu,isa:Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions
dnnl_verbose,exec,cpu,convolution,jit_bf16:avx512_core,forward_training,src_bf16::blocked:aBcd16b:f0,,0.5
"""
ONEDNN_3_LOG = """onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71)
onednn_verbose,v1,info,cpu,isa:Intel AVX10.1 and Intel AMX with bfloat16 and 8-bit integer support
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:bf16::blocked:acdb::f0,,32x32x3x3,0.01
onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx10_1_512_amx,forward_training,src:bf16,,0.4
"""


@pytest.mark.parametrize(
    "log, isa, kernel",
    [
        (ONEDNN_2_LOG, "Intel AVX-512 with AVX512BW, AVX512VL, and AVX512DQ extensions", "jit_bf16:avx512_core"),
        (ONEDNN_3_LOG, "Intel AVX10.1 and Intel AMX with bfloat16 and 8-bit integer support", "brg_conv_fwd:avx10_1_512_amx"),
        ("some other output\n", None, None),
    ],
)
def test_onednn_verbose_logs_of_both_formats_are_read(log, isa, kernel):
    from accelbench.plugins.shared.cpu_features import onednn_verbose_read_back

    assert onednn_verbose_read_back(log) == {"onednn_isa": isa, "onednn_convolution": kernel}


def test_a_onednn_probe_that_fails_or_hangs_reads_back_nothing_and_is_not_kept(monkeypatch, tmp_path):
    from accelbench.plugins.shared.cpu_features import OnednnProbe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # as the records spell it
    unread = {"onednn_isa": None, "onednn_convolution": None, "onednn_probe": "a probe process of this run"}
    for _ in range(2):  # nothing kept: the second probe runs too
        failed = OnednnProbe("accelbench_no_such_probe", (), "ONEDNN_VERBOSE", "none 0")
        assert failed.process is not None and failed.read_back() == unread
    monkeypatch.setattr(OnednnProbe, "timeout_s", 0.5)
    started = time.monotonic()
    hanging = OnednnProbe("timeit", ("-n1", "-r1", "import time; time.sleep(30)"), "ONEDNN_VERBOSE", "none 0")
    assert hanging.read_back() == unread and time.monotonic() - started < 10
    assert hanging.process is not None and hanging.process.returncode is not None  # killed, not left running
    assert not (tmp_path / "accelbench" / "onednn-probes").exists() or not any(
        (tmp_path / "accelbench" / "onednn-probes").iterdir()
    )


FAKE_PROBE = """import sys
print("onednn_verbose,v1,info,cpu,isa:" + sys.argv[1])
print("onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,forward_training,src:bf16")
"""


def test_a_probes_read_back_is_kept_for_the_same_machine_framework_and_environment(monkeypatch, tmp_path):
    """A second worker with everything that decides oneDNN's kernel the same reads the first's
    probe from the cache and says so; another framework version, probe argument or oneDNN
    variable probes afresh; a variable oneDNN does not read changes nothing."""
    from accelbench.plugins.shared.cpu_features import OnednnProbe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    (tmp_path / "fake_probe.py").write_text(FAKE_PROBE)  # what oneDNN's verbose log would say
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    def probe(framework="fake 1.0", isa="Intel AMX"):
        return OnednnProbe("fake_probe", (isa,), "ONEDNN_VERBOSE", framework)

    first = probe()
    assert first.process is not None
    assert first.read_back() == {
        "onednn_isa": "Intel AMX",
        "onednn_convolution": "brg_conv_fwd:avx512_core_amx",
        "onednn_probe": "a probe process of this run",
    }
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # no variable of oneDNN's
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:40001"]}}')  # a job's own ports
    again = probe()
    assert again.process is None  # no process started
    kept = again.read_back()
    assert {k: kept[k] for k in ("onednn_isa", "onednn_convolution")} == {
        k: first.read_back()[k] for k in ("onednn_isa", "onednn_convolution")
    }
    assert kept["onednn_probe"].startswith("a probe process of 20") and "kept in the cache" in kept["onednn_probe"]
    assert probe(framework="fake 1.1").process is not None
    assert probe(isa="Intel AVX-512").process is not None
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert probe().process is not None


def test_a_framework_reinstalled_under_the_same_version_is_another_probe_key(tmp_path):
    """Another build of one version (another oneDNN inside) lies in newly written files."""
    from types import SimpleNamespace

    from accelbench.plugins.shared.cpu_features import framework_identity

    init = tmp_path / "fakefw" / "__init__.py"
    init.parent.mkdir()
    init.write_text("")
    framework = SimpleNamespace(__name__="fakefw", __version__="2.0", __file__=str(init))
    before = framework_identity(framework)
    assert before.startswith(f"fakefw 2.0 at {init} (")
    os.utime(init, ns=(init.stat().st_atime_ns, init.stat().st_mtime_ns + 10**9))  # reinstalled
    assert framework_identity(framework) != before


@pytest.mark.parametrize(
    "kernel, flags, expected",
    [
        ("brg_conv_fwd:avx10_1_512_amx", {"avx2"}, None),  # what oneDNN ran outranks the flags
        ("brgconv:avx512_core_amx_bf16", set(), None),
        ("brg_conv_fwd:avx512_core_bf16", set(), None),
        ("jit_bf16:avx512_core", {"avx512_bf16", "amx_bf16"}, "bf16 is emulated: X's oneDNN ran its bf16 convolution"),
        ("jit:avx2", {"avx2"}, "bf16 is emulated: X's oneDNN ran its bf16 convolution"),
        (None, {"avx2"}, "bf16 is emulated on this CPU"),  # oneDNN ran none: the CPU's flags tell
        (None, {"avx512_bf16"}, None),
        ("gemm:jit", {"avx2"}, "bf16 is emulated on this CPU"),  # no instruction set in its name
    ],
)
def test_bf16_emulation_is_told_from_the_kernel_onednn_ran(kernel, flags, expected, monkeypatch):
    from accelbench.plugins.shared.cpu_features import bf16_emulation_from_onednn

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    warning = bf16_emulation_from_onednn("X", {"onednn_isa": "Intel AVX2", "onednn_convolution": kernel}, frozenset(flags))
    assert warning is None if expected is None else warning.startswith(expected), warning


# XLA's optimised HLO as this project's jaxlib (0.10.2) printed it on a CPU for one bf16 convolution:
# converts to f32 in front of an f32 convolution; and lines written here in the form XLA's GPU
# backend gives its cuDNN calls (no GPU was at hand to print one), with the operands' types spelt out
XLA_CPU_BF16_CONVOLUTION = """ENTRY %main.1 (x.1: bf16[2,8,8,4], w.1: bf16[3,3,4,4]) -> bf16[2,8,8,4] {
  %x.1 = bf16[2,8,8,4]{3,2,1,0} parameter(0), metadata={op_name="x"}
  %w.1 = bf16[3,3,4,4]{3,2,1,0} parameter(1), metadata={op_name="w"}
  %wrapped_convert = f32[2,8,8,4]{3,2,1,0} fusion(%x.1), kind=kLoop, calls=%wrapped_convert_computation
  %wrapped_convert.1 = f32[3,3,4,4]{3,2,1,0} fusion(%w.1), kind=kLoop, calls=%wrapped_convert_computation.1
  %conv_general_dilated.1 = f32[2,8,8,4]{3,2,1,0} convolution(%wrapped_convert, %wrapped_convert.1), \
window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  %dot.2 = f32[8,4]{1,0} dot(%wrapped_convert.1, %wrapped_convert.1), lhs_contracting_dims={1}
  ROOT %wrapped_convert.2 = bf16[2,8,8,4]{3,2,1,0} fusion(%conv_general_dilated.1), kind=kLoop
}"""
XLA_GPU_BF16_CONVOLUTION = """  %cudnn-conv.1 = (bf16[8,56,56,64]{3,2,1,0}, u8[0]{0}) custom-call(bf16[8,56,56,64]{3,2,1,0} %p.0, \
bf16[3,3,64,64]{3,2,1,0} %p.1), window={size=3x3 pad=1_1x1_1}, custom_call_target="__cudnn$convForward"
  %other = (f32[4]{0}, u8[0]{0}) custom-call(f32[4]{0} %p.2), custom_call_target="Sharding"
  %conv.2 = f32[8,56,56,64]{3,2,1,0} convolution(bf16[8,56,56,64]{3,2,1,0} %p.0, f32[3,3,64,64]{3,2,1,0} %p.3)"""


@pytest.mark.parametrize(
    "text, convolutions, dots",
    [
        (XLA_CPU_BF16_CONVOLUTION, {"f32": 1}, {"f32": 1}),
        (XLA_GPU_BF16_CONVOLUTION, {"bf16": 1, "bf16,f32": 1}, {}),  # not the cuDNN call that is no convolution
        ("HloModule nothing", {}, {}),
    ],
)
def test_what_xla_compiled_is_read_from_its_hlo(text, convolutions, dots):
    from accelbench.plugins.jax_flax import hlo

    assert hlo.convolution_operands(text) == convolutions
    assert hlo.dot_operands(text) == dots


@pytest.mark.parametrize(
    "operands, platform, flags, expected",
    [
        (
            {"f32": 158},
            "cpu",
            {"avx512_bf16", "amx_bf16"},
            "bf16 is emulated: XLA's CPU backend compiled the step's convolutions with f32 operands (158, none in bf16",
        ),
        ({"f32": 158}, "gpu", set(), "bf16 is emulated: XLA's GPU backend"),  # a GPU without bf16 units
        ({"bf16": 158}, "cpu", {"avx512_bf16"}, None),
        ({"bf16": 158}, "cpu", {"avx2"}, "bf16 is emulated on this CPU"),  # XLA kept bf16: the CPU's flags tell
        ({"bf16,f32": 2}, "gpu", set(), None),
        ({}, "cpu", {"avx2"}, "bf16 is emulated on this CPU"),  # nothing read: the flags
        ({}, "gpu", set(), None),
    ],
)
def test_bf16_emulation_is_told_from_what_xla_compiled(operands, platform, flags, expected, monkeypatch):
    from accelbench import api
    from accelbench.plugins.jax_flax.training import emulation_warnings

    monkeypatch.setattr(api, "cpu_flags", lambda: frozenset(flags))
    warnings = emulation_warnings("bf16", platform, operands, "the step's convolutions")
    if expected is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].startswith(expected), warnings
    assert emulation_warnings("fp32", platform, operands, "the step's convolutions") == []


def _bare_step_s(testplugins_path, step_ms: float) -> float:
    """The sleepy backend's step, called in a bare loop here: seconds a step, the best of 3."""
    sys.path.insert(0, str(testplugins_path))
    try:
        from accelbench_testplugins.sleepy import Sleepy
    finally:
        sys.path.remove(str(testplugins_path))
    from accelbench.planning.config import RunConfig

    backend, calls = Sleepy(), 20_000
    backend.prepare(RunConfig.from_dict({"options": {"step_ms": step_ms}}))
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        for _ in range(calls):
            backend.step()
        best = min(best, (time.perf_counter() - began) / calls)
    return best


@pytest.mark.slow
def test_a_step_of_microseconds_is_timed_in_samples_and_its_record_stays_small(accelbench_cli, testplugins_path, tmp_path):
    """#66: a 10 us step in a 10 s time box is timed in samples of whole calls lasting at least
    ``timing.MIN_SAMPLE_S`` (as pyperf calibrates its loops): the record says how many steps a
    sample holds, stays far under 1 MB, its figure is the step's true rate, and the run ends
    within a second of its last step."""
    out = tmp_path / "tiny.json"
    result = accelbench_cli("run", "--plugin", "sleepy", "--option", "step_ms=0.01", "--time", "10s", "-o", str(out))
    finished = time.time()
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size < 1_000_000
    [record] = load_records(out)
    steps, [trial] = record["steps"], record["trials"]
    assert steps["steps_per_sample"] >= 100 and steps["timed"] >= 10 * steps["steps_per_sample"]
    assert len(trial["step_times_s"]) <= 2 * 10 / timing.MIN_SAMPLE_S  # samples sized from the warm-up's pace
    # the step busy-waits 10 us, and its own Python around that costs 0.5 to 2.5 us by the CPU: the
    # record's rate is the step's, as a bare loop in this process times it (the loop around it
    # costs well under a microsecond a call)
    assert record["throughput"]["images_per_sec"] == pytest.approx(8 / _bare_step_s(testplugins_path, 0.01), rel=0.15)
    assert record["throughput"]["images"] == 8 * steps["timed"]
    ended = datetime.fromisoformat(trial["ended_utc"].replace("Z", "+00:00")).timestamp()
    assert finished - ended < 2.0  # the host's statistics, the write and the table, then its exit
