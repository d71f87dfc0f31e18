"""Commands that read results files: ``validate``, ``compare`` and ``report``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from accelbench.cli.app import cli
from accelbench.cli.options import price_options, wide_option
from accelbench.errors import UsageError

if TYPE_CHECKING:
    from accelbench.records.mlperf_log import LoggedRun


@cli.command()
@click.argument("files", nargs=-1, required=True)
def validate(files: tuple[str, ...]) -> None:
    """Validate results files against the schema, naming each wrong field."""
    from accelbench.records import results as records
    from accelbench.records import validation

    bad = 0
    for name in files:  # every file is checked and reported, whatever the ones before it held
        try:
            document = records.read_json(name)
        except UsageError as exc:
            bad += 1
            click.echo(f"{name}: {exc}".replace(f"{name}: results file {name}: ", f"{name}: "))
            continue
        problems = validation.errors("results", document)
        if not problems:
            count = len(document["records"])
            click.echo(f"{name}: ok ({count} record{'s' if count != 1 else ''})")
            continue
        bad += 1
        for problem in problems:
            click.echo(f"{name}: {problem}")
    sys.exit(1 if bad else 0)


@cli.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--tolerance", help="Equivalence bound, e.g. 3%: verdict within / outside / undecided.")
@click.option(
    "--margin", help="Non-inferiority margin, e.g. 2%: is A at least B? verdict ahead / not behind / behind / undecided."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@wide_option
def compare(files: tuple[str, ...], tolerance: str | None, margin: str | None, as_json: bool, wide: bool) -> None:
    """Pair runs by config and report throughput ratios with 95% intervals.

    Exit code: 0 all within, ahead or not behind (or no bound given), 1 some outside or behind,
    3 some undecided.
    """
    from accelbench.analysis import compare as comparing
    from accelbench.execution.schedule import parse_fraction

    if tolerance and margin:
        raise UsageError("give one of --tolerance and --margin")
    bound = comparing.parse_tolerance(tolerance) if tolerance else None
    behind = parse_fraction(margin, "--margin") if margin else None
    results = comparing.compare(comparing.load_runs(list(files)), bound, margin=behind)
    if as_json:
        click.echo(comparing.to_json(results, bound, behind))
    else:
        from accelbench.cli.console import ComparisonTable

        ComparisonTable(results, bound, behind, wide=wide).print()
    sys.exit(comparing.exit_code(results))


@cli.command()
@click.argument("files", nargs=-1)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Folder for index.html and its PNGs.")
@click.option("--reference/--no-reference", default=True, help="Overlay the 2018 study's published figures.")
@click.option("--tolerance", default="3%", show_default=True, help="Equivalence bound of the comparison section.")
@click.option(
    "--evidence",
    type=click.Path(),
    help="A folder of committed results files (<machine>/<date>-<case>.json) to render as Markdown tables (with --markdown).",
)
@click.option("--markdown", is_flag=True, help="Print the --evidence folder's tables as Markdown (what the docs show).")
@click.option(
    "--mlperf-logs",
    "mlperf_logs",
    multiple=True,
    type=click.Path(file_okay=False),
    help="A folder of MLPerf Training logs (ours or a published submission's) to draw beside the runs (repeatable; "
    "needs accelbench[mlperf]).",
)
@price_options
def report(
    files: tuple[str, ...],
    out_dir: str | None,
    reference: bool,
    tolerance: str,
    evidence: str | None,
    markdown: bool,
    mlperf_logs: tuple[str, ...],
    prices: str | None,
    price: str | None,
    price_per_hour: float | None,
    price_per_kwh: float | None,
    epochs: int,
) -> None:
    """Write an HTML study report (throughput vs batch, images per dollar, every run) from results
    files, or with --evidence DIR --markdown print a folder of results files as Markdown tables."""
    from accelbench.analysis import cost
    from accelbench.analysis import report as reporting
    from accelbench.analysis.compare import parse_tolerance
    from accelbench.records import results as records

    if evidence or markdown:
        if not (evidence and markdown) or files or out_dir:
            raise UsageError("--evidence: give it a folder with --markdown, and no FILES or --out")
        from accelbench.analysis import evidence as evidence_files

        click.echo(evidence_files.markdown(evidence_files.load(evidence), evidence), nl=False)
        return
    if not (files or mlperf_logs) or not out_dir:
        raise UsageError("report: give results FILES (or --mlperf-logs DIR) and --out DIR (or --evidence DIR --markdown)")
    bound = parse_tolerance(tolerance)
    logged = _mlperf_logs(mlperf_logs)
    loaded = [r for name in files for r in records.read_results(name)]
    pricing = cost.Pricing.from_flags(prices, price, price_per_hour, epochs, price_per_kwh)
    page = reporting.write(loaded, out_dir, pricing, include_reference=reference, tolerance=bound, logged=logged)
    click.echo(f"report: {page}")


def _mlperf_logs(folders: tuple[str, ...]) -> list[LoggedRun]:
    """The MLPerf logs under each --mlperf-logs folder, parsed by MLCommons' parser; a folder
    that holds none is refused."""
    if not folders:
        return []
    from accelbench.records import mlperf_log

    mlperf_log.require("--mlperf-logs")
    logged = []
    for folder in folders:
        if not Path(folder).is_dir():
            raise UsageError(f"--mlperf-logs {folder!r} is not a folder")
        found = mlperf_log.read_logs(Path(folder))
        if not found:
            raise UsageError(f"--mlperf-logs {folder!r} holds no MLPerf log (*.txt with :::MLLOG lines)")
        logged += found
    return logged
