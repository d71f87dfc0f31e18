"""Terminal output: live progress while runs go, and the results table after."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from accelbench.analysis.compare import time_lines
from accelbench.execution.runner import RunObserver
from accelbench.records.results import Record, backend_label

if TYPE_CHECKING:
    from accelbench.analysis.compare import Comparison
    from accelbench.execution.matmul_peak import PeakOutcome

COLUMNS = (
    "backend",
    "status",
    "device",
    "precision",
    "model",
    "batch g/dev",
    "images/sec",
    "95% CI",
    "step median",
    "CV",
    "GFLOP/s",
    "of peak",
    "start-up",
    "peak memory",
    "J/image",
)
NUMERIC_COLUMNS = set(COLUMNS[5:])
STATUS_STYLE = {"ok": "green", "failed": "red", "timeout": "red", "unavailable": "yellow", "skipped": "yellow"}


def console(stderr: bool = False) -> Console:
    """A console for accelbench's output, emoji codes off. Not a terminal: 180 columns, since an
    80-column default would cut the figures in a file or CI log."""
    return Console(width=None if sys.stdout.isatty() else 180, emoji=False, stderr=stderr)


def plain(*parts: str | tuple[str, str]) -> Text:
    """Text that prints as written in any console: names, reasons and warnings come from plugins,
    and a ``Text`` is never read as markup (``[bold]``) or emoji codes (a backend ``b`` of a plugin
    ``abdrift`` would print ``abdrift:b:`` as an emoji). A part may be (text, style)."""
    return Text.assemble(*parts)


class FoldingTable:
    """A rich table whose key columns are never cut: when every column does not fit the console
    (and ``wide`` is off), the table keeps only the key columns and each row's other cells print
    folded under it, one line per row, labelled by the row's first cell."""

    def __init__(
        self, title: str, columns: tuple[str, ...], key: tuple[str, ...], numeric: set[str] | tuple[str, ...], wide: bool = False
    ):
        self.title, self.columns, self.key, self.numeric, self.wide = title, columns, key, set(numeric), wide
        #: each row as {column: cell}
        self.rows: list[dict[str, str | Text]] = []

    def add_row(self, *cells: str | Text) -> None:
        self.rows.append(dict(zip(self.columns, cells)))

    def print(self, out: Console) -> None:
        full = self._table(self.columns)
        # the full table fits when its key columns keep their whole lines and the others at least
        # their longest word (rich wraps those)
        measured = Measurement.get(out, out.options.update(max_width=10_000), full)
        if self.wide:
            # every column at its natural width, past the terminal's edge if need be (its lines wrap)
            terminal = out.width
            out.width = max(terminal, measured.maximum)
            try:
                out.print(full, crop=False)
            finally:
                out.width = terminal
            return
        if measured.minimum <= out.width:
            out.print(full)
            return
        out.print(self._table(self.key))
        for row in self.rows:
            rest = [
                f"{name} {_text(row[name])}"
                for name in self.columns
                if name not in self.key and _text(row[name]) not in ("", "-")
            ]
            if rest:
                label = _text(row[self.columns[0]])
                out.print(plain(f"  {label}: ".replace("\n", " ") + " · ".join(rest).replace("\n", " ")))

    def _table(self, names: tuple[str, ...]) -> Table:
        table = Table(title=self.title)
        for name in names:
            # a key column is at least as wide as its longest word, so a name or a figure stays whole
            # (a longer one folds onto the next line rather than being cut with an ellipsis)
            longest = max((len(word) for row in self.rows for word in _text(row[name]).split()), default=0)
            table.add_column(
                name,
                justify="right" if name in self.numeric else "left",
                overflow="fold",
                no_wrap=name in self.numeric,
                min_width=max(min(longest, 40), len(name)) if name in self.key else None,
            )
        for row in self.rows:
            table.add_row(*(row[name] for name in names))
        return table


