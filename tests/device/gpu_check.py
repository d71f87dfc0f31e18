"""The prepared accelerator check: install the CUDA builds, run every built-in plugin's GPU path
for a short time box, measure the GPU's matrix-product peak, put the plugins that have a bare loop
beside it in lockstep, and bring back the records and a summary. One call on a fresh GPU machine:

    python3 tests/device/gpu_check.py --out "$OUT"                  # the lent GPU (about 8 minutes)
    python3 tests/device/gpu_check.py --out "$OUT" --wheels .whl    # a GPU machine with no registry
    python3 tests/device/gpu_check.py --out /tmp/check --dry-run --plugins sleepy --device cpu

Steps (``--steps``, in the order given), each within its share of ``--budget`` seconds (a step
that would not fit is skipped and says so; the summary always gets its reserve):

1. header: the GPU's name, driver and CUDA version (nvidia-smi), per precision the published
   peak the records measure utilisation against, and the tuned stack's published ResNet-50
   images/sec per GPU that the runs are held against (``accelbench.analysis.peaks``, each with its source);
2. install: one virtual environment ``.venv-gpu`` (kept while the machine stays warm, so a second
   call skips it) with accelbench and the CUDA builds: ``tensorflow[and-cuda]`` 2.21 and tf-keras,
   and MXNet 1.9.1's newest CUDA build (``mxnet-cu117``, which predates this GPU generation: its
   record says whether it runs). TensorFlow and MXNet 1.9.1 meet on numpy 1.26, so one
   environment serves both. On a machine that reaches no package registry but has PyTorch and
   JAX installed (this workplace's lent GPUs), ``--wheels DIR`` instead installs accelbench and the
   wheels carried in DIR (its dependencies the machine lacks) into this interpreter's environment;
   the plugins whose framework is not there then say so in their records. ``--dry-run`` skips it
   and uses this interpreter;
3. ``runs``: each (plugin, precision) as ``accelbench run --device gpu --time T`` at the backend's
   default batch for the device (the study's), one line per run;
4. ``peak``: ``accelbench peak`` on the device (a large matrix product per framework and
   precision), beside the published peak the records use;
5. ``reference``: ``tests/benchmarks/bench_reference.py --device gpu --lockstep`` for each case
   whose bare loop runs on a GPU (torch_ref and jax_flax, fp32 and bf16), one invocation per case
   so a case that does not fit loses no other's rows; both sides on the one GPU, JAX told not to
   take most of its memory up front (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, both sides alike);
6. ``levers``: each (plugin, precision, lever) of ``LEVERS`` (or ``--levers``) as one
   ``accelbench run --lever ... --schedule lockstep``: the plugin as it ships and the plugin with
   the lever, warm workers taking turns on the one GPU, ``--lever-pairs`` pairs of processes; its
   line is the lever's speed over the plugin's as shipped with the interval over the pairs
   (``accelbench compare``) and whether the lever wins, loses or is undecided. A lever changes
   how the step runs, never the work (#57);
7. ``profile``: ``tests/device/torch_profile.py``: torch_ref's step at bf16 and at fp16 under
   ``torch.profiler``, its GPU time by kernel category (``torch-profile.json``): where bf16 loses
   to fp16;
8. summary: each plugin's best run as a share of the anchor against the 85% bar (``standing``
   lines), ``summary.json`` and ``summary.md`` (the README's "Measured on a GPU" rows, the
   reference rows and the lever table) from the records, every record validated against the
   schema by accelbench.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-gpu"
#: (plugin, precision): fp32 and each plugin's mixed precision
RUNS = (
    ("torch_ref", "fp32"),
    ("torch_ref", "bf16"),
    ("torch_ref", "fp16"),
    ("jax_flax", "fp32"),
    ("jax_flax", "bf16"),
    ("tf_benchmarks", "fp32"),
    ("tf_benchmarks", "fp16"),
    ("tpu_official", "bf16"),
    ("tpu_official", "fp32"),
    ("mxnet_ngc", "fp32"),
    ("mxnet_ngc", "fp16"),
)
#: bench_reference's cases whose bare loop runs on a GPU, and their plugins
REFERENCE_CASES = {"torch-bf16": "torch_ref", "torch-fp32": "torch_ref", "jax-bf16": "jax_flax", "jax-fp32": "jax_flax"}
STEPS = ("runs", "peak", "reference", "levers", "profile")
#: the profile step: two precisions' builds, warm-ups and profiled steps at the study's batch
PROFILE_S = 150.0
#: the levers step's table: (plugin, precision, lever as ``accelbench run --lever`` takes it), the
#: levers #57 names for each plugin's mixed precision, most promising first (the budget may not
#: reach the last): the whole step as a CUDA graph, torch.compile's CUDA graphs, PyTorch's fused
#: SGD update on the GPU (its for-each one by default), the contiguous format against channels-last;
#: JAX's learning rate already on the device, XLA's latency-hiding scheduler
LEVERS = (
    ("torch_ref", "bf16", "cuda_graph=true"),
    ("jax_flax", "bf16", "learning_rate_on_device=true"),
    ("torch_ref", "bf16", "fused_sgd=true"),
    ("torch_ref", "fp16", "fused_sgd=true"),
    ("torch_ref", "bf16", "compile_mode=reduce-overhead"),
    ("jax_flax", "bf16", "xla_flags=--xla_gpu_enable_latency_hiding_scheduler=true"),
    ("torch_ref", "bf16", "memory_format=contiguous"),
)
#: a lever pair's two start-ups and warm-ups on the device, per plugin (the reference step's pairs on
#: the H200: JAX ~135 s, PyTorch ~55 s); torch.compile compiles the model in each process on top
LEVER_OVERHEAD_S = {"torch_ref": 60.0, "jax_flax": 140.0}
DEFAULT_LEVER_OVERHEAD_S = 60.0
COMPILE_OVERHEAD_S = 180.0
#: a lockstep pair's two start-ups (imports, cuDNN autotuning, XLA compiles) and warm-up steps:
#: on the H200 a JAX pair took ~135 s beside its rounds, a PyTorch one ~55 s
REFERENCE_OVERHEAD_S = 140.0
#: a lockstep round's two blocks at the study's batch, generously (~1.5 s on the H200)
REFERENCE_ROUND_S = 6.0
INSTALLS = (
    ("accelbench + TensorFlow CUDA", ["-e", str(ROOT), "tensorflow[and-cuda]==2.21.*", "tf-keras==2.21.*", "numpy>=1.26,<1.27"]),
    ("MXNet 1.9.1 CUDA", ["mxnet-cu117==1.9.1", "numpy>=1.26,<1.27"]),
)
#: #57's bar: each plugin's best mixed precision at this share of the tuned stack's per-GPU
#: ResNet-50 throughput (``accelbench.analysis.peaks.training_anchor``) or more
ANCHOR_BAR = 0.85
#: seconds the summary step always keeps, and the least a run is started with
SUMMARY_RESERVE_S = 20.0
MIN_RUN_S = 45.0
#: a run's worker start, framework import, model build and warm-up, on top of its time box
RUN_OVERHEAD_S = 75.0


class Budget:
    """The check's time: every step asks for its share of what is left."""

    def __init__(self, total_s: float, clock=time.monotonic):
        self.clock, self.deadline = clock, clock() + total_s

    def left(self) -> float:
        return self.deadline - self.clock() - SUMMARY_RESERVE_S

    def grant(self, wanted_s: float, least_s: float = 1.0) -> float | None:
        """Seconds for a step that wants ``wanted_s``: all of it, or what is left; None below ``least_s``."""
        granted = min(wanted_s, self.left())
        return granted if granted >= least_s else None


