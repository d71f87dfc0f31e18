"""Reference benchmark: the built-in plugins beside the reference implementations their issues
name, alternating on this machine, so "at least the reference" is decided on the same CPU.

- TensorFlow: the TF Model Garden ResNet-50 (`official.legacy.image_classification.resnet.
  resnet_ctl_imagenet_main`, Keras 2, ResNet v1.5, synthetic data). It pins TensorFlow 2.20 and
  numpy 2, which mxnet 1.9.1 cannot share, so it lives in its own virtual environment:

      python3 -m venv .venv-garden && .venv-garden/bin/pip install tf-models-official==2.20.0

  Compared with `tf_benchmarks --variant v1.5` (both sync every step) and `tpu_official` (both
  10 steps per host round-trip). Its figure: steps after the warm-up / wall time between its own
  TimeHistory timestamps.
- MXNet: the bare hybridized Gluon model-zoo `resnet50_v1` loop the issue measured as MXNet's
  reference (`bare_mxnet.py --conv-biases`: the zoo's network as it ships).

    python tests/benchmarks/bench_reference.py --timed 40 --rounds 2
    python tests/benchmarks/bench_reference.py --case tf-fp32 --garden-python /path/to/python

Prints images/sec of both, the ratio per round and pooled, and GFLOP/s. Exit status 1 if a
pooled ratio is below 0.98 (the reference is faster by more than this machine's noise).
"""

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

from bench_overhead import MIN_RATIO, alternate, exit_if_below, run_accelbench, run_bare

GARDEN_MAIN = "official.legacy.image_classification.resnet.resnet_ctl_imagenet_main"
TIME_HISTORY = re.compile(r"TimeHistory: ([\d.]+) seconds, [\d.]+ examples/second between steps (\d+) and (\d+)")

# name: (accelbench arguments, reference kind, reference arguments)
CASES = {
    "tf-fp32": (["--plugin", "tf_benchmarks", "--variant", "v1.5", "--precision", "fp32"],
                "garden", ["--dtype", "fp32", "--steps_per_loop", "1"]),
    "tf-bf16": (["--plugin", "tf_benchmarks", "--variant", "v1.5", "--precision", "bf16"],
                "garden", ["--dtype", "bf16", "--steps_per_loop", "1"]),
    "tpu-bf16": (["--plugin", "tpu_official", "--option", "steps_per_loop=10"],
                 "garden", ["--dtype", "bf16", "--steps_per_loop", "10"]),
    "mxnet-fp32": (["--plugin", "mxnet_ngc", "--precision", "fp32"],
                   "gluon", ["bare_mxnet.py", "--precision", "fp32", "--conv-biases"]),
    "mxnet-bf16": (["--plugin", "mxnet_ngc", "--precision", "bf16"],
                   "gluon", ["bare_mxnet.py", "--precision", "bf16", "--conv-biases"]),
}


def run_garden(python, args, batch, warmup, timed):
    """Model Garden's own training loop; returns (images, seconds) of the steps after the warm-up."""
    with tempfile.TemporaryDirectory() as model_dir:
        out = subprocess.run(
            [python, "-m", GARDEN_MAIN, "--use_synthetic_data", "--skip_eval", "--distribution_strategy=off",
             "--num_gpus=0", "--noenable_checkpoint_and_export", f"--model_dir={model_dir}",
             f"--batch_size={batch}", f"--train_steps={warmup + timed}", f"--log_steps={warmup}", *args],
            capture_output=True, text=True, cwd=model_dir)
    if out.returncode:
        raise SystemExit(f"Model Garden failed:\n{out.stderr[-2000:]}")
    intervals = [(float(s), int(a), int(b)) for s, a, b in TIME_HISTORY.findall(out.stderr)]
    timed_intervals = [(s, b - a) for s, a, b in intervals if a >= warmup]
    if sum(steps for _, steps in timed_intervals) != timed:
        raise SystemExit(f"Model Garden logged {intervals}, expected {timed} steps after {warmup}")
    return timed * batch, sum(seconds for seconds, _ in timed_intervals)


def measure(name, options):
    args, kind, reference = CASES[name]
    batch, warmup, timed = options.batch, options.warmup, options.timed
    seen = {}

    def run_reference():
        if kind == "garden":
            return run_garden(options.garden_python, reference, batch, warmup, timed)
        return run_bare(reference, batch, warmup, timed)

    rate, per_round = alternate(name, {"accelbench": lambda: run_accelbench(args, batch, warmup, timed, seen),
                                       "reference": run_reference}, options.rounds)
    ours, theirs = rate["accelbench"], rate["reference"]
    return {"case": name, "accelbench": ours, "reference": theirs, "ratio": ours / theirs,
            "round_ratios": [r["accelbench"] / r["reference"] for r in per_round],
            "gflops_per_s": ours * seen["flops_per_image"] / 1e9,
            "what": "TF Model Garden" if kind == "garden" else "bare Gluon model-zoo loop"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    parser.add_argument("--garden-python", default=".venv-garden/bin/python",
                        help="the Python of the environment with tf-models-official")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--timed", type=int, default=100, help="a multiple of --warmup (Model Garden logs per warm-up)")
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    if options.timed % options.warmup:
        parser.error("--timed must be a multiple of --warmup")
    cases = options.case or list(CASES)
    if any(CASES[c][1] == "garden" for c in cases) and not Path(options.garden_python).exists():
        parser.error(f"no Model Garden environment at {options.garden_python} (see this script's docstring)")
    results = [measure(name, options) for name in cases]
    print(f"\n{'case':<12}{'accelbench':>12}{'reference':>11}{'ratio':>8}  {'per round':<18}{'GFLOP/s':>8}   reference")
    for r in results:
        rounds = " ".join(f"{x:.3f}" for x in r["round_ratios"])
        print(f"{r['case']:<12}{r['accelbench']:>12.2f}{r['reference']:>11.2f}{r['ratio']:>8.3f}  {rounds:<18}"
              f"{r['gflops_per_s']:>8.1f}   {r['what']}")
    exit_if_below(results, f"below the reference by more than {1 - MIN_RATIO:.0%}")


if __name__ == "__main__":
    main()
