"""Comparison benchmark: "is TensorFlow within 3% of MXNet?" decided on this machine in one command.

Runs `accelbench run --plugin tf_benchmarks --plugin mxnet_ngc --until-decided 3%` (ResNet-50,
224x224, fp32, batch 8 by default; short interleaved trials — a stable warm-up, then a 20 s time
box —, rounds until the paired interval is decided or the time budget is spent), then prints the machine, the verdict, the ratio and its 95%
interval, the rounds and machine time it took, and the interval's half-width.

    python tests/benchmarks/bench_compare.py                       # 3%, 5 minutes, 20 s trials
    python tests/benchmarks/bench_compare.py --timed 20            # counted: 10 + 20 steps a trial
    python tests/benchmarks/bench_compare.py --halfwidth 1% --max-time 10m
    python tests/benchmarks/bench_compare.py --pair tf_benchmarks,tpu_official --precision bf16
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accelbench import compare, environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tf_benchmarks,mxnet_ngc", help="two plugins, comma-separated")
    parser.add_argument("--tolerance", default="3%", help="--until-decided bound")
    parser.add_argument("--halfwidth", help="instead: --until-halfwidth, e.g. 1%%")
    parser.add_argument("--max-time", default="5m")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=10, help="warm-up steps (the cap of a stable warm-up)")
    parser.add_argument("--timed", type=int, help="count this many timed steps per trial instead of a time box")
    parser.add_argument("--time", default="20s", help="time box of each trial (default 20s)")
    args = parser.parse_args()

    flags = environment.cpu_flags()
    print(f"machine: {environment.cpu_model()}, {environment.os.cpu_count()} cores, "
          f"flags: {' '.join(sorted(f for f in flags if f.startswith(('avx512', 'amx'))))}")
    stop = ["--until-halfwidth", args.halfwidth] if args.halfwidth else ["--until-decided", args.tolerance]
    plugins = [part for name in args.pair.split(",") for part in ("--plugin", name)]
    length = ["--timed-steps", str(args.timed), "--warmup", "fixed"] if args.timed else ["--time", args.time]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "accelbench", "run", *plugins, *stop, "--max-time", args.max_time,
                               "--precision", args.precision, "--global-batch", str(args.batch),
                               "--warmup-steps", str(args.warmup), *length, "-o", str(out)],
                              capture_output=True, text=True)
        elapsed = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"accelbench run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        records = json.loads(out.read_text())["records"]
    bound = compare.parse_tolerance(args.tolerance)
    [result] = compare.comparisons(compare.runs_of(records), bound)
    block = records[0]["schedule"]
    for record in records:
        rates = " ".join(f"{t['images_per_sec']:.2f}" for t in record["trials"])
        print(f"{record['plugin']['name']}: {record['throughput']['images_per_sec']:.2f} img/s pooled; per round: {rates}")
    print(f"{result.a} / {result.b}: ratio {result.ratio:.4f}, 95% CI {result.ci95[0]:.4f}–{result.ci95[1]:.4f} "
          f"(half-width {compare.relative_half_width(result):.2%}), verdict at ±{bound:.0%}: {result.verdict}")
    print(f"analysis: {result.analysis}; {result.samples}; stopped: {block['stop_reason']}")
    trial = f"{args.warmup} warm-up + {args.timed} timed steps" if args.timed else \
        f"a stable warm-up (at most {args.warmup} steps) + {args.time} of timed steps"
    print(f"machine time: {elapsed:.0f} s for {block['rounds']} rounds (trials of {trial}, batch {args.batch}, "
          f"{args.precision})")


if __name__ == "__main__":
    main()