@dataclass
class RunLine:
    plugin: str
    precision: str
    status: str
    reason: str = ""
    batch: int | None = None
    images_per_sec: float | None = None
    utilisation: float | None = None
    peak_source: str = ""
    device: str = ""
    elapsed_s: float = 0.0
    record_file: str = ""
    #: the record's device peak and joules per image, or why it has none (#56)
    device_memory: str = ""
    energy: str = ""
    #: images/sec as a share of the per-GPU anchor of the GPU found (None: no anchor, or not ok)
    anchor_share: float | None = None

    def text(self) -> str:
        head = f"{self.plugin} {self.precision}" + (f" b{self.batch}" if self.batch else "")
        if self.status != "ok":
            return f"{head}: {self.status} {self.reason}".strip() + f" ({self.elapsed_s:.0f} s)"
        use = f", utilisation {self.utilisation:.1%}" if self.utilisation is not None else ", no published peak"
        return (
            f"{head}: ok {self.images_per_sec:.1f} img/s{use} on {self.device} ({self.elapsed_s:.0f} s); "
            f"device memory {self.device_memory}; energy {self.energy}"
            + (f"; {self.anchor_share:.1%} of the per-GPU anchor" if self.anchor_share is not None else "")
        )


@dataclass
class LeverLine:
    plugin: str
    precision: str
    lever: str
    status: str
    reason: str = ""
    #: images/sec with the lever over the plugin as it ships, pooled over the pairs, and the
    #: interval over the pairs (None: under two pairs, or no comparison)
    ratio: float | None = None
    ci95: tuple[float, float] | None = None
    pairs: int = 0
    #: "wins" (the interval above 1), "loses" (below), "undecided", or "one pair" (no interval)
    verdict: str = ""
    elapsed_s: float = 0.0
    record_file: str = ""

    def text(self) -> str:
        head = f"lever {self.plugin} {self.precision} {self.lever}"
        if self.status != "ok":
            return f"{head}: {self.status} {self.reason}".strip() + f" ({self.elapsed_s:.0f} s)"
        interval = f" ({self.ci95[0]:.3f}-{self.ci95[1]:.3f})" if self.ci95 else ""
        return f"{head}: x{self.ratio:.3f}{interval} over {self.pairs} pair(s): {self.verdict} ({self.elapsed_s:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    (out / "records").mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    header = gpu_header()
    print(header["line"], flush=True)
    python = sys.executable if args.dry_run else install_offline(args.wheels) if args.wheels else install(budget, out)
    print_peaks(python, header)
    anchor = training_anchor(python, header)
    lines, reference_rows, levers = [], [], []
    for step in args.steps:
        if step == "runs":
            lines += [run_one(python, plugin, precision, args, budget, out, anchor) for plugin, precision in selected_runs(args)]
        elif step == "peak":
            measure_peak(python, args, budget, out)
        elif step == "reference":
            reference_rows += [row for case in selected_cases(args) for row in reference_case(python, case, args, budget, out)]
        elif step == "levers":
            levers += [measure_lever(python, lever, args, budget, out) for lever in selected_levers(args)]
        else:
            profile_precisions(python, args, budget, out)
    for standing in standings(lines, anchor):
        print(standing, flush=True)
    summary = summarize(python, out, header, lines, reference_rows, anchor, levers)
    print(f"summary: {summary}", flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for records and summary (default $OUT)")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check (default 480)")
    parser.add_argument("--time", type=float, default=20.0, help="time box of each run's timed phase (default 20 s)")
    parser.add_argument("--plugins", help="comma-separated plugins to run (default: every built-in one)")
    parser.add_argument("--device", default="gpu", help="device kind to run on (default gpu)")
    parser.add_argument("--dry-run", action="store_true", help="skip the installs; run with this interpreter")
    parser.add_argument(
        "--wheels",
        help="a folder of carried wheels: install them and accelbench into this "
        "interpreter's environment, no registry (instead of the .venv-gpu with the CUDA builds)",
    )
    parser.add_argument("--steps", default="runs", help=f"comma-separated, in order, of {', '.join(STEPS)} (default runs)")
    parser.add_argument("--batch", type=int, default=256, help="the reference step's batch (default 256)")
    parser.add_argument("--rounds", type=int, default=20, help="the reference step's rounds a case (default 20)")
    parser.add_argument("--block", type=int, default=10, help="the reference step's steps a block (default 10)")
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="the reference step's pairs of processes a case, each "
        "for --rounds rounds, the pair the unit of the interval (bench_reference --pairs; a pair "
        "pays both start-ups: cuDNN's autotuner and XLA choose once per process); default 1",
    )
    parser.add_argument(
        "--levers",
        help="the levers step's cases, semicolon-separated PLUGIN:PRECISION:KEY=VALUE[,KEY=VALUE] "
        "(default: the built-in table's for the selected plugins)",
    )
    parser.add_argument("--lever-pairs", type=int, default=2, help="the levers step's pairs of processes a lever (default 2)")
    parser.add_argument("--lever-blocks", type=int, default=6, help="the levers step's rounds of blocks a pair (default 6)")
    parser.add_argument("--lever-block-time", type=float, default=2.0, help="the levers step's seconds a block (default 2)")
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("--out is required (or set $OUT)")
    if args.budget <= SUMMARY_RESERVE_S or args.time <= 0:
        parser.error(f"--budget must exceed {SUMMARY_RESERVE_S:g} s and --time must be positive")
    args.steps = args.steps.split(",")
    unknown = [step for step in args.steps if step not in STEPS]
    if unknown:
        parser.error(f"--steps: no step {', '.join(unknown)} (there are {', '.join(STEPS)})")
    if min(args.batch, args.rounds, args.block, args.pairs, args.lever_pairs, args.lever_blocks) < 1:
        parser.error("--batch, --rounds, --block, --lever-pairs, --lever-blocks and --pairs must be at least 1")
    if args.lever_block_time <= 0:
        parser.error("--lever-block-time must be positive")
    if args.levers:
        try:
            args.levers = [parse_lever_case(text) for text in args.levers.split(";") if text.strip()]
        except ValueError as error:
            parser.error(f"--levers: {error}")
    return args


