"""The study report: a self-contained HTML page with matplotlib figures (PNG files beside it).

Figures: images/sec against global batch size per backend and device (the 2018 study's main
figure), and images per dollar; a table of every run with its statistics and cost; optionally the
2018 study's published figures as a labelled reference series. Train-mode records add the study's
second figure, top-1 against epoch per backend, and a table of epochs, hours and dollars to target.
"""

from __future__ import annotations

import copy
import html
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.analysis import cost
from accelbench.errors import UsageError
from accelbench.records.blocks import Cost, Training
from accelbench.records.jsonform import read_shipped
from accelbench.records.results import Record

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from accelbench.analysis.compare import Comparison
    from accelbench.records.mlperf_log import LoggedRun

SWEEP_PNG = "throughput_vs_batch.png"
DOLLARS_PNG = "images_per_dollar.png"
ACCURACY_PNG = "accuracy_vs_epoch.png"
ROUNDS_PNG = "images_per_sec_by_round.png"
COMPARE_PNG = "comparisons.png"
PAIRS_PNG = "lockstep_pairs.png"
FOOTPRINT_PNG = "startup_and_memory.png"
REFERENCE_MARKERS = ("*", "P", "X", "D", "s", "^")
#: the equivalence bound of the report's comparison section (``accelbench report --tolerance``)
DEFAULT_TOLERANCE = 0.03


def _headless() -> None:
    """Before pyplot is imported: matplotlib headless, with labels as plain text (a '$' in a
    plugin's name must not start mathtext: it would fail on the unbalanced dollar)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False


def _plain_log_ticks(ax: Axes) -> None:
    """Log axes' ticks as plain numbers (8, 16, 1000): their default labels are math text
    ($\\mathdefault{10^{3}}$), which would print raw, since math text is off to keep a '$' in a
    plugin's name literal; the minor ticks unlabelled, so labels never overprint each other."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())


def _finished(fig: Figure, ax: Axes, xlabel: str, ylabel: str, title: str) -> Figure:
    """Labels, grid, legend and a layout that keeps them inside the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class PublishedRun:
    """A throughput the 2018 study published: its run, batch, images/sec and catalogue price."""

    label: str
    framework: str
    device: str
    count: int
    global_batch: int
    images_per_sec: float
    #: the price catalogue's entry for the hardware
    price: str
    #: read off a chart, not a table
    approximate: bool


@dataclass(frozen=True)
class PublishedCost:
    """A cost to accuracy the 2018 study published."""

    label: str
    top1: float
    epochs: int
    cost_usd: float
    price: str


@dataclass(frozen=True)
class Workload:
    model: str
    image_size: int
    mode: str


@dataclass(frozen=True)
class StudyReference:
    """The 2018 study's published figures (``data/study_2018.json``), drawn beside a report's runs."""

    title: str
    source: str
    imagenet_epoch_images: int
    #: the workload the figures are of: they are drawn only beside runs of it
    workload: Workload
    throughput: list[PublishedRun]
    cost_to_accuracy: list[PublishedCost]


def study_reference() -> StudyReference:
    return read_shipped(StudyReference, "study_2018.json")


def run_label(record: Record) -> str:
    d, model = record.device, record.model
    variation = record.variation()  # a version matrix's requirements, a lever
    return (
        f"{record.plugin.name}:{record.backend.name} {record.precision} "
        f"{model.variant or model.name} {d.kind}x{d.count} {record.image_size}px"
    ) + (f" [{', '.join(variation)}]" if variation else "")


def with_costs(records: list[Record], pricing: cost.Pricing) -> list[Record]:
    """Copies of the records with a cost block at the price given or matched (or "no price")."""
    priced = []
    for record in records:
        record = copy.deepcopy(record)
        pricing.price(record)
        priced.append(record)
    return priced


def sweep_series(records: list[Record]) -> dict[str, list[tuple[int, float]]]:
    """images/sec against global batch, one series per backend/precision/device, one point per ok record."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.throughput and record.mode in (None, "throughput"):
            series.setdefault(run_label(record), []).append((record.batch.global_, record.throughput.images_per_sec))
    return {label: sorted(points) for label, points in series.items()}