def _text(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _status(record: Record) -> Text:
    """The status word; its reason prints under the table, where a narrow terminal has room for it."""
    return plain((record.status, STATUS_STYLE[record.status]))


class RunProgress(RunObserver):
    """One bar for the whole run and one line for the step loop in progress (on stderr).

    Redrawn only when a worker reports (at most once a second), never by a timer thread: on a
    machine with as many cores as the worker has threads, a host thread waking 10 times a second
    preempts a framework thread in the middle of a parallel op, and the whole op waits for it.
    """

    def __init__(self, total_trials: int | None):
        self._progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console(stderr=True),
            transient=True,
            auto_refresh=False,
        )
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
        self._progress.update(
            self._steps,
            description=f"{backend_id} trial {trial + 1} {phase}",
            completed=done,
            total=total,
            visible=True,
            refresh=True,
        )

    def finished(self, record: Record) -> None:
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

    def finished(self, record: Record) -> None:
        trial = record.trials[-1]
        rate = f", {trial.images_per_sec:.2f} img/s this trial" if trial.images_per_sec else ""
        tp = record.throughput
        pooled = (
            (f", {tp.images_per_sec:.2f} img/s over {len(record.trials)} trial(s) (95% CI {tp.ci95[0]:.2f}–{tp.ci95[1]:.2f})")
            if tp and len(record.trials) > 1
            else ""
        )
        reason = f": {record.reason}" if record.reason else ""
        self._line(
            f"end {backend_label(record)} trial {len(record.trials)}: "
            f"{record.status}{reason}{rate}{pooled}, {time.monotonic() - self.trial_start:.0f} s"
        )
        for warning in record.warnings:
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
    #: never cut, whatever the terminal's width (the rest fold under their row)
    KEY_COLUMNS = ("backend", "status", "precision", "images/sec", "95% CI")

    def __init__(self, records: list[Record], wide: bool = False):
        self.records, self.wide = records, wide

    def print(self, out: Console | None = None) -> None:
        out = out or console()
        self.table().print(out)
        no_peak = [f"{backend_label(r)} ({r.precision})" for r in self.records if r.flops and r.flops.peak_reason]
        if no_peak:
            out.print(
                plain(
                    ("note", "cyan"),
                    f" no peak to compare with for {', '.join(no_peak)}: "
                    f"`accelbench peak` measures this machine's ('of peak' then shows it)",
                )
            )
        no_energy = {r.energy.reason for r in self.records if r.energy and r.energy.reason}
        for reason in sorted(no_energy):
            out.print(plain(("note", "cyan"), f" no energy figure (J/image): {reason}"))
        for r in self.records:
            if r.reason:
                out.print(plain((r.status, STATUS_STYLE[r.status]), f" {backend_label(r)}: {r.reason}"))
            for warning in r.warnings:
                out.print(plain(("warning", "yellow"), f" {backend_label(r)}: {warning}"))

    def title(self) -> str:
        """The table's title, with the schedule that paired its runs (lockstep, P pairs)."""
        schedules = {(r.schedule.kind, r.schedule.rounds) for r in self.records if r.schedule}
        if len(schedules) != 1:
            return "accelbench results"
        kind, rounds = schedules.pop()
        unit = "pair" if kind == "lockstep" else "round"
        return f"accelbench results ({kind}, {rounds} {unit}{'s' if rounds != 1 else ''})"

    def table(self) -> FoldingTable:
        table = FoldingTable(self.title(), COLUMNS, self.KEY_COLUMNS, NUMERIC_COLUMNS, self.wide)
        for record in self.records:
            table.add_row(*self._row(record))
        return table

    @staticmethod
    def _row(r: Record) -> list[str | Text]:
        tp, st, fl = r.throughput, r.step_time, r.flops
        variation = r.variation()
        return [
            plain(backend_label(r) + (f"\n[{', '.join(variation)}]" if variation else "")),
            _status(r),
            plain(
                f"{r.device.kind}x{r.device.count} {r.device.name}".strip()
                + (f" ×{r.distributed.workers} workers" if r.distributed else "")
            ),
            plain(r.precision),
            plain(model_label(r)),
            f"{r.batch.global_}/{r.batch.per_device}",
            f"{tp.images_per_sec:.2f}" if tp else "-",
            f"{tp.ci95[0]:.2f}–{tp.ci95[1]:.2f}" if tp else "-",
            f"{st.median_s * 1e3:.1f} ms" if st else "-",
            f"{st.cv:.1%}" if st else "-",
            f"{fl.achieved_per_s / 1e9:.1f}" if fl and fl.achieved_per_s else "-",
            f"{fl.utilisation:.0%}" if fl and fl.utilisation is not None else "-",
            *footprint_cells(r),
        ]


def footprint_cells(record: Record) -> list[str]:
    """Start-up (the median trial's, to its first step's end), peak memory (host; the device's
    after it where the framework said) and joules per image; ``-`` where the record has none."""
    startup = record.startup.worker_to_first_step_s if record.startup else None
    memory = record.memory
    host, device = (memory.host_peak_bytes, memory.device_peak_bytes) if memory else (None, None)
    shown = [f"{host / 2**30:.2f} GiB" if host is not None else "-"]
    if device is not None:
        shown.append(f"{device / 2**30:.2f} GiB device")
    joules = record.energy.joules_per_image if record.energy else None
    return [f"{startup:.1f} s" if startup is not None else "-", " + ".join(shown), f"{joules:.3g}" if joules is not None else "-"]


def model_label(record: Record) -> str:
    return " ".join(filter(None, (record.model.name, record.model.variant)))