def parse_lever_case(text: str) -> tuple[str, str, str]:
    """``PLUGIN:PRECISION:KEY=VALUE[,KEY=VALUE]`` (a value may hold colons: XLA's flags do not, paths may)."""
    plugin, _, rest = text.strip().partition(":")
    precision, _, lever = rest.partition(":")
    if not (plugin and precision and "=" in lever):
        raise ValueError(f"{text!r} is not PLUGIN:PRECISION:KEY=VALUE")
    return plugin, precision, lever


def selected_levers(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The levers step's cases: ``--levers``, else the table's for the selected plugins."""
    if args.levers:
        return list(args.levers)
    wanted = args.plugins.split(",") if args.plugins else {plugin for plugin, _, _ in LEVERS}
    return [case for case in LEVERS if case[0] in wanted]


def selected_runs(args: argparse.Namespace) -> list[tuple[str, str]]:
    if not args.plugins:
        return list(RUNS)
    wanted = args.plugins.split(",")
    known = [(p, precision) for p, precision in RUNS if p in wanted]
    # a plugin outside the built-in list (a test plugin, a new framework) runs in fp32
    return known + [(p, "fp32") for p in wanted if p not in {name for name, _ in RUNS}]


def selected_cases(args: argparse.Namespace) -> list[str]:
    """The reference step's cases: those of the selected plugins (``--plugins``), else all."""
    wanted = args.plugins.split(",") if args.plugins else list(REFERENCE_CASES.values())
    return [case for case, plugin in REFERENCE_CASES.items() if plugin in wanted]


def gpu_header() -> dict[str, str]:
    """nvidia-smi's GPU name, driver and CUDA version ("" each where there is no GPU)."""
    if not shutil.which("nvidia-smi"):
        return {"gpu": "", "driver": "", "cuda": "", "line": "nvidia-smi: not found (no NVIDIA GPU on this machine)"}
    query = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    )
    banner = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    name, _, driver = query.stdout.splitlines()[0].partition(",") if query.stdout.strip() else ("", "", "")
    cuda = cuda_version(banner)
    return {
        "gpu": name.strip(),
        "driver": driver.strip(),
        "cuda": cuda,
        "line": f"GPU: {name.strip()}, driver {driver.strip()}, CUDA {cuda}",
    }