def sweep_figure(records: list[Record], reference: StudyReference | None, title: str = "") -> Figure:
    _headless()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in sweep_series(records).items():
        batches, rates = zip(*points)
        ax.plot(batches, rates, marker="o", label=label)
    if reference:  # black hollow stars, never a colour of the runs' cycle: not a series of yours
        for ref, marker in zip(reference.throughput, REFERENCE_MARKERS):
            ax.scatter(
                [ref.global_batch],
                [ref.images_per_sec],
                marker=marker,
                s=110,
                facecolors="none",
                edgecolors="black",
                linewidths=1.2,
                label=f"2018 study, published: {ref.label}",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    return _finished(
        fig,
        ax,
        "global batch size",
        "images / second (training, synthetic data)",
        title or "Training throughput against batch size",
    )


def dollars_figure(records: list[Record], reference: StudyReference | None, catalogue: list[cost.Price]) -> Figure:
    _headless()
    import matplotlib.pyplot as plt

    bars = [
        (f"{run_label(r)} b{r.batch.global_}", r.cost.images_per_dollar, "tab:blue", "")
        for r in records
        if r.cost and r.cost.price and r.cost.images_per_dollar is not None
    ]
    if reference:
        prices = {p.name: p for p in catalogue}
        bars += [
            (
                f"2018 study, published: {ref.label}",
                cost.images_per_dollar(ref.images_per_sec, prices[ref.price].price_per_hour),
                "white",
                "//",
            )
            for ref in reference.throughput
            if ref.price in prices
        ]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(bars) + 1.5))
    for label, value, colour, hatch in bars:
        ax.barh(label, value, color=colour, hatch=hatch, edgecolor="black" if hatch else colour)
    ax.set_xlabel("images per dollar")
    ax.set_title("Images per dollar")
    fig.tight_layout()
    return fig