class TrainingTable(ResultsTable):
    """Train mode: accuracy reached, epochs and time (and cost) to the target."""

    COLUMNS = (
        "backend",
        "status",
        "precision",
        "model",
        "batch",
        "target",
        "best top-1 (epoch)",
        "epochs to target",
        "time to target",
        "train img/s",
        "cost to target",
    )

    KEY_COLUMNS = ("backend", "status", "best top-1 (epoch)", "epochs to target", "time to target")

    def table(self) -> FoldingTable:
        table = FoldingTable("accelbench training (time to accuracy)", self.COLUMNS, self.KEY_COLUMNS, (), self.wide)
        for record in self.records:
            table.add_row(*self._training_row(record))
        return table

    @staticmethod
    def _training_row(r: Record) -> list[str | Text]:
        t = r.training
        head: list[str | Text] = [
            plain(backend_label(r)),
            _status(r),
            plain(r.precision),
            plain(model_label(r)),
            str(r.batch.global_),
        ]
        if not t:
            return [*head, *["-"] * 6]
        reached = t.target_reached
        cost = t.cost_to_target
        return [
            *head,
            f"{t.target_top1:.1%}",
            f"{t.best_eval_accuracy:.2%} ({t.best_epoch})" if t.best_eval_accuracy is not None else "-",
            str(t.epochs_to_target) if reached else f"not reached in {t.epochs_run}",
            f"{t.time_to_target_s:.1f} s" if reached and t.time_to_target_s is not None else "-",
            f"{t.train_images_per_sec:.1f}" if t.train_images_per_sec else "-",
            f"{cost.cost:.4g} {cost.currency}" if cost else "-",
        ]


VERDICT_STYLE = {
    "within": "green",
    "outside": "red",
    "undecided": "yellow",
    "ahead": "green",
    "not behind": "green",
    "behind": "red",
    None: "white",
}


class ComparisonTable:
    def __init__(self, results: list[Comparison], tolerance: float | None, margin: float | None = None, wide: bool = False):
        self.results, self.tolerance, self.margin, self.wide = results, tolerance, margin, wide

    def print(self, out: Console | None = None) -> None:
        out = out or console()
        bound = (
            f" (tolerance ±{self.tolerance:.1%})"
            if self.tolerance
            else f" (margin {self.margin:.1%}: is A at least B?)"
            if self.margin
            else ""
        )
        levels = {r.confidence for r in self.results}
        interval = _interval_header(self.results)
        table = FoldingTable(
            f"accelbench comparison: A / B images/sec{bound}",
            ("A / B", "config", "A img/s", "B img/s", "ratio", interval, "verdict", "samples", "analysis", "note"),
            ("A / B", "ratio", interval, "verdict"),
            ("A img/s", "B img/s", "ratio", interval),
            self.wide,
        )
        for r in self.results:
            level = "" if len(levels) <= 1 else f" ({r.confidence:.2%})"
            # A over B in one cell: two names side by side would not fit 80 columns with the figures
            table.add_row(
                plain(f"{r.a}\n/ {r.b}"),
                plain(r.config),
                f"{r.a_images_per_sec:.2f}",
                f"{r.b_images_per_sec:.2f}",
                f"{r.ratio:.3f}",
                f"{r.ci95[0]:.3f}–{r.ci95[1]:.3f}{level}",
                plain((r.verdict or "-", VERDICT_STYLE[r.verdict])),
                r.samples,
                r.analysis,
                plain(r.note),
            )
        table.print(out)
        for r in self.results:
            if r.per_unit:
                unit = "pair" if "pairs" in r.samples else "round"
                out.print(plain(f"{r.a} / {r.b} by {unit}: " + " ".join(f"{x:.3f}" for x in r.per_unit)))
        for line in dict.fromkeys(line for r in self.results for line in time_lines(r)):
            out.print(plain(line))


def _interval_header(results: list[Comparison]) -> str:
    """The interval column's name: with its confidence when every row shares one (an ``until``
    run's last look spends less than 5% of error, so its intervals are wider than 95%)."""
    levels = {r.confidence for r in results}
    return f"{_percent(levels.pop())} CI" if len(levels) == 1 else "CI"


def _percent(confidence: float) -> str:
    return f"{confidence:.0%}" if round(confidence, 2) == confidence else f"{confidence:.2%}"


class PeakTable:
    """``accelbench peak``: one line per measurement as it ends, the table at the end."""

    def __init__(self, out: Console | None = None):
        self.console = out or console()
        self.rows: list[PeakOutcome] = []

    def __enter__(self) -> "PeakTable":
        return self

    def add(self, outcome: PeakOutcome) -> None:
        self.rows.append(outcome)
        figure = f"{outcome.measurement.flops_per_s / 1e9:.1f} GFLOP/s" if outcome.measurement else outcome.reason
        self.console.print(plain(f"{outcome.backend_id} {outcome.precision}: {figure}"))

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None or not self.rows:
            return
        table = Table(title="accelbench peak: best matrix-product rate on this machine")
        for column in ("framework", "precision", "status", "device", "GFLOP/s", "note"):
            table.add_column(column, justify="right" if column == "GFLOP/s" else "left")
        for o in self.rows:
            m = o.measurement
            table.add_row(
                plain(f"{o.framework} {m.framework_version if m else ''}".strip()),
                plain(o.precision),
                plain((o.status, STATUS_STYLE.get(o.status, "white"))),
                plain(m.device_name if m else ""),
                f"{m.flops_per_s / 1e9:.1f}" if m else "",
                plain("; ".join(o.warnings) if m else o.reason),
            )
        self.console.print(table)
