"""Terminal output: live progress while runs go, and the results table after."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .runner import RunObserver

COLUMNS = ("backend", "status", "device", "precision", "model", "batch g/dev", "images/sec",
           "95% CI", "step median", "CV", "GFLOP/s", "of peak")
NUMERIC_COLUMNS = set(COLUMNS[5:])
STATUS_STYLE = {"ok": "green", "failed": "red", "timeout": "red", "unavailable": "yellow", "skipped": "yellow"}


class RunProgress(RunObserver):
    """One bar for the whole run and one line for the step loop in progress (on stderr).

    Redrawn only when a worker reports (at most once a second), never by a timer thread: on a
    machine with as many cores as the worker has threads, a host thread waking 10 times a second
    preempts a framework thread in the middle of a parallel op, and the whole op waits for it.
    """

    def __init__(self, total_trials: int | None):
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                                  auto_refresh=False)
        self._overall = self._progress.add_task("trials", total=total_trials)
        self._steps = self._progress.add_task("", total=None, visible=False)

    def __enter__(self) -> "RunProgress":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def started(self, backend_id: str, trial: int, round_index: int) -> None:
        self.progress(backend_id, trial, "starting", 0, None)

    def progress(self, backend_id: str, trial: int, phase: str, done: int, total: int | None) -> None:
        self._progress.update(self._steps, description=f"{backend_id} trial {trial + 1} {phase}",
                              completed=done, total=total, visible=True, refresh=True)

    def finished(self, record: dict) -> None:
        self._progress.advance(self._overall)
        self._progress.refresh()


class LogLines(RunObserver):
    """Plain lines for a log file or CI (output not a terminal): one when each trial starts, one
    when it ends (status, images/sec, interval, elapsed, warnings), and one at most every
    ``INTERVAL_S`` while a long phase runs, so a log shows the run is alive."""

    INTERVAL_S = 30.0

    def __init__(self, stream: TextIO, total_trials: int | None = None):
        self.stream, self.total = stream, total_trials
        self.count, self.trial_start, self.last_line = 0, 0.0, 0.0
        self.warned: set[str] = set()

    def started(self, backend_id: str, trial: int, round_index: int) -> None:
        self.count += 1
        self.trial_start = self.last_line = time.monotonic()
        of = f"/{self.total}" if self.total else ""
        self._line(f"start {backend_id} trial {trial + 1} (round {round_index + 1}; trial {self.count}{of} of this run)")

    def progress(self, backend_id: str, trial: int, phase: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self.last_line < self.INTERVAL_S:
            return
        self.last_line = now
        steps = f"{done}/{total}" if total else f"{done}"
        self._line(f"... {backend_id} trial {trial + 1}: {phase} {steps} steps, {now - self.trial_start:.0f} s")

    def finished(self, record: dict) -> None:
        trial = record["trials"][-1]
        rate = f", {trial['images_per_sec']:.2f} img/s this trial" if trial["images_per_sec"] else ""
        tp = record["throughput"]
        pooled = (f", {tp['images_per_sec']:.2f} img/s over {len(record['trials'])} trial(s) "
                  f"(95% CI {tp['ci95'][0]:.2f}–{tp['ci95'][1]:.2f})") if tp and len(record["trials"]) > 1 else ""
        reason = f": {record['reason']}" if record["reason"] else ""
        self._line(f"end {record['plugin']['name']}:{record['backend']['name']} trial {len(record['trials'])}: "
                   f"{record['status']}{reason}{rate}{pooled}, {time.monotonic() - self.trial_start:.0f} s")
        for warning in record["warnings"]:
            if warning not in self.warned:  # a record's warnings stay with it trial after trial
                self.warned.add(warning)
                self._line(f"  warning: {warning}")

    def _line(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=self.stream, flush=True)


def run_observer(total_trials: int | None, quiet: bool, stream: TextIO) -> RunObserver:
    """The live view of a run: a progress bar on a terminal, plain lines in a log, or nothing."""
    if quiet:
        return RunObserver()
    if stream.isatty():
        return RunProgress(total_trials)
    return LogLines(stream, total_trials)


class ResultsTable:
    def __init__(self, records: list[dict[str, Any]]):
        self.records = records

    def print(self, console: Console | None = None) -> None:
        # an 80-column default would truncate the figures when output goes to a file or CI log
        console = console or Console(width=None if sys.stdout.isatty() else 180)
        console.print(self.table())
        for r in self.records:
            for warning in r["warnings"]:
                console.print(f"[yellow]warning[/] {r['plugin']['name']}:{r['backend']['name']}: {warning}",
                              highlight=False)

    def table(self) -> Table:
        table = Table(title="accelbench results")
        for column in COLUMNS:
            table.add_column(column, justify="right" if column in NUMERIC_COLUMNS else "left")
        for record in self.records:
            table.add_row(*self._row(record))
        return table

    @staticmethod
    def _row(r: dict[str, Any]) -> list[str]:
        status = f"[{STATUS_STYLE[r['status']]}]{r['status']}[/]"
        if r["reason"]:
            status += f"\n{r['reason'][:120]}"
        tp, st, fl = r["throughput"], r["step_time"], r["flops"]
        added = r["environment"].get("worker", {}).get("added")
        return [
            f"{r['plugin']['name']}:{r['backend']['name']}" + (f"\n[{', '.join(added)}]" if added else ""), status,
            f"{r['device']['kind']}x{r['device']['count']} {r['device']['name']}".strip()
            + (f" ×{r['distributed']['workers']} workers" if r.get("distributed") else ""),
            r["precision"], model_label(r),
            f"{r['batch']['global']}/{r['batch']['per_device']}",
            f"{tp['images_per_sec']:.2f}" if tp else "-",
            f"{tp['ci95'][0]:.2f}–{tp['ci95'][1]:.2f}" if tp else "-",
            f"{st['median_s'] * 1e3:.1f} ms" if st else "-",
            f"{st['cv']:.1%}" if st else "-",
            f"{fl['achieved_per_s'] / 1e9:.1f}" if fl and fl["achieved_per_s"] else "-",
            f"{fl['utilisation']:.0%}" if fl and fl.get("utilisation") is not None else "-",
        ]


def model_label(record: dict[str, Any]) -> str:
    return " ".join(filter(None, (record["model"]["name"], record["model"]["variant"])))


class TrainingTable(ResultsTable):
    """Train mode: accuracy reached, epochs and time (and cost) to the target."""

    COLUMNS = ("backend", "status", "precision", "model", "batch", "target", "best top-1 (epoch)",
               "epochs to target", "time to target", "train img/s", "cost to target")

    def table(self) -> Table:
        table = Table(title="accelbench training (time to accuracy)")
        for column in self.COLUMNS:
            table.add_column(column)
        for record in self.records:
            table.add_row(*self._training_row(record))
        return table

    @staticmethod
    def _training_row(r: dict[str, Any]) -> list[str]:
        status = f"[{STATUS_STYLE[r['status']]}]{r['status']}[/]" + (f"\n{r['reason'][:120]}" if r["reason"] else "")
        t = r.get("training")
        head = [f"{r['plugin']['name']}:{r['backend']['name']}", status, r["precision"], model_label(r),
                str(r["batch"]["global"])]
        if not t:
            return head + ["-"] * 6
        reached = t["target_reached"]
        cost = t["cost_to_target"]
        return head + [
            f"{t['target_top1']:.1%}",
            f"{t['best_eval_accuracy']:.2%} ({t['best_epoch']})" if t["best_eval_accuracy"] is not None else "-",
            str(t["epochs_to_target"]) if reached else f"not reached in {t['epochs_run']}",
            f"{t['time_to_target_s']:.1f} s" if reached else "-",
            f"{t['train_images_per_sec']:.1f}" if t["train_images_per_sec"] else "-",
            f"{cost['cost']:.4g} {cost['currency']}" if cost else "-",
        ]


VERDICT_STYLE = {"within": "green", "outside": "red", "undecided": "yellow", None: "white"}


class ComparisonTable:
    def __init__(self, results: list, tolerance: float | None):
        self.results, self.tolerance = results, tolerance

    def print(self, console: Console | None = None) -> None:
        console = console or Console(width=None if sys.stdout.isatty() else 180)
        bound = f" (tolerance ±{self.tolerance:.1%})" if self.tolerance else ""
        table = Table(title=f"accelbench comparison: A / B images/sec{bound}")
        for column in ("A", "B", "config", "A img/s", "B img/s", "ratio", "95% CI", "verdict", "samples",
                       "analysis", "note"):
            table.add_column(column, justify="right" if column in ("A img/s", "B img/s", "ratio", "95% CI") else "left")
        for r in self.results:
            table.add_row(r.a, r.b, r.config, f"{r.a_images_per_sec:.2f}", f"{r.b_images_per_sec:.2f}",
                          f"{r.ratio:.3f}", f"{r.ci95[0]:.3f}–{r.ci95[1]:.3f}",
                          f"[{VERDICT_STYLE[r.verdict]}]{r.verdict or '-'}[/]", r.samples, r.analysis, r.note)
        console.print(table)


class PeakTable:
    """``accelbench peak``: one line per measurement as it ends, the table at the end."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(width=None if sys.stdout.isatty() else 180)
        self.rows: list = []

    def __enter__(self) -> "PeakTable":
        return self

    def add(self, outcome) -> None:
        self.rows.append(outcome)
        figure = f"{outcome.measurement.flops_per_s / 1e9:.1f} GFLOP/s" if outcome.measurement else outcome.reason
        self.console.print(f"{outcome.backend_id} {outcome.precision}: {figure}", highlight=False)

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None or not self.rows:
            return
        table = Table(title="accelbench peak: best matrix-product rate on this machine")
        for column in ("framework", "precision", "status", "device", "GFLOP/s", "note"):
            table.add_column(column, justify="right" if column == "GFLOP/s" else "left")
        for o in self.rows:
            m = o.measurement
            table.add_row(f"{o.framework} {m.framework_version if m else ''}".strip(), o.precision,
                          f"[{STATUS_STYLE.get(o.status, 'white')}]{o.status}[/]", m.device_name if m else "",
                          f"{m.flops_per_s / 1e9:.1f}" if m else "", "; ".join(o.warnings) if m else o.reason)
        self.console.print(table)
