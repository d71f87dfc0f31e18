"""Reference benchmark: every built-in plugin beside each reference implementation that exists
for it, alternating on this machine, at each batch of a sweep, so "at least the reference" is
decided on the same CPU in the same hour.

- tf_cnn_benchmarks (the 2018 study's "TF benchmark repo"), run from ../shared/references (never
  copied into this project) with `TF_USE_LEGACY_KERAS=1`, beside `tf_benchmarks` (v1 against
  `--model=resnet50`, v1.5 against `--model=resnet50_v1.5`); fp32 (it has no bf16 flag on a CPU).
  Its figure: its own "total images/sec" over the steps after its warm-up.
- MXNet's `train_imagenet.py --benchmark 1` (the study's MXNet script, symbolic Module API), run
  from ../shared/references with the numpy alias shim and OMP_NUM_THREADS = cores, beside
  `mxnet_ngc --variant v1` (`--network resnet-v1 --num-layers 50`: stride in the first 1x1, no
  conv biases); fp32 (its --dtype has no bf16). Its figure: the Speedometer's windows after the
  first (which holds the start-up), pooled as images / seconds.
- The TF Model Garden ResNet-50 (Keras 2, v1.5), which pins TensorFlow 2.20 and numpy 2, from
  its own virtual environment (`python3 -m venv .venv-garden && .venv-garden/bin/pip install
  tf-models-official==2.20.0`), beside `tf_benchmarks --variant v1.5` and `tpu_official`.
- The bare hybridized Gluon model-zoo loop (`bare_mxnet.py --conv-biases`) beside `mxnet_ngc`,
  the bare PyTorch loop (`bare_torch.py`) beside `torch_ref`, and the bare JAX loop
  (`bare_jax.py`, in the plugin's own environment) beside `jax_flax`. A bare loop is ours, not a
  program someone ships, so it gets the malloc (and MXNet's oneDNN ceiling) the plugin's worker
  had; the shipped references run as they ship (the C library's malloc), or with the plugin's
  (`--shipped-malloc plugin`), which tells a framework's lead from its allocator's; the TF ones
  with TensorFlow's own oneDNN choice, or the TF plugin's (`--shipped-onednn plugin`: the plugins
  turn oneDNN on where TF 2.21 leaves it off, on a CPU without AVX-512 VNNI/bf16 or AMX).

    python tests/benchmarks/bench_reference.py --batch-sizes 8,32 --timed 20 --rounds 4
    python tests/benchmarks/bench_reference.py --case tfcnn-v1-fp32 --case mxscript-v1-fp32
    python tests/benchmarks/bench_reference.py --case mxscript-v1-fp32 --shipped-malloc plugin

Prints the machine (CPU model, cores, vector/matrix flags), then per case and batch: images/sec
of both, each round's ratio, the ratio with its 95% interval from the paired rounds (accelbench's
own `compare` statistics: t-interval on log-ratios, order effect removed; "-" under 3 rounds),
the pooled ratio (all images / all seconds of each side), GFLOP/s and the share
of the peak `accelbench peak` measured here (when it has been run), and the verdict against the
bar "at least the reference" with the benchmarks' 2% margin: ahead (the interval above 1), not
behind (above 0.98), behind (below 0.98) or undecided. `--max-rounds N` adds rounds, one at a
time, while the verdict is undecided (a sequential rule: each look's interval is wider, so the
whole procedure still errs at most 5% of the time). Exit status 1 if a ratio's point estimate is
below 0.98.

    python tests/benchmarks/bench_reference.py --case torch-fp32 --batch-sizes 8 --rounds 4 --max-rounds 10

`--lockstep STEPS` runs the cases in lockstep (`lockstep.py`): the plugin's worker (as `accelbench
run` starts it) and the reference both alive and warm, taking turns in blocks of STEPS steps, a
round being one block of each, so the blocks of a pair are seconds apart, not the half-minute of
two fresh processes, and a VM whose speed drifts over tens of seconds moves both alike. A bare loop
is asked for each block; a shipped reference runs as it ships, printing a line a step, and is
stopped (SIGSTOP) after its block's last step line and continued (SIGCONT) for its next, its
stopped time left out of its seconds. tpu-bf16's sides run whole loops of 10 steps (the plugin a
loop a call, the Model Garden a line a loop): its warm-up and blocks are rounded up to whole loops.
It compares the warm steady state; rounds of whole runs, the default, also hold each side's
start-up and first steps.

    python tests/benchmarks/bench_reference.py --case torch-bf16 --batch-sizes 8 --lockstep 3 --rounds 30
    python tests/benchmarks/bench_reference.py --case tfcnn-v1-fp32 --batch-sizes 32 --lockstep 1 --rounds 4 --pairs 12

The rounds of one lockstep run share its two processes, and with them whatever each process
decided once (where its memory landed, its threads' placement, its JIT's kernels): their interval
is the spread of blocks, and two runs of one case can decide opposite ways. `--pairs P` opens P
pairs of processes one after the other, each for --rounds rounds (the side that starts and blocks
first alternating from pair to pair), and makes the pair the unit of the interval.

    python tests/benchmarks/bench_reference.py --case jax-bf16 --batch-sizes 32 --lockstep 1 --rounds 2 --pairs 8

`--device gpu` runs the cases whose bare loop takes a device (torch, jax) with both sides on the
GPU (two JAX processes on one card want `XLA_PYTHON_CLIENT_PREALLOCATE=false`); the shipped
references are run on the CPU here, so their cases are refused there.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lockstep
from bench_overhead import MIN_RATIO, alternate, bar_verdict, exit_if_below, more_rounds, paired, run_accelbench, run_bare

#: the references' folder beside the project (``--references`` to point elsewhere)
REFERENCES = Path(__file__).resolve().parents[3] / "shared" / "references"
TF_CNN_RATE = re.compile(r"total images/sec: ([\d.]+)")
SPEEDOMETER = re.compile(r"Speed: ([\d.]+) samples/sec")

GARDEN_MAIN = "official.legacy.image_classification.resnet.resnet_ctl_imagenet_main"
TIME_HISTORY = re.compile(r"TimeHistory: ([\d.]+) seconds, [\d.]+ examples/second between steps (\d+) and (\d+)")
#: the line a shipped reference prints for each step when asked to print one a step (lockstep)
STEP_LINES = {"tf_cnn": re.compile(r"^\d+\timages/sec:"), "mxnet_script": SPEEDOMETER, "garden": TIME_HISTORY}
#: steps a shipped reference is started for in lockstep: more than any run asks for (it is killed
#: once its blocks are done)
LOCKSTEP_STEPS = 1_000_000
#: warm-up steps a shipped reference runs before its first step line in lockstep: the Speedometer's
#: batch 0 (its clock starts there); tf_cnn_benchmarks is asked for no warm-up batch of its own and
#: the Model Garden logs from its first step. Its side then waits for --warmup minus these lines,
#: so both sides' first block follows --warmup steps
UNPRINTED_STEPS = {"tf_cnn": 0, "mxnet_script": 1, "garden": 0}

# name: (accelbench arguments, reference kind, reference arguments)
CASES = {
    "tfcnn-v1-fp32": (["--plugin", "tf_benchmarks", "--variant", "v1", "--precision", "fp32"], "tf_cnn", ["--model=resnet50"]),
    "tfcnn-v15-fp32": (
        ["--plugin", "tf_benchmarks", "--variant", "v1.5", "--precision", "fp32"],
        "tf_cnn",
        ["--model=resnet50_v1.5"],
    ),
    "mxscript-v1-fp32": (
        ["--plugin", "mxnet_ngc", "--variant", "v1", "--precision", "fp32"],
        "mxnet_script",
        ["--network", "resnet-v1", "--num-layers", "50"],
    ),
    "tf-fp32": (
        ["--plugin", "tf_benchmarks", "--variant", "v1.5", "--precision", "fp32"],
        "garden",
        ["--dtype", "fp32", "--steps_per_loop", "1"],
    ),
    "tf-bf16": (
        ["--plugin", "tf_benchmarks", "--variant", "v1.5", "--precision", "bf16"],
        "garden",
        ["--dtype", "bf16", "--steps_per_loop", "1"],
    ),
    "tpu-bf16": (
        ["--plugin", "tpu_official", "--option", "steps_per_loop=10"],
        "garden",
        ["--dtype", "bf16", "--steps_per_loop", "10"],
    ),
    "mxnet-fp32": (
        ["--plugin", "mxnet_ngc", "--precision", "fp32"],
        "bare",
        ["bare_mxnet.py", "--precision", "fp32", "--conv-biases"],
    ),
    "mxnet-bf16": (
        ["--plugin", "mxnet_ngc", "--precision", "bf16"],
        "bare",
        ["bare_mxnet.py", "--precision", "bf16", "--conv-biases"],
    ),
    "torch-fp32": (["--plugin", "torch_ref", "--precision", "fp32"], "bare", ["bare_torch.py", "--precision", "fp32"]),
    "torch-bf16": (["--plugin", "torch_ref", "--precision", "bf16"], "bare", ["bare_torch.py", "--precision", "bf16"]),
    "jax-bf16": (["--plugin", "jax_flax", "--precision", "bf16"], "bare", ["bare_jax.py", "--precision", "bf16"]),
    "jax-fp32": (["--plugin", "jax_flax", "--precision", "fp32"], "bare", ["bare_jax.py", "--precision", "fp32"]),
}
#: steps per host loop of a case whose both sides log or time whole loops only: its warm-up, timed
#: steps and lockstep blocks are rounded up to multiples of it (``whole_loops``)
LOOP_STEPS = {"tpu-bf16": 10}
#: the bare loops that run on a GPU too (``--device gpu``); the shipped references run on the CPU here
DEVICE_LOOPS = {"bare_torch.py", "bare_jax.py"}
WHAT = {
    "tf_cnn": "tf_cnn_benchmarks",
    "mxnet_script": "MXNet train_imagenet.py",
    "garden": "TF Model Garden",
    "bare": "bare loop",
}


def tf_cnn_command(references, args, batch, warmup, timed):
    """tf_cnn_benchmarks' script and arguments as its README in ../shared/references runs it (with
    TF_USE_LEGACY_KERAS=1 in its environment)."""
    return [
        str(references / "tf_cnn_benchmarks" / "tf_cnn_benchmarks.py"),
        "--device=cpu",
        "--data_format=NHWC",
        f"--batch_size={batch}",
        f"--num_batches={timed}",
        f"--num_warmup_batches={warmup}",
        "--optimizer=momentum",
        "--variable_update=parameter_server",
        "--local_parameter_device=cpu",
        *args,
    ]


def run_tf_cnn(references, args, batch, warmup, timed, env=None):
    """tf_cnn_benchmarks as its README runs it; (images, seconds) of its timed steps from its own
    images/sec."""
    out = subprocess.run(
        [sys.executable, *tf_cnn_command(references, args, batch, warmup, timed)],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_USE_LEGACY_KERAS="1", **(env or {})),
    )
    found = TF_CNN_RATE.findall(out.stdout)
    if out.returncode or not found:
        raise SystemExit(f"tf_cnn_benchmarks failed:\n{(out.stdout + out.stderr)[-2000:]}")
    images = batch * timed
    return images, images / float(found[-1])


def run_mxnet_script(references, args, batch, warmup, timed, env=None):
    """MXNet's train_imagenet.py --benchmark 1 (synthetic data); one Speedometer window per
    ``warmup`` batches after batch 0 (where its clock starts), the first window (the warm-up) left
    out, the rest pooled as images / seconds."""
    if timed % warmup:
        raise SystemExit("--timed must be a multiple of --warmup (one Speedometer window per warm-up)")
    with tempfile.TemporaryDirectory() as shim:
        # + 1 batch: the Speedometer starts its clock at the end of batch 0
        out = subprocess.run(
            mxnet_script_command(args, batch, warmup + timed + 1, disp_batches=warmup),
            capture_output=True,
            text=True,
            cwd=references / "mxnet_image_classification",
            env={**os.environ, **mxnet_script_environment(references, shim), **(env or {})},
        )
    return speedometer_figure(out.returncode, out.stderr, batch, warmup, timed)


def mxnet_script_command(args, batch, batches, disp_batches):
    """train_imagenet.py --benchmark 1 (synthetic data) for ``batches`` batches, a Speedometer line
    every ``disp_batches``; run from its folder."""
    return [
        sys.executable,
        "train_imagenet.py",
        "--benchmark",
        "1",
        *args,
        "--batch-size",
        str(batch),
        "--image-shape",
        "3,224,224",
        "--num-epochs",
        "1",
        "--num-examples",
        str(batches * batch),
        "--disp-batches",
        str(disp_batches),
        "--kv-store",
        "local",
    ]


def mxnet_script_environment(references, folder):
    """What mxnet 1.9.1 needs to run here, as ../shared/references says: the numpy alias shim (copied
    into ``folder`` as sitecustomize) and OMP_NUM_THREADS = cores (it uses half when unset)."""
    shutil.copy(references / "numpy_alias_shim_sitecustomize.py", Path(folder) / "sitecustomize.py")
    return {"PYTHONPATH": str(folder), "OMP_NUM_THREADS": str(os.cpu_count())}


def speedometer_figure(returncode, log, batch, warmup, timed):
    rates = [float(r) for r in SPEEDOMETER.findall(log)]
    windows = rates[1:]  # the first window is the warm-up
    if returncode or len(windows) != timed // warmup:
        raise SystemExit(
            f"train_imagenet.py logged {len(rates)} Speedometer windows, expected {timed // warmup + 1}:\n{log[-2000:]}"
        )
    images_per_window = warmup * batch
    return images_per_window * len(windows), sum(images_per_window / rate for rate in windows)


def run_garden(python, args, batch, warmup, timed, env=None):
    """Model Garden's own training loop; returns (images, seconds) of the steps after the warm-up."""
    with tempfile.TemporaryDirectory() as model_dir:
        out = subprocess.run(
            garden_command(python, args, batch, warmup + timed, warmup, model_dir),
            capture_output=True,
            text=True,
            cwd=model_dir,
            env={**os.environ, **(env or {})},
        )
    if out.returncode:
        raise SystemExit(f"Model Garden failed:\n{out.stderr[-2000:]}")
    intervals = [(float(s), int(a), int(b)) for s, a, b in TIME_HISTORY.findall(out.stderr)]
    timed_intervals = [(s, b - a) for s, a, b in intervals if a >= warmup]
    if sum(steps for _, steps in timed_intervals) != timed:
        raise SystemExit(f"Model Garden logged {intervals}, expected {timed} steps after {warmup}")
    return timed * batch, sum(seconds for seconds, _ in timed_intervals)