def cuda_version(banner: str) -> str:
    """The CUDA version nvidia-smi's banner names ("" where it names none)."""
    return next(iter(re.findall(r"CUDA Version:\s*([\d.]+)", banner)), "")


def install(budget: Budget, out: Path) -> str:
    """The venv's interpreter, made (or reused) with the CUDA builds; each step within its budget."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    for what, requirements in INSTALLS:
        granted = budget.grant(240.0, least_s=30.0)
        if granted is None:
            print(f"install {what}: skipped, time budget spent", flush=True)
            continue
        started = time.monotonic()
        log = out / f"install-{what.split()[0].lower()}.log"
        try:
            with open(log, "w") as fh:
                done = subprocess.run(
                    [str(python), "-m", "pip", "install", "-q", *requirements],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    timeout=granted,
                )
            state = "ok" if done.returncode == 0 else f"failed (exit {done.returncode}): {last_line(log)}"
        except subprocess.TimeoutExpired:
            state = f"stopped after {granted:.0f} s (its share of the budget)"
        print(f"install {what}: {state} ({time.monotonic() - started:.0f} s)", flush=True)
    return str(python)


def install_offline(wheels: str) -> str:
    """This interpreter, with the carried wheels and accelbench (editable, its entry points
    registered) installed into its environment from files alone: no registry, no dependency
    resolution (the machine's own packages are the rest)."""
    carried = sorted(str(w) for w in Path(wheels).glob("*.whl"))
    offline = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    for what, extra in (("carried wheels", carried), ("accelbench", ["--no-build-isolation", "-e", str(ROOT)])):
        done = subprocess.run([*offline, *extra], capture_output=True, text=True, timeout=300) if extra else None
        state = (
            "nothing to install"
            if done is None
            else "ok"
            if done.returncode == 0
            else (f"failed (exit {done.returncode}): {(done.stderr.strip().splitlines() or [''])[-1][:300]}")
        )
        print(f"install {what} (no registry): {state}", flush=True)
    return sys.executable


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def print_peaks(python: str, header: dict[str, str]) -> None:
    """The published peaks the records will use for utilisation, per precision."""
    if not header["gpu"]:
        print("peak: none (no GPU)", flush=True)
        return
    code = (
        "import sys; from accelbench import peaks\n"
        "for p in ('fp32', 'bf16', 'fp16'):\n"
        "    peak = peaks.published('gpu', sys.argv[1], p)\n"
        "    print(f'peak {p}: ' + (f'{peak.flops_per_s / 1e12:.1f} TFLOP/s ({peak.source})' if peak else 'none published'))"
    )
    shown = subprocess.run([python, "-c", code, header["gpu"]], capture_output=True, text=True, timeout=60)
    print(shown.stdout.strip() or f"peak: unknown ({shown.stderr.strip()[-200:]})", flush=True)


def training_anchor(python: str, header: dict[str, str]) -> dict | None:
    """The tuned stack's published per-GPU throughput for the GPU found (accelbench's table, read
    by the interpreter that has accelbench), printed with its source; None where there is none."""
    if not header["gpu"]:
        print("anchor: none (no GPU)", flush=True)
        return None
    code = (
        "import dataclasses, json, sys; from accelbench import peaks\n"
        "anchor = peaks.training_anchor(sys.argv[1])\n"
        "print(json.dumps(dataclasses.asdict(anchor) if anchor else None))"
    )
    done = subprocess.run([python, "-c", code, header["gpu"]], capture_output=True, text=True, timeout=60)
    try:
        anchor = json.loads(done.stdout)
    except json.JSONDecodeError:
        print(f"anchor: unknown ({done.stderr.strip()[-200:]})", flush=True)
        return None
    print(anchor_text(header["gpu"], anchor), flush=True)
    return anchor if anchor and anchor["images_per_sec"] else None


def anchor_text(gpu: str, anchor: dict | None) -> str:
    if anchor is None:
        return f"anchor: none for {gpu} (no published per-GPU figure in accelbench's table)"
    if not anchor["images_per_sec"]:
        return f"anchor: none for {gpu} ({anchor['why_none']})"
    return f"anchor: {anchor['images_per_sec']:,.0f} img/s per GPU, {anchor['stack']} ({anchor['source']})"


def standings(lines: list[RunLine], anchor: dict | None) -> list[str]:
    """Per plugin, its best ok run against the anchor and #57's bar (nothing without an anchor)."""
    if anchor is None:
        return []
    best: dict[str, RunLine] = {}
    for line in lines:
        if line.anchor_share is not None and (line.plugin not in best or line.anchor_share > best[line.plugin].anchor_share):
            best[line.plugin] = line
    return [
        f"standing {plugin}: best {line.precision} {line.images_per_sec:.1f} img/s, {line.anchor_share:.1%} of "
        f"{anchor['images_per_sec']:,.0f} ({'meets' if line.anchor_share >= ANCHOR_BAR else 'below'} the {ANCHOR_BAR:.0%} bar)"
        for plugin, line in best.items()
    ]


def measure_peak(python: str, args: argparse.Namespace, budget: Budget, out: Path) -> None:
    """``accelbench peak`` on the device: each selected plugin's framework's large matrix product per
    precision."""
    granted = budget.grant(150.0, least_s=30.0)
    if granted is None:
        print("peak: skipped, time budget spent", flush=True)
        return
    log = out / "peak.log"
    plugins = [flag for plugin in dict.fromkeys(p for p, _ in selected_runs(args)) for flag in ("--plugin", plugin)]
    try:
        with open(log, "w") as fh:
            subprocess.run(
                [python, "-m", "accelbench", "peak", "--device", args.device, *plugins],
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=granted,
                cwd=ROOT,
            )
        print(log.read_text().rstrip(), flush=True)
    except subprocess.TimeoutExpired:
        print(f"peak: stopped after {granted:.0f} s (its share of the budget)", flush=True)


def profile_precisions(python: str, args: argparse.Namespace, budget: Budget, out: Path) -> None:
    """torch_ref's step under torch.profiler at bf16 and fp16 (``torch_profile.py``), its tables printed."""
    granted = budget.grant(PROFILE_S, least_s=60.0)
    if granted is None:
        print("profile: skipped, time budget spent", flush=True)
        return
    precisions = "bf16,fp16" if args.device == "gpu" else "fp32,bf16"  # a CPU has no fp16 autocast here
    command = [python, str(ROOT / "tests" / "device" / "torch_profile.py"), "--out", str(out), "--device", args.device]
    command += ["--precisions", precisions, "--batch", str(args.batch)]
    log = out / "torch-profile.log"
    try:
        with open(log, "w") as fh:
            subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, timeout=granted, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"profile: stopped after {granted:.0f} s (its share of the budget)", flush=True)
    print(log.read_text(errors="replace").rstrip(), flush=True)


