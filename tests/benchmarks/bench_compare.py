"""Comparison benchmark: "is TensorFlow within 3% of MXNet?" on this machine, in rounds of fresh
processes and in lockstep, on a quiet machine and beside a one-core CPU hog.

Each case is one ``accelbench run --plugin tf_benchmarks --plugin mxnet_ngc`` (ResNet-50, 224x224,
fp32, batch 8) that runs until its ratio's interval is 1% wide on each side or its time is spent,
so that the half-width it reached after 5 and 10 minutes can be read off it. Its results file is
kept (``--keep``): schema-valid, every record with the machine's CPU model and flags, the command
in the file. The summary is computed from those files alone (``--summary`` reads them again): the
verdict at +-3% and when the run's sequential looks would first have decided it, the ratio with
the interval at the last look, and the plain 95% half-width after 5 and 10 minutes.

    python tests/benchmarks/bench_compare.py --keep benchmarks/results/xeon-amx/    # all four cases
    python tests/benchmarks/bench_compare.py --cases lockstep-quiet --max-time 5m --keep /tmp/x
    python tests/benchmarks/bench_compare.py --summary benchmarks/results/xeon-amx/*-decide-*.json
"""

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from accelbench.analysis import compare, stats
from accelbench.environments import machine as environment
from accelbench.records.results import read_results

