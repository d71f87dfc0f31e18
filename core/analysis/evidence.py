"""Evidence: the committed results files that the documentation's measured figures come from.

A measurement is a results file under one folder, ``<folder>/<machine>/<date>-<case>.json``,
schema-valid, with the command that wrote it and, in every record, the machine it ran on. This
module loads such a folder and renders it as Markdown (``accelbench report --evidence DIR
--markdown``; the docs' build calls it), so no figure on a page is typed by hand: edit a file and
the page changes; a file that does not validate, or lacks its machine or command, stops the
build with its path named.

Evidence must be made by the methods the code uses now: a file whose figures rest on a method
since replaced (a record's interval by a method ``stats`` no longer computes, an ``until`` run
whose looks spent their error as the design before result schema 1.13 did) stops the build too,
unless it sits in a ``superseded/`` folder, where it is rendered under that name with what
replaced its methods: kept as history, never shown as today's figures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from accelbench.analysis import compare as comparing
from accelbench.analysis import stats
from accelbench.errors import UsageError
from accelbench.records import validation
from accelbench.records.results import Record, ResultsDocument, backend_label, read_json

#: CPU flags that decide how fast a framework runs bf16 and fp32 on a CPU (the brief's machine kinds)
TELLING_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")
#: the comparison tables' equivalence bound, as ``accelbench report``'s default
TOLERANCE = 0.03
#: the folder that keeps evidence made by methods since replaced
SUPERSEDED = "superseded"
#: how records' intervals are computed now (``throughput.ci_method``)
CURRENT_CI_METHODS = (stats.TRIALS_METHOD, stats.STEPS_METHOD)


class EvidenceError(UsageError):
    """A results file that cannot stand as evidence; the message starts with its path."""


@dataclass(frozen=True)
class EvidenceFile:
    path: Path
    command: list[str]
    created_utc: str
    records: list[Record]

    @property
    def superseded(self) -> bool:
        return SUPERSEDED in self.path.parts

    @property
    def machine(self) -> str:
        """One line: the CPU (model, cores, the flags that matter) and any accelerator."""
        env = self.records[0].environment
        flags = [f for f in TELLING_FLAGS if f in (env.cpu_flags or ())]
        cpu = f"{env.cpu_model}, {env.cpu_cores} cores, {' '.join(flags[:2]) or 'no AVX2'}"
        devices = sorted({f"{r.device.count}× {r.device.name}" for r in self.records if r.device.kind != "cpu"})
        return "; ".join([cpu, *devices])


def load(folder: str | Path) -> list[EvidenceFile]:
    """Every ``*.json`` under ``folder`` (sorted by path), checked as evidence."""
    root = Path(folder)
    if not os.path.isdir(root):  # False, not an error, for a name too long
        raise EvidenceError(f"{root}: not a folder of results files")
    paths = sorted(root.rglob("*.json"))
    if not paths:
        raise EvidenceError(f"{root}: no results files (*.json) under it")
    return [load_file(path) for path in paths]


def load_file(path: Path) -> EvidenceFile:
    try:
        document = read_json(path)
    except UsageError as exc:
        raise EvidenceError(f"{path}: {exc}") from None
    problems = validation.errors("results", document)
    if problems:
        raise EvidenceError(f"{path}: not a valid results file: {problems[0]}")
    results = ResultsDocument.from_json(document)
    if not results.command:
        raise EvidenceError(f"{path}: no command: evidence says how it was made (write it with accelbench run -o)")
    if not results.records:
        raise EvidenceError(f"{path}: no records")
    for index, record in enumerate(results.records):
        if not record.environment.cpu_model or not record.environment.cpu_flags:
            raise EvidenceError(f"{path}: record {index} lacks its machine (environment.cpu_model and cpu_flags)")
    found = EvidenceFile(path, results.command, results.created_utc, results.records)
    replaced = stale(found.records)
    if replaced and not found.superseded:
        raise EvidenceError(
            f"{path}: made by a method the code no longer uses ({replaced[0]}): measure it again, "
            f"or move it into a {SUPERSEDED}/ folder"
        )
    return found


def stale(records: list[Record]) -> list[str]:
    """What in these records rests on a method the code has since replaced (none: current)."""
    found = []
    methods = {r.throughput.ci_method for r in records if r.throughput} - set(CURRENT_CI_METHODS)
    found += [f"intervals by {m!r}, replaced by {CURRENT_CI_METHODS[0]!r}" for m in sorted(methods)]
    if any(r.schedule and r.schedule.stop_rule and r.schedule.spending is None for r in records):
        found.append(
            "looks that spent their error one look at a time (before result schema 1.13), replaced by repeated intervals"
        )
    return found


def markdown(files: list[EvidenceFile], root: str | Path | None = None) -> str:
    """The files as Markdown: a section per machine folder, a table of runs per file, and the
    comparison of its runs that share a config (ratio, interval and verdict at ±3%)."""
    out: list[str] = []
    folder = None
    for evidence in files:
        where = evidence.path.parent.relative_to(root) if root else evidence.path.parent
        if where != folder:
            folder = where
            out += [f"## {where.as_posix()}", ""]
        out += _file_section(evidence, root)
    return "\n".join(out).rstrip() + "\n"


def _file_section(evidence: EvidenceFile, root: str | Path | None) -> list[str]:
    name = evidence.path.relative_to(root).as_posix() if root else evidence.path.as_posix()
    replaced = stale(evidence.records)
    lines = [
        f"### {evidence.path.stem}",
        "",
        f"`{name}`, written {evidence.created_utc} on {evidence.machine}.",
        "",
        *([f"**Superseded**: made by methods since replaced ({'; '.join(replaced)}); kept as history.", ""] if replaced else []),
        "```",
        " ".join(evidence.command),
        "```",
        "",
    ]
    lines += _runs_table(evidence.records)
    comparison = comparing.comparisons(comparing.runs_of(evidence.records), TOLERANCE)
    if comparison:
        lines += _comparison_table(comparison)
    return lines


def _runs_table(records: list[Record]) -> list[str]:
    rows = ["| backend | status | precision | batch | images/sec | interval | schedule |", "|---|---|---|--:|--:|--:|---|"]
    for r in records:
        tp = r.throughput
        rows.append(
            f"| {_cell(backend_label(r))} | {r.status} | {r.precision} | {r.batch.global_} | "
            f"{tp.images_per_sec:.2f} | {tp.ci95[0]:.2f}–{tp.ci95[1]:.2f} ({tp.ci_method}) | "
            f"{_schedule(r)} |"
            if tp
            else f"| {_cell(backend_label(r))} | {r.status}: {_cell(r.reason or '')} | {r.precision} | "
            f"{r.batch.global_} | - | - | {_schedule(r)} |"
        )
    return rows + [""]


def _schedule(record: Record) -> str:
    s = record.schedule
    if not s:
        return f"{len(record.trials)} trials"
    unit = "pairs" if s.kind == "lockstep" else "rounds"
    stop = f"; {s.stop_reason}" if s.stop_reason else ""
    return _cell(f"{s.kind}, {s.rounds} {unit}{stop}")


def _comparison_table(results: list[comparing.Comparison]) -> list[str]:
    rows = ["| A / B | ratio | interval | verdict (±3%) | samples | note |", "|---|--:|--:|---|---|---|"]
    for c in results:
        rows.append(
            f"| {_cell(c.a)} / {_cell(c.b)} | {c.ratio:.3f} | {c.ci95[0]:.3f}–{c.ci95[1]:.3f} "
            f"({c.confidence:.2%}) | {c.verdict or '-'} | {_cell(c.samples)} | {_cell(c.note)} |"
        )
    return rows + [""]


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")