def reference_command(python: str, case: str, args: argparse.Namespace, out: Path, pairs: int) -> list[str]:
    """bench_reference for one case in lockstep on the device, as the reference step runs it."""
    pairs = ["--pairs", str(pairs)] if pairs > 1 else []
    return [
        python,
        str(ROOT / "tests" / "benchmarks" / "bench_reference.py"),
        "--case",
        case,
        "--device",
        args.device,
        "--batch-sizes",
        str(args.batch),
        "--lockstep",
        str(args.block),
        "--rounds",
        str(args.rounds),
        *pairs,
        "--warmup",
        "5",
        "--markdown",
        "--keep-records",
        str(out / "records"),
    ]


def reference_case(python: str, case: str, args: argparse.Namespace, budget: Budget, out: Path) -> list[str]:
    """One bench_reference case in lockstep on the device; its README table row(s), or none."""
    pair_s = REFERENCE_OVERHEAD_S + REFERENCE_ROUND_S * args.rounds
    granted = budget.grant(args.pairs * pair_s, least_s=REFERENCE_OVERHEAD_S)
    if granted is None:
        print(f"reference {case}: skipped, time budget spent", flush=True)
        return []
    pairs = pairs_that_fit(granted, pair_s, args.pairs)
    if pairs < args.pairs:  # a case stopped midway prints no table: ask for what fits instead
        unit = "" if pairs > 1 else ", its rounds the unit"
        print(f"reference {case}: {pairs} of {args.pairs} pairs fit its {granted:.0f} s share{unit}", flush=True)
    log = out / f"reference-{case}.log"
    command = reference_command(python, case, args, out, pairs)
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # two processes share the one GPU
    try:
        with open(log, "w") as fh:
            subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, timeout=granted, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        print(f"reference {case}: stopped after {granted:.0f} s (its share of the budget)", flush=True)
    text = log.read_text(errors="replace")
    table = [line for line in text.splitlines() if line.startswith("|")]  # its markdown: header, then rows
    print(f"reference {case}: " + ("\n".join(table[2:]) or f"no row; {last_line(log)}"), flush=True)
    return table