#: case -> (schedule flags, a one-core hog beside the run?). Rounds keep `accelbench run`'s own
#: trial length for --until runs; lockstep's stable warm-up may take up to 30 steps (MXNet's step
#: time still fell after 10 on the Xeon VM); beside the hog lockstep runs on (--when-busy go) so
#: that what the guard makes of busy blocks shows, rather than a run that waits out its budget.
CASES = {
    # the user's own command: every setting at its default (lockstep for two backends)
    "default-quiet": ([], False),
    "rounds-quiet": (["--schedule", "interleaved"], False),
    "lockstep-quiet": (["--schedule", "lockstep", "--warmup-steps", "30"], False),
    "rounds-hog": (["--schedule", "interleaved"], True),
    "lockstep-hog": (["--schedule", "lockstep", "--warmup-steps", "30", "--when-busy", "go"], True),
}
TOLERANCE = 0.03
CHECKPOINTS_S = (300, 600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--pair", default="tf_benchmarks,mxnet_ngc", help="two plugins, comma-separated")
    parser.add_argument("--max-time", default="10m", help="each quiet case's time (default 10m)")
    parser.add_argument("--hog-time", default="5m", help="each case's time beside the hog (default 5m)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--until",
        default="halfwidth",
        choices=("halfwidth", "decided"),
        help="halfwidth: run until the interval is 1%% wide (to read it at 5 and 10 minutes); "
        "decided: the user's question, --until-decided 3%%, stopping at the verdict",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of each case (files numbered)")
    parser.add_argument("--keep", default="results/bench_compare", help="folder for the cases' results files")
    parser.add_argument("--summary", nargs="+", help="only summarise these kept results files")
    args = parser.parse_args()
    files = [Path(p) for p in args.summary] if args.summary else run_cases(args)
    print(machine_line())
    for path in files:
        print(summary_line(path))


def machine_line() -> str:
    flags = sorted(f for f in environment.cpu_flags() if f.startswith(("avx512", "amx", "avx2")))
    return f"machine: {environment.cpu_model()}, {os.cpu_count()} cores, flags: {' '.join(flags)}"


def run_cases(args) -> list[Path]:
    plugins = [part for name in args.pair.split(",") for part in ("--plugin", name)]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    kept = []
    stop = ["--until-halfwidth", "1%"] if args.until == "halfwidth" else ["--until-decided", f"{TOLERANCE:.0%}"]
    for name, run in ((name, run) for name in args.cases.split(",") for run in range(1, args.runs + 1)):
        flags, hog = CASES[name]
        suffix = "" if args.until == "halfwidth" else "-until-decided"
        numbered = f"-{run}" if args.runs > 1 else ""
        out = Path(args.keep) / f"{stamp}-decide-{name}{suffix}{numbered}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        budget = args.hog_time if hog else args.max_time
        command = [
            sys.executable,
            "-m",
            "accelbench",
            "run",
            *plugins,
            "--precision",
            "fp32",
            "--global-batch",
            str(args.batch),
            *flags,
            *stop,
            "--max-time",
            budget,
            "--force",
            "-o",
            str(out),
        ]
        print(f"{name}: {' '.join(command[2:])}", flush=True)
        with one_core_hog() if hog else contextlib.nullcontext():
            done = subprocess.run(command, capture_output=True, text=True)
        if not out.exists():
            raise SystemExit(f"{name}: no results file ({done.returncode}): {done.stderr.strip()[-2000:]}")
        kept.append(out)
    return kept


@contextlib.contextmanager
def one_core_hog():
    """A busy loop pinned to CPU 0, in a session of its own (outside the run's process tree), as a
    user's other job on a shared box."""
    hog = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def summary_line(path: Path) -> str:
    records = [r for r in read_results(path) if r.ok]
    schedule = records[0].schedule
    decided_at, look_result = sequential_decision(records)
    final = compare.comparisons(compare.runs_of(records), TOLERANCE)[0]
    widths = {t: half_width_by(records, t) for t in CHECKPOINTS_S}
    width_text = ", ".join(f"{w:.2%} at {t // 60} min" if w is not None else f"- at {t // 60} min" for t, w in widths.items())
    decision = (
        f"{look_result.verdict} at ±{TOLERANCE:.0%} after {decided_at:.0f} s "
        f"(ratio {look_result.ratio:.3f}, {look_result.confidence:.2%} CI "
        f"{look_result.ci95[0]:.3f}–{look_result.ci95[1]:.3f})"
        if decided_at is not None
        else f"not decided at ±{TOLERANCE:.0%} ({final.note or final.verdict})"
    )
    split = schedule.lockstep.time if schedule.lockstep else None
    spent = f"; time {split.describe()}" if split else ""
    efficiency = f"; efficiency {final.efficiency.efficiency:.0%}" if final.efficiency else ""
    return (
        f"{path.name}: {schedule.kind}, {schedule.rounds} {unit(schedule)}, {schedule.elapsed_s or 0:.0f} s; "
        f"{final.a} / {final.b} {final.ratio:.3f} ({final.confidence:.2%} CI {final.ci95[0]:.3f}–"
        f"{final.ci95[1]:.3f}, {final.verdict}); {decision}; 95% half-width: {width_text}{spent}{efficiency}"
        + (f"; {final.busy}" if final.busy else "")
    )


def unit(schedule) -> str:
    return "pairs" if schedule.kind == "lockstep" else "rounds"


def first_units(records, count: int):
    """The records as they stood after their first ``count`` rounds (or pairs)."""
    return [dataclasses.replace(r, trials=[t for t in r.trials if (t.round or 0) < count]) for r in records]


def unit_end_s(records, index: int) -> float:
    """Seconds from the run's first trial to the end of round (or pair) ``index``."""

    def seconds(text):
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    start = min(seconds(t.started_utc) for r in records for t in r.trials)
    return max(seconds(t.ended_utc) for r in records for t in r.trials if t.round == index) - start


def sequential_decision(records):
    """When the run's own looks would first have decided the ±3% question; (None, None) if never.
    The looks as the run spent its error (``schedule.spending``: repeated intervals, result schema
    1.13), or, in an earlier record, one look after every unit from the second on at
    ``stats.sequential_confidence``."""
    schedule = records[0].schedule
    units = schedule.rounds
    plan = schedule.spending
    for count in range(2, units + 1):
        confidence = (
            stats.Spending(plan.first, plan.last, plan.error).confidence_at(count)
            if plan
            else stats.sequential_confidence(count - 1)
        )
        if confidence >= 1:
            continue
        [result] = compare.comparisons(compare.runs_of(first_units(records, count)), TOLERANCE, confidence=confidence)
        if result.verdict in ("within", "outside"):
            return unit_end_s(records, count - 1), result
    return None, None


def half_width_by(records, seconds: float) -> float | None:
    """The plain 95% interval's relative half-width over the units finished ``seconds`` into the run."""
    units = records[0].schedule.rounds
    done = [i for i in range(units) if unit_end_s(records, i) <= seconds]
    if len(done) < 2:
        return None
    [result] = compare.comparisons(compare.runs_of(first_units(records, len(done))), None, confidence=0.95)
    return compare.relative_half_width(result)


if __name__ == "__main__":
    main()
