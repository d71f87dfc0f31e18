"""What parking costs: is the first step after a lockstep side is resumed slower or noisier than a
step in a continuous run of the same process kind, batch and machine?

Two runs, each an ``accelbench run`` writing a schema-valid results file (kept with ``--keep``):

- ``continuous``: every plugin alone, one process each, its steps back to back (``--schedule
  sequential``), ``--timed-steps`` of them after a stable warm-up;
- ``parked``: every plugin in one lockstep run, blocks of about three steps, each side stopped
  (SIGSTOP) while the others run their blocks and continued (SIGCONT) before its own.

The summary (``--summary`` reads the kept files again) gives, per plugin: the mean and coefficient
of variation of the continuous steps, of the first step of each block, and of the block's later
steps; and the first step over the later steps of its own block, with a t-interval over the blocks
(each block pairs them: the machine's speed of the moment cancels).

    python tests/benchmarks/bench_parking.py --keep benchmarks/results/zen4-2core/
    python tests/benchmarks/bench_parking.py --summary benchmarks/results/zen4-2core/*-parking-*.json
"""

import argparse
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from accelbench.analysis import stats
from accelbench.records.results import Record, read_results

PLUGINS = ("tf_benchmarks", "mxnet_ngc", "torch_ref")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugins", default=",".join(PLUGINS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--timed-steps", type=int, default=30, help="continuous steps per plugin (default 30)")
    parser.add_argument("--block-time", default="3.5s", help="parked blocks: about three 1.2 s steps (default 3.5s)")
    parser.add_argument("--blocks", type=int, default=8, help="rounds of blocks in the parked run (default 8)")
    parser.add_argument("--keep", default="results/bench_parking", help="folder for the results files")
    parser.add_argument("--summary", nargs=2, metavar=("CONTINUOUS", "PARKED"), help="only summarise these kept files")
    args = parser.parse_args()
    continuous, parked = (Path(p) for p in args.summary) if args.summary else run(args)
    for line in summary(read_results(continuous), read_results(parked)):
        print(line)


def run(args) -> tuple[Path, Path]:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    plugins = [part for name in args.plugins.split(",") for part in ("--plugin", name)]
    common = ["--precision", "fp32", "--global-batch", str(args.batch), "--force"]
    folder = Path(args.keep)
    folder.mkdir(parents=True, exist_ok=True)
    continuous, parked = folder / f"{stamp}-parking-continuous.json", folder / f"{stamp}-parking-parked.json"
    for out, flags in (
        (continuous, ["--schedule", "sequential", "--timed-steps", str(args.timed_steps), "--warmup-steps", "30"]),
        (parked, ["--schedule", "lockstep", "--block-time", args.block_time, "--blocks", str(args.blocks)]),
    ):
        command = [sys.executable, "-m", "accelbench", "run", *plugins, *common, *flags, "-o", str(out)]
        print(" ".join(command[2:]), flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if not out.exists():
            raise SystemExit(f"no results file ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return continuous, parked


def block_steps(record: Record) -> list[list[float]]:
    """The step times of each counted block of a lockstep record, in order."""
    found = []
    for trial in record.ok_trials():
        times, start = trial.step_times_s, 0
        for block in trial.blocks or ():
            if block.counted:
                found.append(times[start : start + block.steps])
                start += block.steps
    return found


def spread(times: np.ndarray) -> str:
    return f"{times.mean():.3f} s (cv {times.std(ddof=1) / times.mean():.1%})"


def summary(continuous: list[Record], parked: list[Record]) -> list[str]:
    by_plugin = {r.plugin.name: r for r in continuous if r.ok}
    lines = []
    for record in (r for r in parked if r.ok):
        name = record.plugin.name
        steady = np.concatenate([np.asarray(t.step_times_s) for t in by_plugin[name].ok_trials()]) if name in by_plugin else None
        blocks = [b for b in block_steps(record) if len(b) >= 2]
        first = np.asarray([b[0] for b in blocks])
        later = np.asarray([float(np.mean(b[1:])) for b in blocks])
        ratio = stats.log_rate_interval(first / later, float(np.exp(np.mean(np.log(first / later)))))
        center = float(np.exp(np.mean(np.log(first / later))))
        steady_text = f"continuous {spread(steady)}, {steady.size} steps" if steady is not None else "no continuous run"
        lines.append(
            f"{name}: {steady_text}; after a resume: first step {spread(first)}, later steps {spread(later)}, "
            f"{len(blocks)} blocks; first / later in its block {center:.3f} (95% CI {ratio[0]:.3f}–{ratio[1]:.3f})"
        )
    return lines


if __name__ == "__main__":
    main()