def accelbench_run(python: str, plugin: str, precision: str, device: str) -> list[str]:
    """The head of every ``accelbench run`` the check starts: one plugin at one precision."""
    return [python, "-m", "accelbench", "run", "--plugin", plugin, "--precision", precision, "--device", device]


def lever_pair_s(plugin: str, lever: str, args: argparse.Namespace) -> float:
    """One lever pair's seconds: both start-ups, and both sides' blocks."""
    overhead = LEVER_OVERHEAD_S.get(plugin, DEFAULT_LEVER_OVERHEAD_S) + (COMPILE_OVERHEAD_S if "compile" in lever else 0.0)
    return overhead + 2 * args.lever_blocks * args.lever_block_time


def lever_command(
    python: str, case: tuple[str, str, str], args: argparse.Namespace, pairs: int, granted: float, file: Path
) -> list[str]:
    plugin, precision, lever = case
    return [
        *accelbench_run(python, plugin, precision, args.device),
        "--lever",
        lever,
        "--schedule",
        "lockstep",
        "--trials",
        str(pairs),
        "--blocks",
        str(args.lever_blocks),
        "--block-time",
        f"{args.lever_block_time:g}s",
        "--timeout",
        f"{granted:.0f}",
        "-q",
        "-o",
        str(file),
    ]


def measure_lever(python: str, case: tuple[str, str, str], args: argparse.Namespace, budget: Budget, out: Path) -> LeverLine:
    """One lever beside its plugin as it ships, in lockstep pairs on the device; its line."""
    plugin, precision, lever = case
    pair_s = lever_pair_s(plugin, lever, args)
    granted = budget.grant(args.lever_pairs * pair_s, least_s=pair_s)
    if granted is None:
        line = LeverLine(plugin, precision, lever, "skipped", "time budget spent")
        print(line.text(), flush=True)
        return line
    pairs = pairs_that_fit(granted, pair_s, args.lever_pairs)
    file = out / "records" / f"lever-{plugin}-{precision}-{re.sub(r'[^A-Za-z0-9.]+', '-', lever).strip('-')}.json"
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # two processes share the one GPU
    started = time.monotonic()
    try:
        done = subprocess.run(
            lever_command(python, case, args, pairs, granted, file),
            capture_output=True,
            text=True,
            timeout=granted + 30,
            cwd=ROOT,
            env=env,
        )
        line = lever_line(python, case, file, done)
    except subprocess.TimeoutExpired:
        line = LeverLine(plugin, precision, lever, "timeout", f"no result within {granted:.0f} s")
    line.elapsed_s = time.monotonic() - started
    print(line.text(), flush=True)
    return line