def footprint_figure(records: list[Record], title: str) -> Figure:
    """Per run: its start-up in three parts (to the first step, the first step, the rest of the
    warm-up) and its peak memory (host, and the device's where the framework said)."""
    _headless()
    import matplotlib.pyplot as plt

    shown = [(r, r.startup) for r in records if r.startup and r.startup.worker_to_first_step_s is not None]
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 0.5 * len(shown) + 1.8), sharey=True)
    for r, s in shown:
        label, memory = f"{run_label(r)} b{r.batch.global_}", r.memory
        to_first, first, warmup = s.worker_to_first_step_s or 0.0, s.first_step_s or 0.0, s.warmup_s or 0.0
        time_ax.barh(label, to_first - first, color="tab:gray")
        time_ax.barh(label, first, left=to_first - first, color="tab:orange")
        time_ax.barh(label, max(0.0, warmup - first), left=to_first, color="tab:olive")
        memory_ax.barh(label, ((memory and memory.host_peak_bytes) or 0) / 2**30, color="tab:blue", height=0.4, align="edge")
        memory_ax.barh(label, ((memory and memory.device_peak_bytes) or 0) / 2**30, color="tab:purple", height=-0.4, align="edge")
    time_ax.legend(["before the first step", "first step", "rest of warm-up"], fontsize=8, loc="best")
    memory_ax.legend(["host peak", "device peak"], fontsize=8, loc="best")
    time_ax.set_xlabel("seconds (median trial)")
    memory_ax.set_xlabel("GiB (largest trial)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def accuracy_figure(records: list[Record], logged: Sequence[LoggedRun] = ()) -> Figure:
    """Held-out top-1 against epoch, one line per train-mode record; its target dashed; MLPerf
    logs read by ``report --mlperf-logs`` dotted, with hollow markers."""
    _headless()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for record, training in training_records(records):
        points = [(row.epoch_num, row.eval_accuracy) for row in training.curve if row.eval_accuracy is not None]
        if points:
            (line,) = ax.plot(*zip(*points), marker="o", label=f"{run_label(record)} on {record.data.source}")
            ax.axhline(training.target_top1, color=line.get_color(), linestyle="--", linewidth=0.8)
    for run in logged:
        if run.points:
            ax.plot(*zip(*run.points), marker="o", markerfacecolor="none", linestyle=":", label=f"MLPerf log {run.label}")
    return _finished(fig, ax, "epoch", "top-1 accuracy (held-out split)", "Convergence: top-1 against epoch (dashed: target)")


def round_series(records: list[Record]) -> dict[str, list[tuple[int, float]]]:
    """images/sec of every trial against its round, one series per record of an interleaved run
    with two rounds or more (drift shows as a slope shared by every series)."""
    series = {}
    for record in records:
        points = [(t.round, t.images_per_sec) for t in record.trials if t.round is not None and t.images_per_sec]
        if len(points) >= 2:
            # a run of one plan has rounds but no schedule block (nothing was interleaved with it)
            run_id = record.schedule.run_id if record.schedule else None
            label = f"{run_label(record)} b{record.batch.global_}" + (f" [run {run_id[:6]}]" if run_id else "")
            series[label] = points
    return series


def rounds_figure(series: dict[str, list[tuple[int, float]]]) -> Figure:
    _headless()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for label, points in series.items():
        ax.plot(*zip(*points), marker="o", label=label)
    return _finished(
        fig,
        ax,
        "round (every run once per round, order reversed every other round)",
        "images / second",
        "Trials by round: a shared slope is the machine drifting",
    )


def training_records(records: list[Record]) -> list[tuple[Record, Training]]:
    return [(r, r.training) for r in records if r.training]


def workload_label(record: Record) -> str:
    """What a figure may put side by side: same model (and variant), image size and data."""
    model = " ".join(filter(None, (record.model.name, record.model.variant)))
    data = f"training on {record.data.source}" if record.mode == "train" else "synthetic data"
    return f"{model}, {record.image_size}px, {data}"


def workloads(records: list[Record]) -> dict[str, list[Record]]:
    groups: dict[str, list[Record]] = {}
    for record in records:
        groups.setdefault(workload_label(record), []).append(record)
    return groups


def is_study_workload(records: list[Record], reference: StudyReference) -> bool:
    """A reference's figures belong only beside its own workload (the 2018 study's: ResNet-50 at
    224x224 on synthetic data), as its data file states it."""
    r, workload = records[0], reference.workload
    return bool(
        r.model.name == workload.model and r.image_size == workload.image_size and (r.mode or "throughput") == workload.mode
    )


def comparison_figure(results: list[Comparison], tolerance: float) -> Figure:
    """A forest plot: each pair's ratio with its 95% interval, the tolerance band shaded."""
    _headless()
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.6 * len(results) + 1.6))
    ax.axvspan(1 - tolerance, 1 + tolerance, color="tab:green", alpha=0.12, label=f"±{tolerance:.0%}")
    ax.axvline(1.0, color="black", linewidth=0.8)
    colours = {"within": "tab:green", "outside": "tab:red", "undecided": "tab:orange", None: "tab:blue"}
    for row, result in enumerate(results):
        ax.errorbar(
            [result.ratio],
            [row],
            xerr=[[result.ratio - result.ci95[0]], [result.ci95[1] - result.ratio]],
            fmt="o",
            color=colours[result.verdict],
            capsize=4,
        )
    ax.set_yticks(range(len(results)), [f"{r.a} / {r.b}" for r in results], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("images/sec ratio A / B with 95% interval")
    ax.set_title("Comparisons")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def pairs_figure(results: list[Comparison]) -> Figure:
    """A forest plot by pair for each lockstep comparison: every pair's ratio (red where a block of
    the pair was busy), and above them the interval over the pairs."""
    _headless()
    import matplotlib.pyplot as plt

    rows = sum(len(r.per_unit) + 2 for r in results)
    fig, ax = plt.subplots(figsize=(8, 0.28 * rows + 1.6))
    ax.axvline(1.0, color="black", linewidth=0.8)
    y, labels, marked = 0, [], False
    for result in results:
        busy = set(result.busy_units)
        ax.errorbar(
            [result.ratio],
            [y],
            xerr=[[result.ratio - result.ci95[0]], [result.ci95[1] - result.ratio]],
            fmt="D",
            color="tab:blue",
            capsize=4,
        )
        labels.append((y, f"{result.a} / {result.b} ({result.confidence:.0%} CI)"))
        for pair, ratio in enumerate(result.per_unit):
            y += 1
            shown_busy = pair in busy
            ax.plot(
                [ratio],
                [y],
                "x" if shown_busy else "o",
                color="tab:red" if shown_busy else "tab:gray",
                label="a pair with a busy block" if shown_busy and not marked else None,
            )
            marked = marked or shown_busy
            labels.append((y, f"pair {pair + 1}"))
        y += 2
    ax.set_yticks([p for p, _ in labels], [text for _, text in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("images/sec ratio A / B by pair, and over the pairs")
    ax.set_title("Lockstep comparisons by pair")
    if marked:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def write(
    records: list[Record],
    out_dir: str | Path,
    pricing: cost.Pricing,
    include_reference: bool = True,
    tolerance: float = DEFAULT_TOLERANCE,
    logged: Sequence[LoggedRun] = (),
) -> Path:
    """Write index.html and its PNGs into ``out_dir``; returns the HTML path. ``logged``: MLPerf
    logs to draw beside the train-mode runs."""
    from accelbench.analysis import compare

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = tempfile.TemporaryFile(dir=out)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None
    probe.close()
    priced = with_costs(records, pricing)
    catalogue, epochs = pricing.catalogue, pricing.epochs
    reference = study_reference() if include_reference else None
    groups = workloads(priced)
    figures = []
    for index, (label, members) in enumerate(groups.items()):
        shown = reference if reference and is_study_workload(members, reference) else None
        figures += [
            (_figure_name(index, SWEEP_PNG), sweep_figure(members, shown, f"Throughput against batch: {label}")),
            (_figure_name(index, DOLLARS_PNG), dollars_figure(members, shown, catalogue)),
        ]
        if _footprints(members):
            figures.append((_figure_name(index, FOOTPRINT_PNG), footprint_figure(members, f"Start-up and peak memory: {label}")))
    if training_records(priced) or logged:
        figures.append((ACCURACY_PNG, accuracy_figure(priced, logged)))
    rounds = round_series(priced)
    if rounds:
        figures.append((ROUNDS_PNG, rounds_figure(rounds)))
    comparisons = compare.comparisons(compare.runs_of(priced), tolerance)
    if comparisons:
        figures.append((COMPARE_PNG, comparison_figure(comparisons, tolerance)))
    by_pair = [c for c in comparisons if c.analysis == compare.LOCKSTEP_ANALYSIS]
    if by_pair:
        figures.append((PAIRS_PNG, pairs_figure(by_pair)))
    _headless()
    import matplotlib.pyplot as plt

    for name, fig in figures:
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
    page = _page(priced, groups, comparisons, tolerance, reference, catalogue, epochs, bool(by_pair), logged)
    target = out / "index.html"
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".index.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(page)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    return target


def _figure_name(workload_index: int, name: str) -> str:
    return f"w{workload_index}-{name}"


def _page(
    records: list[Record],
    groups: dict[str, list[Record]],
    comparisons: list[Comparison],
    tolerance: float,
    reference: StudyReference | None,
    catalogue: list[cost.Price],
    epochs: int,
    by_pair: bool = False,
    logged: Sequence[LoggedRun] = (),
) -> str:
    sections = "\n".join(
        _workload_section(index, label, members, epochs) for index, (label, members) in enumerate(groups.items())
    )
    study = _study_section(reference, catalogue, epochs) if reference else ""
    convergence = _training_section(training_records(records), bool(logged)) + _mlperf_section(records, logged)
    drift = _rounds_section(records) if round_series(records) else ""
    title = html.escape("accelbench report: " + ("; ".join(groups) or "no runs"))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:first-child,th:first-child{{text-align:left}}
tr.warn td{{background:#fff4d6}}.warning{{color:#8a5a00;font-size:12px;text-align:left}}img{{max-width:100%}}</style>
</head><body>
<h1>{title}</h1>
<p>{len(records)} run(s). Throughput = images in the timed steps / wall time of those steps, device sync at
every step. Cost of {epochs} epochs uses the ImageNet epoch of {cost.IMAGENET_EPOCH_IMAGES:,} images. Rows
shaded yellow carry a warning (a high step-time CV, drift, an emulated precision): read their figures with it.
Published 2018 figures are drawn as black hollow markers and hatched bars, never as one of your runs.</p>
{_comparison_section(comparisons, tolerance)}
{_pairs_section(comparisons) if by_pair else ""}
{sections}
{drift}
{convergence}
{study}
</body></html>
"""


def _workload_section(index: int, label: str, members: list[Record], epochs: int) -> str:
    rows = "\n".join(_run_row(r, epochs) for r in members)
    return f"""<h2>{html.escape(label)}</h2>
<h3>Throughput against batch size</h3><img src="{_figure_name(index, SWEEP_PNG)}" alt="images/sec against global batch">
<h3>Images per dollar</h3><p>A run without a bar had no price given or matched.</p>
<img src="{_figure_name(index, DOLLARS_PNG)}" alt="images per dollar">
<h3>Every run</h3>
<table><tr><th>run</th><th>status</th><th>global / per-device batch</th><th>images/s</th><th>95% CI</th>
<th>step median (ms)</th><th>CV</th><th>GFLOP/s</th><th>utilisation</th><th>price / h</th><th>images per $</th>
<th>$ per epoch</th><th>$ for {epochs} epochs</th><th>machine</th></tr>
{rows}
</table>
{_footprint_section(index, members)}"""


def _footprints(members: list[Record]) -> list[Record]:
    """The ok records that say what they cost besides time (result schema 1.11 and later)."""
    return [r for r in members if r.ok and r.startup]


def _footprint_section(index: int, members: list[Record]) -> str:
    shown = _footprints(members)
    if not shown:
        return ""
    rows = "\n".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in _footprint_cells(r)) + "</tr>" for r in shown)
    return f"""<h3>Start-up, memory and energy</h3><p>Start-up runs from the host starting a worker to the end
of its first step (imports, model build, the first step's compilation); a short job pays it every time.
Energy is the machine's own counters over the timed steps (whole devices, every process on them).</p>
<img src="{_figure_name(index, FOOTPRINT_PNG)}" alt="start-up and peak memory of each run">
<table><tr><th>run</th><th>start-up to first step (s)</th><th>first step (s)</th><th>warm-up (s)</th>
<th>host peak (GiB)</th><th>device peak (GiB)</th><th>J per image</th><th>images per kWh</th>
<th>energy cost per epoch</th></tr>
{rows}
</table>"""


def _footprint_cells(r: Record) -> list[str]:
    s, memory, spent = r.startup, r.memory, r.energy

    def seconds(value: float | None) -> str:
        return f"{value:.2f}" if value is not None else "-"

    def gib(value: int | None) -> str:
        return f"{value / 2**30:.2f}" if value is not None else "-"

    priced = r.cost.energy if r.cost else None
    energy_cost = (
        f"{priced.per_epoch:,.2f} {priced.currency} at {priced.price_per_kwh:g}/kWh"
        if priced and priced.per_epoch is not None
        else "-"
    )
    return [
        run_label(r) + f" b{r.batch.global_}",
        seconds(s.worker_to_first_step_s if s else None),
        seconds(s.first_step_s if s else None),
        seconds(s.warmup_s if s else None),
        gib(memory.host_peak_bytes if memory else None),
        gib(memory.device_peak_bytes)
        if memory and memory.device_peak_bytes is not None
        else f"- ({(memory and memory.device_reason) or ''})",
        f"{spent.joules_per_image:.3g}"
        if spent and spent.joules_per_image is not None
        else f"- ({(spent and spent.reason) or ''})",
        f"{spent.images_per_kwh:,.0f}" if spent and spent.images_per_kwh is not None else "-",
        energy_cost,
    ]


def _comparison_section(comparisons: list[Comparison], tolerance: float) -> str:
    if not comparisons:
        return ""
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(cell))}</td>"
            for cell in (
                c.a,
                c.b,
                c.config,
                f"{c.ratio:.3f}",
                f"{c.ci95[0]:.3f}–{c.ci95[1]:.3f}",
                c.verdict,
                c.samples,
                c.analysis,
                c.note,
            )
        )
        + "</tr>"
        for c in comparisons
    )
    return f"""<h2>Comparisons (tolerance ±{tolerance:.0%})</h2>
<p>Every pair of ok runs that share a config, as <code>accelbench compare --tolerance {tolerance:.0%}</code>
decides it.</p><img src="{COMPARE_PNG}" alt="ratio of each pair with its 95% interval">
<table><tr><th>A</th><th>B</th><th>config</th><th>ratio A/B</th><th>95% CI</th><th>verdict</th><th>samples</th>
<th>analysis</th><th>note</th></tr>{rows}</table>"""


def _pairs_section(comparisons: list[Comparison]) -> str:
    from accelbench.analysis.compare import time_lines

    timed = [f"<li>{html.escape(f'{c.a} / {c.b}: ' + '; '.join(time_lines(c)))}</li>" for c in comparisons if time_lines(c)]
    where = f"<p>Where each lockstep run's time went, and its efficiency:</p><ul>{''.join(timed)}</ul>" if timed else ""
    return f"""<h3>Lockstep comparisons by pair</h3><p>Each pair of processes is one sample of the ratio; a
pair drawn as a red cross had a block in which other processes took more than the run's busy share of
the CPUs, and a comparison resting on one gives no verdict.</p><img src="{PAIRS_PNG}" alt="ratio of each pair">{where}"""


def _machine(r: Record) -> str:
    env = r.environment
    units = [f for f in env.cpu_flags or () if f.startswith(("avx512_bf16", "avx512_fp16", "amx", "avx512f"))]
    accelerators = ", ".join(a.name for a in env.accelerators) or "no accelerator"
    framework = f"{r.framework.name} {r.framework.version}".strip()
    # a first touch of memory costs a host fault there: what makes one step slow with page faults
    memory = "; a VM that returns free memory to its host" if env.memory_returned_to_host else ""
    return f"{env.cpu_model} ({', '.join(units) or 'no AVX-512'}), {env.cpu_cores} cores{memory}; {accelerators}; {framework}"


def _run_row(r: Record, epochs: int) -> str:
    tp, st, fl = r.throughput, r.step_time, r.flops
    c = r.cost or Cost(None, "not priced")
    price = c.price

    def money(value: float | None, form: str) -> str:
        return format(value, form) if price and value is not None else "-"

    cells = [
        html.escape(run_label(r)),
        html.escape(r.status + (f": {r.reason}" if r.reason else "")),
        f"{r.batch.global_} / {r.batch.per_device}",
        f"{tp.images_per_sec:.2f}" if tp else "-",
        f"{tp.ci95[0]:.2f}–{tp.ci95[1]:.2f}" if tp else "-",
        f"{st.median_s * 1e3:.1f}" if st else "-",
        f"{st.cv:.1%}" if st else "-",
        f"{fl.achieved_per_s / 1e9:.1f}" if fl and fl.achieved_per_s else "-",
        f"{fl.utilisation:.1%}" if fl and fl.utilisation is not None else "-",
        (html.escape(f"{price.price_per_hour:.2f} {price.currency} ({price.name})") if price else html.escape(c.reason)),
        money(c.images_per_dollar, ",.0f"),
        money(c.cost_per_epoch, ",.2f"),
        money(c.cost_of_epochs, ",.2f"),
        html.escape(_machine(r)),
    ]
    row = "<tr" + (' class="warn"' if r.warnings else "") + ">" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"
    warnings = "".join(
        f'<tr class="warn"><td class="warning" colspan="{len(cells)}">warning: {html.escape(w)}</td></tr>' for w in r.warnings
    )
    return row + warnings


def _rounds_section(records: list[Record]) -> str:
    trends = [f"<li>{html.escape(run_label(r))}: {html.escape(w)}</li>" for r in records for w in r.warnings if "trended" in w]
    listed = f"<ul>{''.join(trends)}</ul>" if trends else "<p>No run's images/sec trended significantly over its rounds.</p>"
    return f"""<h2>Trials by round</h2><img src="{ROUNDS_PNG}" alt="images/sec of each trial against its round">
{listed}"""


def _training_section(records: list[tuple[Record, Training]], logged: bool = False) -> str:
    if not records:
        return f'<h2>Convergence</h2><img src="{ACCURACY_PNG}" alt="top-1 against epoch">' if logged else ""
    rows = []
    for r, t in records:
        reached, c = t.target_reached and t.time_to_target_s is not None, t.cost_to_target
        cells = [
            html.escape(run_label(r)),
            html.escape(r.data.source),
            f"{t.target_top1:.1%}",
            f"{t.best_eval_accuracy:.2%} (epoch {t.best_epoch})" if t.best_eval_accuracy is not None else "-",
            str(t.epochs_to_target) if reached else f"not reached in {t.epochs_run}",
            f"{(t.time_to_target_s or 0.0) / 3600:.4f}" if reached else "-",
            html.escape(f"{c.cost:.4g} {c.currency}") if c else "-",
            f"{t.train_images_per_sec:.1f}" if t.train_images_per_sec else "-",
        ]
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f"""<h2>Convergence: time and cost to accuracy</h2><img src="{ACCURACY_PNG}" alt="top-1 against epoch">
<p>Time to target: wall time from the first step to the evaluation that reached the target (training,
evaluation and input pipeline). Cost to target = that time x the price per hour.</p>
<table><tr><th>run</th><th>dataset</th><th>target top-1</th><th>best top-1</th><th>epochs to target</th>
<th>hours to target</th><th>cost to target</th><th>train images/s</th></tr>{"".join(rows)}</table>
"""


def _mlperf_section(records: list[Record], logged: Sequence[LoggedRun]) -> str:
    """MLCommons' result summarizer's score of each system beside accelbench's own figures of the
    same runs (same seeds), and the MLPerf logs read with --mlperf-logs."""
    from accelbench.analysis.mlperf_checks import by_system, olympic_mean
    from accelbench.records.mlperf_log import RULESET

    rows = []
    for system, logged_runs in by_system(records).items():
        mlperf = logged_runs[0][1]
        runs = [(r, r.training) for r, _ in logged_runs if r.training]
        seeds = ", ".join(str(r.config.get("seed")) for r, _ in runs)
        passed = sum(log.compliance == "passed" for _, log in logged_runs)
        ours = olympic_mean([t.wall_time_s / 60 for _, t in runs])
        to_target = [t.time_to_target_s / 60 if t.time_to_target_s is not None else None for _, t in runs]
        cells = [
            html.escape(system),
            f"{len(runs)} (seeds {html.escape(seeds)})",
            f"{passed} of {len(runs)} passed",
            f"{mlperf.score_minutes:.4f}" if mlperf.score_minutes is not None else html.escape(f"- ({mlperf.reason})"),
            f"{ours:.4f}" if ours is not None else "-",
            ", ".join(f"{m:.4f}" if m is not None else "not reached" for m in to_target),
        ]
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    table = (
        f"""<h2>MLPerf Training logs: scored by MLCommons' result summarizer</h2>
<p>Each run's MLPerf log (ruleset {RULESET}, division open)
checked by MLCommons' compliance checker; the score is the summarizer's time to train, run_start to run_stop,
olympic mean of the system's runs (best and worst dropped). Beside it, the same mean computed from our records,
and accelbench's time to target of each run.</p>
<table><tr><th>system</th><th>runs</th><th>compliance checker</th><th>MLPerf score (min)</th>
<th>accelbench run time, olympic mean (min)</th><th>accelbench time to target (min, by seed)</th></tr>{"".join(rows)}</table>"""
        if rows
        else ""
    )
    if logged:
        listed = "".join(
            f"<tr><td>{html.escape(run.label)}</td><td>{len(run.points)}</td>"
            f"<td>{max((a for _, a in run.points), default=0):.4f}</td>"
            f"<td>{f'{run.minutes:.2f}' if run.minutes is not None else '-'}</td><td>{html.escape(run.status or '-')}</td></tr>"
            for run in logged
        )
        table += f"""<h3>MLPerf logs read (dotted in the convergence figure)</h3>
<table><tr><th>log</th><th>evaluations</th><th>best eval_accuracy</th><th>run_start to run_stop (min)</th>
<th>status</th></tr>{listed}</table>"""
    return table


def _study_section(reference: StudyReference, catalogue: list[cost.Price], epochs: int) -> str:
    prices = {p.name: p for p in catalogue}
    rows = []
    for ref in reference.throughput:
        p = prices.get(ref.price)
        ips = ref.images_per_sec
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{c}</td>"
                for c in (
                    html.escape(ref.label) + (" (approximate)" if ref.approximate else ""),
                    ref.global_batch,
                    f"{ips:,}",
                    f"{p.price_per_hour:.2f}" if p else "no price",
                    f"{cost.images_per_dollar(ips, p.price_per_hour):,.0f}" if p else "-",
                    f"{cost.cost_of_epochs(1, ips, p.price_per_hour):.2f}" if p else "-",
                    f"{cost.cost_of_epochs(epochs, ips, p.price_per_hour):.2f}" if p else "-",
                )
            )
            + "</tr>"
        )
    accuracy = []
    for item in reference.cost_to_accuracy:
        p = prices[item.price]
        implied = cost.implied_images_per_sec(item.epochs, item.cost_usd, p.price_per_hour)
        accuracy.append(
            f"<tr><td>{html.escape(item.label)}</td><td>{item.epochs}</td><td>{item.cost_usd}</td>"
            f"<td>{item.cost_usd / item.epochs:.3f}</td><td>{implied:,.0f}</td></tr>"
        )
    return f"""<h2>The 2018 study, for reference ({html.escape(reference.source)})</h2>
<table><tr><th>published run</th><th>global batch</th><th>images/s</th><th>price / h (USD)</th><th>images per $</th>
<th>$ per epoch</th><th>$ for {epochs} epochs</th></tr>{"".join(rows)}</table>
<p>Cost to accuracy as published, and the training throughput those dollars imply at the catalogue price
(lower than the synthetic-data figure: those runs read real ImageNet through an input pipeline):</p>
<table><tr><th>target</th><th>epochs</th><th>USD</th><th>USD per epoch</th><th>implied images/s</th></tr>
{"".join(accuracy)}</table>
"""
