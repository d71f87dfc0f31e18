"""MLCommons' own tools on accelbench's MLPerf Training logs (``accelbench train --mlperf-log``).

``package`` lays the runs out as an MLPerf submission folder -- ``results/<system>/resnet/
result_<i>.txt`` and ``systems/<system>.json`` -- then runs, each as its users run it
(``python -m mlperf_logging.<tool>``): the compliance checker on every log, the system description
checker on every system, and the result summarizer on the folder. What they said goes into each
record's ``training.mlperf`` block. ``olympic_mean`` is the summarizer's scoring rule applied to
our own records, which the tests hold equal to its score.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean

from accelbench.records.blocks import MlperfLog
from accelbench.records.mlperf_log import BENCHMARK, DIVISION, RULESET, NoLog, Submission, system_description, write_log
from accelbench.records.results import Record

#: the summarizer drops the best and the worst run before averaging (ResNet: one of each)
DROPPED_EACH_SIDE = 1
TOOL_TIMEOUT_S = 300.0


def tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m mlperf_logging.<name> ARGS``, as MLCommons documents it; in a scratch folder,
    where it leaves its own log (``<tool>.log``) and the summarizer its ``summary.json``."""
    with tempfile.TemporaryDirectory(prefix="accelbench-mlperf-") as scratch:
        return subprocess.run(
            [sys.executable, "-m", f"mlperf_logging.{name}", *args],
            capture_output=True,
            text=True,
            cwd=scratch,
            timeout=TOOL_TIMEOUT_S,
            check=False,
        )


def compliance(log: Path, ruleset: str = RULESET) -> str:
    """ "passed" when the compliance checker says SUCCESS, else its first error line."""
    done = tool("compliance_checker", "--usage", "training", "--ruleset", ruleset, str(log.absolute()))
    said = done.stdout + done.stderr
    if done.returncode == 0 and "SUCCESS" in said:
        return "passed"
    return _first_error(said) or f"the compliance checker exited {done.returncode}"


def system_check(path: Path, ruleset: str = RULESET) -> str:
    """ "passed", or what ``system_desc_checker`` said is wrong with the description."""
    done = tool("system_desc_checker", str(path.absolute()), "training", ruleset)
    said = done.stdout + done.stderr
    if done.returncode == 0 and "failed" not in said.lower():
        return "passed"
    return _first_error(said) or f"the system description checker exited {done.returncode}"


def _first_error(said: str) -> str | None:
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    return next((line for line in lines if "ERROR" in line or "FAIL" in line.upper()), lines[-1] if lines else None)


def summarize(folder: Path, ruleset: str = RULESET) -> dict[str, float | None]:
    """The result summarizer's time-to-train score (minutes) of every system in ``folder``."""
    with tempfile.TemporaryDirectory(prefix="accelbench-mlperf-") as scratch:
        table = Path(scratch) / "summary.csv"
        done = tool("result_summarizer", str(folder.absolute()), "training", ruleset, "--csv", str(table))
        if not table.exists():
            raise RuntimeError(f"the result summarizer wrote no summary: {_first_error(done.stdout + done.stderr)}")
        with table.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    return {row["system"]: _minutes(row.get(BENCHMARK)) for row in rows if "system" in row}


def _minutes(cell: str | None) -> float | None:
    try:
        return float(cell) if cell not in (None, "", "nan") else None
    except ValueError:
        return None


def olympic_mean(minutes: Sequence[float]) -> float | None:
    """The summarizer's rule on our own figures: sort, drop the best and the worst, average the
    rest (None when nothing is left: fewer than three runs)."""
    kept = sorted(minutes)[DROPPED_EACH_SIDE : len(minutes) - DROPPED_EACH_SIDE]
    return fmean(kept) if kept else None


def run_minutes(record: Record) -> float | None:
    """run_start to run_stop of the record's log, in minutes: what MLPerf scores."""
    return record.training.wall_time_s / 60 if record.training else None


def check_folder(folder: Path) -> str | None:
    """Why ``folder`` cannot take a new submission layout (it holds one already), or None."""
    if folder.exists() and not folder.is_dir():
        return f"{folder} is not a folder"
    taken = [p for p in (folder / "results", folder / "systems") if p.is_dir() and any(p.iterdir())]
    if taken:
        return f"{folder} already holds MLPerf results ({taken[0].name}/): give an empty folder, or --force to replace them"
    return None


def clear(folder: Path) -> None:
    """Remove an earlier submission's ``results/`` and ``systems/`` from ``folder`` (--force):
    the summarizer would score them with the new runs."""
    import shutil

    for part in ("results", "systems"):
        shutil.rmtree(folder / part, ignore_errors=True)


def package(records: list[Record], folder: Path, submission: Submission) -> list[Record]:
    """Write every finished train-mode run as an MLPerf log under ``folder``, check the logs and
    systems, score them, and note it all in each record's ``training.mlperf``."""
    systems: dict[str, list[tuple[Record, Path]]] = {}
    for record in records:
        if record.training is None:
            continue
        system = submission.system_name(record)
        runs = systems.setdefault(system, [])
        path = folder / "results" / system / BENCHMARK / f"result_{len(runs)}.txt"
        try:
            write_log(record, path, submission)
        except NoLog as why:
            record.training.mlperf = MlperfLog(str(path), RULESET, DIVISION, system, "not written", None, 0, str(why))
            continue
        runs.append((record, path))
    described = {system: _describe(folder, system, runs[0][0], submission) for system, runs in systems.items() if runs}
    scores = summarize(folder) if described else {}
    for system, runs in systems.items():
        for record, path in runs:
            assert record.training is not None
            record.training.mlperf = _block(path, system, runs, scores.get(system), described[system])
    return records


def _describe(folder: Path, system: str, record: Record, submission: Submission) -> str:
    path = folder / "systems" / f"{system}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(system_description(record, submission), indent=2) + "\n")
    return system_check(path)


def _block(path: Path, system: str, runs: list[tuple[Record, Path]], score: float | None, described: str) -> MlperfLog:
    checked = compliance(path)
    reasons = []
    if score is None:
        reasons.append(
            f"the summarizer scores 3 runs or more (olympic mean: best and worst dropped); this system has {len(runs)}"
            if len(runs) < 2 * DROPPED_EACH_SIDE + 1
            else "the summarizer gave this system no score"
        )
    if described != "passed":
        reasons.append(f"system description: {described}")
    return MlperfLog(str(path), RULESET, DIVISION, system, checked, score, len(runs), "; ".join(reasons) or None)


def by_system(records: list[Record]) -> dict[str, list[tuple[Record, MlperfLog]]]:
    """The records that hold an MLPerf log, grouped by the system the summarizer scored them as."""
    systems: dict[str, list[tuple[Record, MlperfLog]]] = {}
    for record in records:
        if record.training and record.training.mlperf:
            systems.setdefault(record.training.mlperf.system, []).append((record, record.training.mlperf))
    return systems


def summary_lines(records: list[Record]) -> list[str]:
    """One line per system: its logs, what the checker said, the summarizer's score."""
    lines = []
    for system, runs in by_system(records).items():
        logs = [log for _, log in runs]
        passed = sum(log.compliance == "passed" for log in logs)
        score = logs[0].score_minutes
        scored = f"score {score:.4f} min (result summarizer)" if score is not None else f"no score: {logs[0].reason}"
        folder = Path(logs[0].log).parent
        lines.append(f"{system}: {len(logs)} log(s) in {folder}, compliance checker passed {passed} of {len(logs)}; {scored}")
    return lines