def lever_line(python: str, case: tuple[str, str, str], file: Path, done: subprocess.CompletedProcess) -> LeverLine:
    """The lever's ratio to the plugin as shipped, from ``accelbench compare`` on the run's file."""
    plugin, precision, lever = case
    if not file.exists():
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}, no record"])[-1]
        return LeverLine(plugin, precision, lever, "failed", reason[:300])
    record_file = str(file.relative_to(file.parents[1]))  # beside summary.json
    records = json.loads(file.read_text())["records"]
    broken = [r for r in records if r["status"] != "ok"]
    if broken:
        side = "with the lever" if broken[0]["config"].get("lever") else "as shipped"
        reason = f"{side}: {broken[0].get('reason', '')}"[:300]
        return LeverLine(plugin, precision, lever, broken[0]["status"], reason, record_file=record_file)
    compared = subprocess.run(
        [python, "-m", "accelbench", "compare", str(file), "--json"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    try:
        [comparison] = json.loads(compared.stdout)["comparisons"]
    except (ValueError, KeyError):
        reason = (compared.stderr.strip().splitlines() or ["no comparison"])[-1]
        return LeverLine(plugin, precision, lever, "failed", reason[:300])
    return lever_from_comparison(case, comparison, record_file)


def lever_from_comparison(case: tuple[str, str, str], comparison: dict, record_file: str) -> LeverLine:
    """A comparison's ratio turned to lever over shipped (compare orders its pair as it finds them)."""
    lever_first = "[lever " in comparison["a"]
    ratio = comparison["ratio"] if lever_first else 1 / comparison["ratio"]
    low, high = comparison["ci95"] if lever_first else (1 / comparison["ci95"][1], 1 / comparison["ci95"][0])
    pairs = len(comparison["per_unit"])
    if comparison["single_sample"] or pairs < 2:
        interval, verdict = None, "one pair (no interval)"
    else:
        interval = (low, high)
        verdict = "wins" if low > 1 else "loses" if high < 1 else "undecided"
    if comparison.get("busy"):
        verdict += f"; the machine was busy: {comparison['busy']}"
    return LeverLine(*case, "ok", ratio=ratio, ci95=interval, pairs=pairs, verdict=verdict, record_file=record_file)


def pairs_that_fit(granted_s: float, pair_s: float, wanted: int) -> int:
    """The pairs of processes a case can finish in its share (at least one: a share is granted
    only above one pair's start-ups)."""
    return max(1, min(wanted, int(granted_s // pair_s)))


def run_one(
    python: str, plugin: str, precision: str, args: argparse.Namespace, budget: Budget, out: Path, anchor: dict | None = None
) -> RunLine:
    granted = budget.grant(args.time + RUN_OVERHEAD_S, least_s=min(MIN_RUN_S, args.time + 10))
    if granted is None:
        line = RunLine(plugin, precision, "skipped", "time budget spent")
        print(line.text(), flush=True)
        return line
    record_file = out / "records" / f"{plugin}-{precision}.json"
    started = time.monotonic()
    command = [
        *accelbench_run(python, plugin, precision, args.device),
        "--time",
        f"{args.time:g}s",
        "--timeout",
        f"{granted:.0f}",
        "-q",
        "-o",
        str(record_file),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=granted + 30, cwd=ROOT)
        line = line_from_record(plugin, precision, record_file, done, anchor)
    except subprocess.TimeoutExpired:
        line = RunLine(plugin, precision, "timeout", f"no result within {granted:.0f} s")
    line.elapsed_s = time.monotonic() - started
    print(line.text(), flush=True)
    return line


def line_from_record(
    plugin: str, precision: str, record_file: Path, done: subprocess.CompletedProcess, anchor: dict | None = None
) -> RunLine:
    if not record_file.exists():
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}, no record"])[-1]
        return RunLine(plugin, precision, "failed", reason[:300])
    [record] = json.loads(record_file.read_text())["records"]
    tp, flops = record["throughput"], record["flops"] or {}
    return RunLine(
        plugin,
        precision,
        record["status"],
        record["reason"][:300],
        record["batch"]["global"],
        tp["images_per_sec"] if tp else None,
        flops.get("utilisation"),
        flops.get("peak_source", ""),
        f"{record['device']['kind']}x{record['device']['count']} {record['device']['name']}".strip(),
        record_file=str(record_file.relative_to(record_file.parents[1])),
        device_memory=device_memory_text(record.get("memory")),
        energy=energy_text(record.get("energy")),
        anchor_share=(
            tp["images_per_sec"] / anchor["images_per_sec"]
            if anchor and tp and record["status"] == "ok" and record["device"]["kind"] == "gpu" and record["device"]["count"] == 1
            else None
        ),
    )


def device_memory_text(memory: dict | None) -> str:
    if not memory:
        return "not in the record"
    if memory["device_peak_bytes"] is None:
        return f"none ({memory.get('device_reason', '')})"
    return f"{memory['device_peak_bytes'] / 2**30:.2f} GiB ({memory['device_source']})"


def energy_text(energy: dict | None) -> str:
    if not energy:
        return "not in the record"
    if energy["joules_per_image"] is None:
        return f"none ({energy.get('reason', '')})"
    return f"{energy['joules_per_image']:.3f} J/image, {energy['images_per_kwh']:.0f} images/kWh ({energy['source']})"


def summarize(
    python: str,
    out: Path,
    header: dict[str, str],
    lines: list[RunLine],
    reference_rows: list[str] = (),
    anchor: dict | None = None,
    levers: list[LeverLine] = (),
) -> Path:
    """summary.json (every line, the records validated by accelbench) and summary.md (README rows:
    the runs, then the reference step's)."""
    files = sorted(str(p) for p in (out / "records").glob("*.json"))
    checked = (
        subprocess.run(
            [python, "-m", "accelbench", "validate", *files], capture_output=True, text=True, timeout=SUMMARY_RESERVE_S
        )
        if files
        else None
    )
    today, gpu = date.today().isoformat(), header["gpu"] or "no GPU"
    summary = {
        "date": today,
        **{k: v for k, v in header.items() if k != "line"},
        "records_valid": checked is not None and checked.returncode == 0,
        "validation": checked.stdout.strip().splitlines() if checked else [],
        "runs": [asdict(line) for line in lines],
        "anchor": anchor,
        "anchor_bar": ANCHOR_BAR,
        "standings": standings(lines, anchor),
        "reference": list(reference_rows),
        "levers": [asdict(line) for line in levers],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    rows = [
        "| plugin | precision | batch | images/sec | utilisation | of the per-GPU anchor | date | GPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows += [
        f"| {line.plugin} | {line.precision} | {line.batch} | {line.images_per_sec:.1f} | "
        f"{f'{line.utilisation:.1%}' if line.utilisation is not None else '-'} | "
        f"{f'{line.anchor_share:.1%}' if line.anchor_share is not None else '-'} | {today} | {gpu} |"
        for line in lines
        if line.status == "ok"
    ]
    rows += [
        f"| {line.plugin} | {line.precision} | - | {line.status}: {line.reason} | - | - | {today} | {gpu} |"
        for line in lines
        if line.status != "ok"
    ]
    if reference_rows:
        table_head = reference_rows[:2]  # every case's table opens with the same two lines
        rows += [
            "",
            f"Beside the bare loops on {gpu}, in lockstep:",
            "",
            *table_head,
            *(line for line in reference_rows if line not in table_head),
        ]
    if levers:
        rows += ["", f"Levers on {gpu}, each beside its plugin as it ships, in lockstep pairs:", ""]
        rows += [
            "| plugin | precision | lever | lever / as shipped | 95% interval | pairs | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        rows += [lever_row(line) for line in levers]
    (out / "summary.md").write_text("\n".join(rows) + "\n")
    return out / "summary.json"


def lever_row(line: LeverLine) -> str:
    if line.status != "ok":
        return f"| {line.plugin} | {line.precision} | `{line.lever}` | {line.status}: {line.reason} | - | - | - |"
    interval = f"{line.ci95[0]:.3f}-{line.ci95[1]:.3f}" if line.ci95 else "-"
    return (
        f"| {line.plugin} | {line.precision} | `{line.lever}` | {line.ratio:.3f} | {interval} | {line.pairs} | {line.verdict} |"
    )


if __name__ == "__main__":
    sys.exit(main())