def garden_command(python, args, batch, train_steps, log_steps, model_dir):
    """Model Garden's ResNet-50 training loop on synthetic data, a TimeHistory line every
    ``log_steps``; run in ``model_dir``."""
    return [
        python,
        "-m",
        GARDEN_MAIN,
        "--use_synthetic_data",
        "--skip_eval",
        "--distribution_strategy=off",
        "--num_gpus=0",
        "--noenable_checkpoint_and_export",
        f"--model_dir={model_dir}",
        f"--batch_size={batch}",
        f"--train_steps={train_steps}",
        f"--log_steps={log_steps}",
        *args,
    ]


def shipped_side(kind, reference, batch, options, seen, warmup, loop=1):
    """A shipped reference in lockstep (``lockstep.ShippedSide``): as it ships (or with the
    plugin's malloc and oneDNN choice, as asked), started for more steps than any run asks for,
    printing a line a step (a line a loop of ``loop`` steps, where it runs loops), in a scratch
    folder of its own. Its warm-up is ``warmup`` steps, the ones it runs before its first step
    line counted in (``UNPRINTED_STEPS``); at least one line, which is where it can be stopped."""
    scratch = tempfile.TemporaryDirectory()
    env = shipped_environment(options, seen)
    cwd = scratch.name
    if kind == "tf_cnn":
        command = [sys.executable, *tf_cnn_command(options.references, reference, batch, 0, LOCKSTEP_STEPS), "--display_every=1"]
        env["TF_USE_LEGACY_KERAS"] = "1"
    elif kind == "mxnet_script":
        command = mxnet_script_command(reference, batch, LOCKSTEP_STEPS, disp_batches=1)
        env.update(mxnet_script_environment(options.references, scratch.name))
        cwd = options.references / "mxnet_image_classification"
    else:
        command = garden_command(options.garden_python, reference, batch, LOCKSTEP_STEPS, 1, scratch.name)
    lines = max(1, -(-(warmup - UNPRINTED_STEPS[kind]) // loop))
    return lockstep.ShippedSide(command, STEP_LINES[kind], batch, lines, cwd=cwd, env=env, scratch=scratch, steps_per_line=loop)


def lockstep_reference(kind, reference, batch, options, warmup, loop=1):
    """How a case's reference side starts in lockstep: ``reference_side(seen)`` for ``lockstep.sides``."""
    if kind == "bare":
        return lambda seen: lockstep.BareSide(reference, batch, warmup, seen["python"], bare_environment(seen))
    return lambda seen: shipped_side(kind, reference, batch, options, seen, warmup, loop)


def whole_loops(name, *steps):
    """Steps rounded up to whole loops of a case whose both sides run or log whole loops only."""
    loop = LOOP_STEPS.get(name, 1)
    return [-(-n // loop) * loop for n in steps]


def on_device(name, device):
    """A case's accelbench arguments, reference kind and reference arguments, on ``device``."""
    args, kind, reference = CASES[name]
    if device == "cpu":
        return args, kind, reference
    return [*args, "--device", device], kind, [*reference, "--device", device]


def takes_device(name):
    """Whether a case can run on an accelerator: its reference is a bare loop that takes ``--device``."""
    _, kind, reference = CASES[name]
    return kind == "bare" and reference[0] in DEVICE_LOOPS


def measure(name, batch, options):
    args, kind, reference = on_device(name, options.device)
    if options.lockstep is not None:
        return measure_lockstep(name, batch, options)
    warmup, timed = whole_loops(name, options.warmup, options.timed)
    seen = {}
    shipped_env = lambda: shipped_environment(options, seen)  # noqa: E731
    runners = {
        "tf_cnn": lambda: run_tf_cnn(options.references, reference, batch, warmup, timed, shipped_env()),
        "mxnet_script": lambda: run_mxnet_script(options.references, reference, batch, warmup, timed, shipped_env()),
        "garden": lambda: run_garden(options.garden_python, reference, batch, warmup, timed, shipped_env()),
        # a bare loop is ours, not a shipped program: the plugin's interpreter, malloc (huge
        # pages too) and oneDNN ceiling
        "bare": lambda: run_bare(
            reference, batch, warmup, timed, python=seen["python"], keep=options.keep_records, env=bare_environment(seen)
        ),
    }
    started = time.strftime("%H:%M", time.gmtime())
    looks = Looks(options.rounds, options.max_rounds)
    rate, per_round = alternate(
        f"{name} batch {batch}",
        {
            "accelbench": lambda: run_accelbench(args, batch, warmup, timed, seen, keep=options.keep_records),
            "reference": runners[kind],
        },
        options.rounds,
        burn_in=options.burn_in,
        go_on=lambda rounds: looks.go_on(f"{name} batch {batch}", rounds),
    )
    return summary(name, batch, seen, rate, per_round, looks, started, steps=f"{warmup} + {timed}", what=WHAT[kind])


def measure_lockstep(name, batch, options):
    """A case in lockstep (``lockstep.py``): both warm processes alive, taking turns in blocks of
    ``--lockstep`` steps (a shipped reference stopped and continued by job control); a round is
    one block of each. With ``--pairs`` over one, each pair of processes runs ``--rounds`` rounds
    and is one unit of the interval (``lockstep.in_pairs``)."""
    args, kind, reference = on_device(name, options.device)
    warmup, steps = whole_loops(name, options.warmup, options.lockstep)
    seen, label = {}, f"{name} batch {batch}"
    started = time.strftime("%H:%M", time.gmtime())
    reference_side = lockstep_reference(kind, reference, batch, options, warmup, LOOP_STEPS.get(name, 1))

    def open_pair(reference_first=False):
        return lockstep.sides(args, reference_side, batch, warmup, seen, options.keep_records, reference_first=reference_first)

    if options.pairs > 1:
        looks = Looks(options.pairs, options.max_pairs, unit="pair")
        rate, units = lockstep.in_pairs(
            label, open_pair, steps, options.rounds, options.pairs, go_on=lambda units: looks.go_on(label, units)
        )
        block = f"{warmup} + {steps} a block, {options.rounds} rounds a pair"
    else:
        looks = Looks(options.rounds, options.max_rounds)
        with open_pair() as (plugin, theirs):
            rate, units = alternate(
                label,
                {"accelbench": lambda: plugin.block(steps), "reference": lambda: theirs.block(steps)},
                options.rounds,
                go_on=lambda rounds: looks.go_on(label, rounds),
            )
        block = f"{warmup} + {steps} a block"
    return summary(name, batch, seen, rate, units, looks, started, steps=block, what=f"{WHAT[kind]} in lockstep")


def summary(name, batch, seen, rate, per_round, looks, started, steps, what):
    """One case's result: both sides' pooled images/sec, the paired ratio and its interval, the
    verdict (at the confidence of ``looks``), GFLOP/s and shares of the peak."""
    ours, theirs = rate["accelbench"], rate["reference"]
    estimate = paired(per_round, "accelbench", "reference")
    decisive = paired(per_round, "accelbench", "reference", looks.confidence)
    gflops = ours * seen["flops_per_image"] / 1e9
    peak = seen.get("peak_per_sec")
    return {
        "case": name,
        "batch": batch,
        "accelbench": ours,
        "reference": theirs,
        "ratio": estimate.ratio,
        "pooled_ratio": ours / theirs,
        "ci95": estimate.ci95,
        "round_ratios": [r["accelbench"] / r["reference"] for r in per_round],
        "unit": looks.unit,
        "gflops_per_s": gflops,
        "verdict": bar_verdict(decisive.ci95),
        "verdict_ci": decisive.ci95,
        "verdict_confidence": looks.confidence,
        "reference_gflops_per_s": theirs * seen["flops_per_image"] / 1e9,
        "utilisation": gflops * 1e9 / peak if peak else None,
        "reference_utilisation": theirs * seen["flops_per_image"] / peak if peak else None,
        "what": what,
        "allocator": malloc_of(seen),
        "huge_pages": huge_pages_of(seen),
        "steps": steps,
        "label": seen["label"],
        "measured_utc": f"{started}-{time.strftime('%H:%M', time.gmtime())}",
    }


class Looks:
    """The stop rule of ``--max-rounds``, core's (``accelbench run --until-*``): after the first
    ``rounds`` rounds, and after each round added, the paired interval is read against the bar
    (``bar_verdict``), and rounds are added while it is undecided, up to ``max_rounds``. Reading
    an interval after every round would decide wrongly more often than 5%, so look k's interval is
    at the confidence core spends on it (``accelbench.analysis.stats.sequential_confidence``: the 5% split as
    0.05 / (k (k + 1)) over any number of looks). A fixed number of rounds is one plain 95% look."""

    def __init__(self, rounds, max_rounds, unit="round"):
        self.rounds, self.max_rounds, self.unit = rounds, max_rounds or rounds, unit
        self.looks = 0

    @property
    def confidence(self):
        """The confidence of the last look's interval (95% where no look was sequential)."""
        from accelbench.analysis.stats import sequential_confidence

        return sequential_confidence(self.looks) if self.looks else 0.95

    def go_on(self, name, per_round):
        """Whether another round is owed: the verdict is still undecided and rounds remain."""
        if self.max_rounds <= self.rounds:
            return False
        self.looks += 1
        estimate = paired(per_round, "accelbench", "reference", self.confidence)
        verdict = bar_verdict(estimate.ci95)
        low, high = estimate.ci95
        print(
            f"  {name} look {self.looks} after {len(per_round)} {self.unit}s: {self.confidence:.2%} CI "
            f"{low:.3f}-{high:.3f}, {verdict}",
            flush=True,
        )
        return verdict == "undecided" and len(per_round) < self.max_rounds


def measured_or_failed(name, batch, options):
    """One case's result, or the reason it failed: a reference or a run that fails loses no
    other case's measurement."""
    try:
        return measure(name, batch, options)
    except subprocess.CalledProcessError as exc:
        return {"case": name, "batch": batch, "failed": f"{exc}: {(exc.stderr or '').strip()[-300:]}"}
    except SystemExit as exc:
        return {"case": name, "batch": batch, "failed": str(exc.code)[-300:]}


def table_header(unit="round"):
    return (
        f"{'case':<18}{'batch':>6}{'accelbench':>11}{'reference':>10}{'ratio':>7}  {'95% CI':<13} "
        f"{'pooled':>7}  {'per ' + unit:<28}{'GFLOP/s':>8}{'of peak':>8}{'ref peak':>9}   verdict; reference"
    )


def units_of(results):
    """What the per-unit column holds: rounds, pairs of processes (--pairs), or both in one table
    (the shipped references keep their rounds beside the lockstep cases' pairs)."""
    units = sorted({r["unit"] for r in results if "unit" in r})
    return units[0] if len(units) == 1 else " or ".join(units) or "round"


def verdict_text(r):
    """The verdict against the bar, with the interval it rests on where that is not the 95% one
    (a look of ``--max-rounds``), and for an undecided one about how many more rounds would
    likely decide it."""
    notes = []
    if r["verdict_confidence"] != 0.95:
        low, high = r["verdict_ci"]
        notes.append(f"{r['verdict_confidence']:.2%} CI {low:.3f}–{high:.3f}")
    more = more_rounds(r["ratio"], r["verdict_ci"], len(r["round_ratios"]))
    if r["verdict"] == "undecided" and more:
        notes.append(f"~{more} more {r['unit']}{'s' if more > 1 else ''}")
    return f"{r['verdict']} ({'; '.join(notes)})" if notes else r["verdict"]


def table_row(r):
    if "failed" in r:
        return f"{r['case']:<18}{r['batch']:>6}  failed: {' '.join(r['failed'].split())}"
    rounds = " ".join(f"{x:.3f}" for x in r["round_ratios"])
    util = lambda v: f"{v:.0%}" if v is not None else "-"  # noqa: E731
    interval = f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}" if r["ci95"][0] < r["ci95"][1] else "-"
    return (
        f"{r['case']:<18}{r['batch']:>6}{r['accelbench']:>11.2f}{r['reference']:>10.2f}{r['ratio']:>7.3f}  "
        f"{interval:<13} {r['pooled_ratio']:>7.3f}  {rounds:<28}{r['gflops_per_s']:>8.1f}"
        f"{util(r['utilisation']):>8}{util(r['reference_utilisation']):>9}   {verdict_text(r)}; {r['what']}"
        f" (plugin's malloc: {r['allocator']}, huge pages {r['huge_pages']};"
        f" steps {r['steps']})"
    )


def markdown_header(unit="round"):
    return (
        "| plugin | batch | steps | accelbench img/s | reference img/s | ratio | 95% CI | verdict | pooled "
        f"| per {unit} | GFLOP/s | of peak (ours / ref) | reference | measured (UTC) |\n" + "|---" * 14 + "|"
    )


def markdown_row(r):
    """One result as a row of the README's tables: the ratio in bold where its interval excludes 1."""
    if "failed" in r:
        return f"| {r['case']} | {r['batch']} | failed: {' '.join(r['failed'].split())} |"
    low, high = r["ci95"]
    decided = low < high and (low > 1 or high < 1)
    util = lambda v: f"{v:.0%}" if v is not None else "-"  # noqa: E731
    cells = [
        f"{r['label']} ({r['allocator']})",
        r["batch"],
        r["steps"],
        f"{r['accelbench']:.2f}",
        f"{r['reference']:.2f}",
        f"**{r['ratio']:.3f}**" if decided else f"{r['ratio']:.3f}",
        f"{low:.3f}–{high:.3f}" if low < high else "–",
        verdict_text(r),
        f"{r['pooled_ratio']:.3f}",
        rounds_text(r["round_ratios"], r["unit"]),
        f"{r['gflops_per_s']:.1f}",
        f"{util(r['utilisation'])} / {util(r['reference_utilisation'])}",
        f"{r['what']} `{' '.join(CASES[r['case']][2])}`",
        r["measured_utc"],
    ]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def rounds_text(ratios, unit="round"):
    """Each unit's ratio (a round's, or a pair's of processes); over a dozen (lockstep's rounds),
    how many, their range and median."""
    if len(ratios) <= MARKDOWN_ROUNDS:
        return " ".join(f"{x:.3f}" for x in ratios)
    return f"{len(ratios)} {unit}s: {min(ratios):.3f}–{max(ratios):.3f}, median {statistics.median(ratios):.3f}"


#: rounds a markdown row lists one by one
MARKDOWN_ROUNDS = 12


def bare_environment(seen):
    """A bare loop's environment: the malloc (huge pages too) and oneDNN ceiling the plugin's worker had."""
    return {**plugin_malloc(seen), **onednn_ceiling_of(seen)}


def shipped_environment(options, seen):
    """A shipped reference's environment as --shipped-malloc and --shipped-onednn ask (in rounds
    and in lockstep alike)."""
    return {**shipped_malloc(options.shipped_malloc, seen), **shipped_onednn(options.shipped_onednn, seen)}


def shipped_malloc(choice, seen):
    """The environment a shipped reference runs with: as it ships (the C library's malloc), or
    with the malloc the plugin's worker had preloaded (and its huge pages, where it had them on),
    which separates the framework's lead from the allocator's."""
    return plugin_malloc(seen) if choice == "plugin" else {}


def plugin_malloc(seen):
    """The variables that give a process the malloc the plugin's worker had, and its huge pages."""
    from accelbench.execution import allocators

    return allocators.worker_environment(malloc_of(seen), huge_pages_of(seen))


def shipped_onednn(choice, seen):
    """TensorFlow's oneDNN switch for a shipped reference: as it ships (TensorFlow decides from the
    CPU), or as the plugin's worker had it (its record's ``settings.onednn``: "on (...)"), which
    separates TensorFlow's lead from its oneDNN's on a CPU where TF 2.21 leaves oneDNN off."""
    used = seen["settings"].get("onednn", "").partition(" ")[0]
    return {"TF_ENABLE_ONEDNN_OPTS": "1" if used == "on" else "0"} if choice == "plugin" and used else {}


def huge_pages_of(seen):
    """on or off, as the plugin's record says its worker ran (``settings.huge_pages``: "on (...)")."""
    return seen["settings"].get("huge_pages", "off").partition(" ")[0]


def malloc_of(seen):
    """The malloc the plugin's worker had mapped (its record's ``settings.allocator``: "NAME (PATH)")."""
    name, _, path = seen["settings"]["allocator"].partition(" (")
    return path.rstrip(")") if name == "preloaded" else name


def onednn_ceiling_of(seen):
    """The oneDNN ISA ceiling the plugin's worker ran under, where the plugin set one (mxnet_ngc
    allows AMX on a CPU that has it: its record's ``settings.onednn_max_cpu_isa``)."""
    ceiling = seen["settings"].get("onednn_max_cpu_isa")
    return {"DNNL_MAX_CPU_ISA": ceiling} if ceiling else {}


def lockstep_text(options):
    if not options.lockstep:
        return "in rounds"
    pairs = f", {options.pairs} pairs of processes a case (the units)" if options.pairs > 1 else ""
    return f"in lockstep, {options.lockstep} steps a block{pairs}"


def pairs_misuse(options):
    """What is wrong with --pairs/--max-pairs as given, or None."""
    if options.pairs < 1:
        return "--pairs must be at least 1"
    if options.pairs > 1 and options.lockstep is None:
        return "--pairs takes --lockstep (rounds of whole runs open fresh processes every round already)"
    if options.pairs > 1 and options.max_rounds is not None:
        return "--max-rounds with --pairs: pairs are the units; add pairs with --max-pairs"
    if options.max_pairs is not None and (options.pairs < 2 or options.max_pairs < options.pairs):
        return "--max-pairs takes --pairs of 2 or more and must be at least --pairs"
    return None


def machine_header():
    from accelbench.environments import machine as environment

    env = environment.collect()
    accelerators = "".join(
        f"; {a.kind.upper()}: {a.name}" + (f", driver {a.driver}" if a.driver else "") for a in env.accelerators
    )
    return (
        f"machine: {env.cpu_model}, {env.cpu_cores} cores, {env.memory_bytes / 2**30:.0f} GiB"
        f"{accelerators}; flags: {' '.join(env.cpu_flags or ())}"
        f"{MEMORY_RETURNED_NOTE if env.memory_returned_to_host else ''}"
    )


#: why a run on such a VM can take one slow step full of page faults (README, "Reference benchmark")
MEMORY_RETURNED_NOTE = (
    "; free memory goes back to the host (virtio balloon page reporting): a page touched first after that costs a host fault too"
)


class Terminated(BaseException):
    """SIGTERM: no case's failure (``measured_or_failed`` goes on after those) but the end of the
    run, unwinding through every side's close, so nothing it started is left stopped."""


def terminated(signum, frame):
    raise Terminated(f"terminated by signal {signum}")


def main():
    signal.signal(signal.SIGTERM, terminated)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--case",
        action="append",
        choices=sorted(CASES),
        help="default: every case whose reference is here (the Model Garden cases need --garden-python)",
    )
    parser.add_argument(
        "--garden-python", default=".venv-garden/bin/python", help="the Python of the environment with tf-models-official"
    )
    parser.add_argument("--batch-sizes", default="8,32", help="global batches to sweep (default 8,32)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--timed", type=int, default=40, help="a multiple of --warmup where a shipped reference runs (it logs per warm-up)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds per case and batch (>= 3 for an interval)")
    parser.add_argument(
        "--max-rounds",
        type=int,
        help="add rounds after --rounds, one at a time, while the "
        "verdict against the bar is undecided, up to this many (each look's interval spends "
        "its share of the 5%% error); default: --rounds, one look",
    )
    parser.add_argument(
        "--lockstep",
        type=int,
        metavar="STEPS",
        help="run the cases in lockstep: the plugin's "
        "worker and the reference both alive and warm, taking turns in blocks of STEPS steps (a "
        "round is one block of each; a shipped reference stopped and continued by job control), "
        "so a machine whose speed drifts moves both alike; tpu-bf16's blocks and warm-up are "
        "whole loops of 10",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="with --lockstep: open this many pairs of processes "
        "a case, one after the other, each for --rounds rounds; a pair, not a round, is then the "
        "unit of the interval (rounds of one pair share its processes' memory and thread "
        "placement and their JIT's choices); default 1: the rounds are the units",
    )
    parser.add_argument(
        "--max-pairs",
        type=int,
        help="with --pairs: add pairs, one at a time, while the verdict "
        "is undecided, up to this many (as --max-rounds does rounds)",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        default="cpu",
        help="where both sides train: the CPU (default) or the GPU (the cases whose bare loop takes a device: torch-*, jax-*)",
    )
    parser.add_argument(
        "--burn-in",
        action="store_true",
        help="open each case with one uncounted run of the "
        "side that goes first (a VM's first run after another program can be slow)",
    )
    parser.add_argument("--references", type=Path, default=REFERENCES, help=f"default {REFERENCES}")
    parser.add_argument(
        "--shipped-malloc",
        choices=["as-shipped", "plugin"],
        default="as-shipped",
        help="malloc of tf_cnn_benchmarks, train_imagenet.py and Model Garden: the C library's "
        "(as they ship; default) or the one the plugin's worker had (bare loops always get that)",
    )
    parser.add_argument(
        "--shipped-onednn",
        choices=["as-shipped", "plugin"],
        default="as-shipped",
        help="TensorFlow's oneDNN ops in tf_cnn_benchmarks and Model Garden: TensorFlow's own "
        "choice on this CPU (as they ship; default) or the plugin's worker's",
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="also print the results as rows of the "
        "README's tables (plugin, steps, ratio in bold where its interval excludes 1, UTC times)",
    )
    parser.add_argument(
        "--keep-records",
        type=Path,
        help="a folder to keep every accelbench run's results "
        "file and every bare loop's figures in (to see what made a slow round slow)",
    )
    options = parser.parse_args()
    if options.lockstep is not None and options.lockstep < 1:
        parser.error("--lockstep must be at least 1 step a block")
    if options.max_rounds is not None and options.max_rounds < options.rounds:
        parser.error("--max-rounds must be at least --rounds")
    pairs_error = pairs_misuse(options)
    if pairs_error:
        parser.error(pairs_error)
    batches = [int(b) for b in options.batch_sizes.split(",")]
    # absolute, not resolved: Model Garden runs in a scratch folder, and a venv's python is a symlink
    options.garden_python = os.path.abspath(options.garden_python)
    garden = Path(options.garden_python).exists()
    if options.case and not garden and any(CASES[c][1] == "garden" for c in options.case):
        parser.error(f"no Model Garden environment at {options.garden_python} (see this script's docstring)")
    cases = options.case or [
        c for c in CASES if (CASES[c][1] != "garden" or garden) and (options.device == "cpu" or takes_device(c))
    ]
    if options.device != "cpu" and not all(takes_device(c) for c in cases):
        parser.error(
            f"--device {options.device}: only the cases whose reference is a bare loop that takes a device "
            f"run there ({', '.join(c for c in CASES if takes_device(c))})"
        )
    if options.lockstep is None and options.timed % options.warmup and any(CASES[c][1] != "bare" for c in cases):
        parser.error("--timed must be a multiple of --warmup (the shipped references log per warm-up)")
    print(machine_header(), flush=True)
    results = []
    for name in cases:
        for batch in batches:
            results.append(measured_or_failed(name, batch, options))
            print(table_row(results[-1]), flush=True)  # kept in the log if a later case is stopped
    print(f"\n{machine_header()}")
    print(
        f"shipped references' malloc: {options.shipped_malloc}; TensorFlow's oneDNN: {options.shipped_onednn}; "
        "bare loops: the plugin's; "
        f"burn-in: {'one uncounted run per case' if options.burn_in else 'none'}; "
        f"cases {lockstep_text(options)}; "
        f"verdict against the bar: ahead (interval above 1), not behind (above {MIN_RATIO}), "
        f"behind (below {MIN_RATIO}), undecided"
    )
    unit = units_of(results)
    print(table_header(unit))
    for r in results:
        print(table_row(r))
    if options.markdown:
        print(f"\n{markdown_header(unit)}")
        for r in results:
            print(markdown_row(r))
    failed = [r["case"] for r in results if "failed" in r]
    if failed:
        print(f"failed: {', '.join(failed)}")
    exit_if_below([r for r in results if "failed" not in r], f"below the reference by more than {1 - MIN_RATIO:.0%}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
