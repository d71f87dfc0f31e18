"""``accelbench run``, ``rerun`` and ``peak``: plans executed in rounds or lock step, results
written after every trial, tables and comparisons printed."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from accelbench.cli.app import cli
from accelbench.cli.options import (
    RUN_ONLY_FIELDS,
    View,
    config_options,
    field_options,
    force_option,
    price_options,
    python_paths,
    run_config,
    selected,
    slurm_options,
    wide_option,
)
from accelbench.errors import UsageError
from accelbench.execution.schedule import DEFAULT_BLOCK_S, DEFAULT_BLOCKS, DEFAULT_UNTIL_BLOCKS
from accelbench.planning import inputs

if TYPE_CHECKING:
    from collections.abc import Callable

    from accelbench.analysis.cost import Pricing
    from accelbench.cli.console import ResultsTable
    from accelbench.execution.schedule import Schedule
    from accelbench.execution.slurm_jobs import JobSpec
    from accelbench.planning.config import RunConfig
    from accelbench.planning.plan import Plan
    from accelbench.planning.replay import Replay
    from accelbench.records.blocks import Environment
    from accelbench.records.results import Record


@cli.command()
@config_options
@field_options(RUN_ONLY_FIELDS)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Results file (default results/accelbench-<time>.json).")
@force_option
@click.option(
    "--lever",
    "levers",
    multiple=True,
    metavar="KEY=VALUE[,KEY=VALUE]",
    help="Also run every selected backend with these backend options (or allocator, huge_pages, threads, "
    "inter_op_threads) changed, beside the run as configured, so a comparison decides whether the lever "
    "helps here (repeatable: one run per lever).",
)
@click.option(
    "--schedule",
    "schedule_kind",
    type=click.Choice(["lockstep", "interleaved", "sequential"]),
    help="lockstep: warm workers take turns in blocks of steps, in pairs of processes (--trials "
    "pairs; the default when two or more single-worker runs on the CPU are compared); "
    "interleaved: rounds of fresh processes, every run once, order reversed every other round "
    "(the default otherwise); sequential: all trials of one run, then the next.",
)
@click.option(
    "--blocks",
    type=click.IntRange(min=1, max=1000),
    help=f"lockstep: rounds of blocks in each pair of processes (default {DEFAULT_BLOCKS}; "
    f"{DEFAULT_UNTIL_BLOCKS} for an --until run, which re-chooses them after three pairs).",
)
@click.option(
    "--block-time",
    metavar="DURATION",
    help=f"lockstep: how long a block runs, in whole steps (default {DEFAULT_BLOCK_S:g}s); "
    f"--time or --timed-steps instead give a side's timed phase per pair.",
)
@click.option(
    "--when-busy",
    type=click.Choice(["wait", "go"]),
    help="lockstep: when other processes take over 10% of the CPUs, wait for quiet (default) "
    "or run on; either way no verdict rests on a busy block.",
)
@click.option(
    "--until-decided", metavar="TOLERANCE", help="Add rounds until every comparison is within/outside this tolerance, e.g. 3%."
)
@click.option(
    "--until-halfwidth",
    metavar="FRACTION",
    help="Add rounds until every ratio's 95%% interval is this narrow on each side, e.g. 1%.",
)
@click.option(
    "--max-time", metavar="DURATION", help="Start no trial after this long, e.g. 300, 90s, 5m (default with --until-*: 10m)."
)
@click.option("--quiet", "-q", is_flag=True, help="No progress and no table: only the results file's path.")
@click.option("--json", "as_json", is_flag=True, help="Print the results document (JSON) on stdout; progress on stderr.")
@wide_option
@click.option(
    "--python",
    "pythons",
    multiple=True,
    metavar="PLUGIN=PATH",
    help="Run this plugin's workers with a Python you made (repeatable).",
)
@click.option(
    "--env",
    "env_matrix",
    multiple=True,
    metavar="REQUIREMENTS",
    help="Run every selected backend in an environment with these comma-separated requirements "
    "added, e.g. 'framework==2.20.*,its-addon==2.20.*'; repeat for a version matrix.",
)
@click.option("--no-create-env", is_flag=True, help="Never make a worker environment: a missing one is unavailable.")
@click.option(
    "--peak",
    "measure_peak",
    is_flag=True,
    help="First measure each framework's matrix-product peak here (as accelbench peak), so the records "
    "carry utilisation against it.",
)
@click.option("--slurm", is_flag=True, help="Run as one Slurm job: sbatch, follow it, merge its ranks' files.")
@slurm_options(for_run=True)
@price_options
def run(
    plugin_names: tuple[str, ...],
    backend_names: tuple[str, ...],
    config_file: str | None,
    options: tuple[str, ...],
    output: str | None,
    force: bool,
    levers: tuple[str, ...],
    schedule_kind: str | None,
    blocks: int | None,
    block_time: str | None,
    when_busy: str | None,
    until_decided: str | None,
    until_halfwidth: str | None,
    max_time: str | None,
    quiet: bool,
    as_json: bool,
    wide: bool,
    pythons: tuple[str, ...],
    env_matrix: tuple[str, ...],
    no_create_env: bool,
    measure_peak: bool,
    slurm: bool,
    nodes: int | None,
    tasks_per_node: int,
    partition: str | None,
    account: str | None,
    slurm_time: str | None,
    job_dir: str | None,
    prices: str | None,
    price: str | None,
    price_per_hour: float | None,
    price_per_kwh: float | None,
    epochs: int,
    **flags: Any,
) -> None:
    """Run the selected backends (default: every available one) and write a results file."""
    from accelbench.analysis import cost
    from accelbench.cli.console import ResultsTable
    from accelbench.environments import python_envs as envs
    from accelbench.execution import runner
    from accelbench.execution.schedule import UNTIL_TRIAL_TIME_S

    config = run_config(config_file, {**flags, "levers": levers}, options)
    refs = selected(plugin_names, backend_names)
    paths, matrix = python_paths(pythons), [envs.parse_requirements(e) for e in env_matrix]
    plans = runner.plan(refs, config, paths, matrix)
    runnable = sum(p.precheck is None for p in plans)
    kind = schedule_kind or _default_schedule(plans, config)
    schedule = _schedule(kind, config, until_decided, until_halfwidth, max_time, blocks, block_time, when_busy)
    if schedule.until and kind == "interleaved" and config.time_s is None and config.timed_steps is None and config.workers == 1:
        plans = runner.plan(refs, config.replace(time_s=UNTIL_TRIAL_TIME_S), paths, matrix)
    if schedule.until and runnable < 2:
        raise UsageError("--until-decided/--until-halfwidth compare runs: select at least two that can run here")
    pricing = cost.Pricing.from_flags(prices, price, price_per_hour, epochs, price_per_kwh)
    path = Path(output or f"results/accelbench-{datetime.now():%Y%m%d-%H%M%S}.json")
    job = _slurm_job(slurm, plans, path, nodes, tasks_per_node, partition, account, slurm_time, job_dir)
    inputs.check_output(path, force)  # the last check: after it, workers start
    if job:
        _run_slurm_job(job, plans[0], config, path, force)
        return
    view = View(quiet=quiet, as_json=as_json, wide=wide)
    if measure_peak:
        _measure_peaks(plans, view)
    done = execute(plans, path, pricing, ResultsTable, schedule, view, force, create_envs=not no_create_env)
    if (schedule.until or schedule.kind == "lockstep") and view.tables:
        _print_comparison(done, schedule.until.tolerance if schedule.until else None, wide)


def _slurm_job(
    slurm: bool,
    plans: list[Plan],
    path: Path,
    nodes: int | None,
    tasks_per_node: int,
    partition: str | None,
    account: str | None,
    time_limit: str | None,
    job_dir: str | None,
) -> JobSpec | None:
    """``--slurm``'s job, checked before anything is submitted (None without --slurm)."""
    from accelbench.execution import slurm_jobs

    if not slurm:
        given = next((f for f, v in (("--nodes", nodes), ("--partition", partition), ("--account", account),
                                     ("--slurm-time", time_limit), ("--job-dir", job_dir)) if v), None)  # fmt: skip
        if given:
            raise UsageError(f"{given} is for a Slurm job: give it with --slurm")
        return None
    if nodes is None:
        raise UsageError("--slurm needs --nodes N")
    if len(plans) != 1:
        raise UsageError(f"--slurm runs one backend as one job; {len(plans)} runs are selected: pick one with --backend")
    if plans[0].precheck:
        raise UsageError(plans[0].precheck.reason)
    if plans[0].ref.backend.engine is None:
        raise UsageError(f"--slurm: {plans[0].ref.id} has no multi-worker engine")
    slurm_jobs.require_slurm("--slurm")
    folder = Path(job_dir) if job_dir else path.with_name(f"{path.stem}.slurm-{datetime.now():%Y%m%d-%H%M%S}")
    inputs.check_writable_folder(folder, "--job-dir")
    return slurm_jobs.JobSpec(plans[0].ref.id, nodes, tasks_per_node, folder, partition, account, time_limit)


def _run_slurm_job(job: JobSpec, plan: Plan, config: RunConfig, path: Path, force: bool) -> None:
    """Submit, follow, merge, write: the job's record, failed with Slurm's reason if it failed.
    The tasks get the config as given (each resolves it for the job's size), not this host's plan;
    a job that left no rank's record is recorded with the plan's."""
    from accelbench.execution import slurm_jobs
    from accelbench.records import results as records

    slurm_jobs.write_config(job, config)
    try:
        job_id = slurm_jobs.submit(job)
    except RuntimeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"Slurm job {job_id}: {job.nodes} node(s) x {job.tasks_per_node} task(s), files in {job.folder}", err=True)
    end = slurm_jobs.follow(job_id, config.timeout_s + 600)
    record = slurm_jobs.collect(job, end, plan.ref, plan.config)
    written = records.ResultsWriter(path, ["accelbench", *sys.argv[1:]], force).write([record])
    click.echo(f"{end.describe()}: {record.status} {record.reason}".strip())
    click.echo(f"results: {written}", err=True)
    sys.exit(0 if record.ok else 1)


@cli.command()
@click.argument("results", type=click.Path(dir_okay=False))
@click.option(
    "--record",
    "record_ids",
    multiple=True,
    metavar="HASH",
    help="Only the record whose config hash starts with HASH (repeatable; default every record).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    help="Results file of the rerun (default results/accelbench-rerun-<time>.json).",
)
@force_option
@click.option("--tolerance", default="3%", show_default=True, help="Equivalence bound of then against now.")
@click.option("--no-create-env", is_flag=True, help="Never make a worker environment: a missing one is unavailable.")
@wide_option
def rerun(
    results: str,
    record_ids: tuple[str, ...],
    output: str | None,
    force: bool,
    tolerance: str,
    no_create_env: bool,
    wide: bool,
) -> None:
    """Run a results file's records again here, with the same configurations and framework
    versions, and compare then with now (unpaired: two invocations, perhaps two machines)."""
    from accelbench.analysis import compare as comparing
    from accelbench.analysis import cost
    from accelbench.cli.console import ResultsTable
    from accelbench.environments import machine as environment
    from accelbench.execution import runner
    from accelbench.execution.schedule import Schedule
    from accelbench.planning import inputs, replay
    from accelbench.records import results as records

    bound = comparing.parse_tolerance(tolerance)
    replays = [replay.replay_of(r) for r in replay.select(records.read_results(results), record_ids)]
    plans = []
    for item in replays:
        plans += runner.plan(selected((), (item.backend_id,)), item.config, {}, [item.pins] if item.pins else [])
    path = Path(output or f"results/accelbench-rerun-{datetime.now():%Y%m%d-%H%M%S}.json")
    inputs.check_output(path, force)
    schedule = Schedule(rounds=max(p.config.trials for p in plans))
    done = execute(
        plans,
        path,
        cost.Pricing(cost.load_catalogue()),
        ResultsTable,
        schedule,
        View(wide=wide),
        force,
        create_envs=not no_create_env,
        exit_on_failure=False,
    )
    _print_then_and_now(replays, done, bound, environment.collect(), wide)
    sys.exit(1 if failed(done) else 0)


def _print_then_and_now(replays: list[Replay], done: list[Record], bound: float, here: Environment, wide: bool) -> None:
    """Then against now per record (its config hash, the pins it ran with, the comparison), then
    what differs in the machine and in the lock of the Python the workers ran."""
    from accelbench.analysis import compare as comparing
    from accelbench.cli.console import ComparisonTable, console, plain
    from accelbench.planning import replay

    out, results = console(), []
    for item, now in zip(replays, done):
        same = "the same config hash" if now.config_hash == item.record.config_hash else "ANOTHER config hash"
        pins = f", pinned {', '.join(item.pins)}" if item.pins else ""
        out.print(plain(("rerun", "cyan"), f" {item.backend_id}: {same}{pins}"))
        results += comparing.comparisons(
            [comparing.Run(f"{item.backend_id} then", item.record), comparing.Run(f"{item.backend_id} now", now)], bound
        )
        for line in replay.lock_differences(replay.lock_of(item.record), replay.lock_of(now))[:20]:
            out.print(plain(("lock", "yellow"), f" {line}"))
    if results:
        ComparisonTable(results, bound, wide=wide).print(out)
    out.print(plain(("note", "cyan"), " then and now are two invocations: unpaired trials, and the machine may differ"))
    # each record carries its machine: a sweep's records name the same differences once
    differences = dict.fromkeys(line for item in replays for line in replay.machine_differences(item.record.environment, here))
    for line in differences:
        out.print(plain(("machine", "yellow"), f" {line}"))


def _default_schedule(plans: list[Plan], config: RunConfig) -> str:
    """Lockstep whenever two or more single-worker benchmark runs on the CPU can run; interleaved
    for multi-worker and train runs (their phases are not blocks of steps), for a single run, and
    on accelerators: warm workers of several frameworks share one device there, and a framework
    that reserves most of its memory up front would starve the others (``--schedule lockstep``
    still asks for it)."""
    runnable = [p for p in plans if p.precheck is None]
    if len(runnable) >= 2 and config.workers == 1 and config.mode != "train" and all(p.config.device == "cpu" for p in runnable):
        return "lockstep"
    return "interleaved"


def _schedule(
    kind: str,
    config: RunConfig,
    until_decided: str | None,
    until_halfwidth: str | None,
    max_time: str | None,
    blocks: int | None = None,
    block_time: str | None = None,
    when_busy: str | None = None,
) -> Schedule:
    from accelbench.execution.schedule import Schedule, StopRule, parse_duration, parse_fraction

    if until_decided and until_halfwidth:
        raise UsageError("give one of --until-decided and --until-halfwidth")
    until = None
    if until_decided:
        until = StopRule(tolerance=parse_fraction(until_decided, "--until-decided"))
    elif until_halfwidth:
        until = StopRule(half_width=parse_fraction(until_halfwidth, "--until-halfwidth"))
    budget = parse_duration(max_time, "--max-time") if max_time else None
    lockstep_flags = [
        name
        for name, given in (("--blocks", blocks), ("--block-time", block_time), ("--when-busy", when_busy))
        if given is not None
    ]
    if kind != "lockstep":
        if lockstep_flags:
            raise UsageError(f"{lockstep_flags[0]} is a lockstep setting: the schedule here is {kind}")
        return Schedule(kind=kind, rounds=config.trials, until=until, max_time_s=budget)
    if config.workers > 1:
        raise UsageError("--schedule lockstep compares single-worker runs: give --schedule interleaved with --workers > 1")
    if config.mode == "train":
        raise UsageError("--schedule lockstep times blocks of steps: train mode runs epochs (give --schedule interleaved)")
    if block_time is not None and (config.time_s is not None or config.timed_steps is not None):
        raise UsageError("give one of --block-time and --time/--timed-steps (which lockstep splits into its blocks)")
    block_s = (
        parse_duration(block_time, "--block-time")
        if block_time
        else (config.time_s / (blocks or DEFAULT_BLOCKS) if config.time_s is not None else DEFAULT_BLOCK_S)
    )
    return Schedule(
        kind=kind,
        rounds=config.trials,
        until=until,
        max_time_s=budget,
        blocks=blocks or (DEFAULT_UNTIL_BLOCKS if until is not None else DEFAULT_BLOCKS),
        block_s=block_s,
        when_busy=when_busy or "wait",
        adapt_blocks=until is not None and blocks is None,
    )


def _print_comparison(done: list[Record], tolerance: float | None, wide: bool = False) -> None:
    from accelbench.analysis import compare as comparing
    from accelbench.cli.console import ComparisonTable

    results = comparing.comparisons(comparing.runs_of(done), tolerance)
    if results:
        ComparisonTable(results, tolerance, wide=wide).print()
    stop = next((r.schedule.stop_reason for r in done if r.schedule), "")
    click.echo(f"stopped: {stop}")


def execute(
    plans: list[Plan],
    path: Path,
    pricing: Pricing,
    table: type[ResultsTable],
    schedule: Schedule | None = None,
    view: View = View(),
    force: bool = False,
    create_envs: bool = True,
    exit_on_failure: bool = True,
    finish: Callable[[list[Record]], list[Record]] | None = None,
) -> list[Record]:
    """Run the plans, pricing the records and merging them into the results file after every trial
    (so an interruption keeps every finished one, and the records other runs put there stay;
    ``force``: the file is started afresh); ``finish`` adds to the finished records what needs
    them all (train mode's MLPerf logs), written once more; print ``table``; exit 1 when a run
    failed."""
    from accelbench.cli.console import run_observer
    from accelbench.execution import lockstep, runner
    from accelbench.records import results as records

    done: list[Record] = []
    # merges with whatever is in the file when it writes: other runs may be writing it too
    writer = records.ResultsWriter(path, ["accelbench", *sys.argv[1:]], force)

    def keep(snapshot: list[Record]) -> None:
        for record in snapshot:
            pricing.price(record)
        writer.write(snapshot)
        done[:] = snapshot

    total = None if schedule and schedule.until else sum(p.config.trials for p in plans)
    observer = run_observer(total, view.quiet, view.live_stream)
    executor = lockstep.execute if schedule and schedule.kind == "lockstep" else runner.execute
    try:
        with observer:
            executor(plans, keep, observer, schedule, create_envs)
    except KeyboardInterrupt as stop:
        saved = (
            f"kept {len(done)} finished record(s), with every finished trial, in {writer.side_path or path}"
            if done
            else "no trial had finished, nothing written"
        )
        click.echo(f"{getattr(stop, 'signal_name', 'interrupted')}: {saved}", err=True)
        sys.exit(getattr(stop, "exit_code", 130))
    if finish and done:
        keep(finish(done))
    if view.tables:
        table(done, wide=view.wide).print()
    if view.as_json:
        click.echo(json.dumps(records.results_document(done).to_json(), indent=1))
    click.echo(f"results: {writer.side_path or path}", err=view.as_json)
    if exit_on_failure and failed(done):
        sys.exit(1)
    return done


def failed(done: list[Record]) -> bool:
    return any(r.status in ("failed", "timeout") for r in done)


@cli.command()
@click.option("--plugin", "plugin_names", multiple=True, help="Only these plugins (repeatable).")
@click.option("--backend", "backend_names", multiple=True, help="Only these backends, plugin:backend (repeatable).")
@click.option("--precision", "precisions", multiple=True, help="Only these precisions (default: each the backend offers).")
@click.option("--device", default="auto", show_default=True, help="Device kind to measure (auto: the best present).")
@click.option("--size", type=click.IntRange(min=64), help="Matrix side (default 2048 on a CPU, 8192 on an accelerator).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Timed runs; the best counts.")
@click.option("--threads", type=click.IntRange(min=1), help="Threads (default all cores).")
def peak(
    plugin_names: tuple[str, ...],
    backend_names: tuple[str, ...],
    precisions: tuple[str, ...],
    device: str,
    size: int | None,
    repeats: int,
    threads: int | None,
) -> None:
    """Measure each framework's matrix-product peak on this machine, per precision, and cache it:
    later records carry flops.peak_per_sec and utilisation against it."""
    from accelbench.analysis import peaks
    from accelbench.cli.console import PeakTable
    from accelbench.execution import matmul_peak as peak_measure

    refs = peak_measure.per_framework(selected(plugin_names, backend_names))
    if not refs:
        raise UsageError("--plugin/--backend: no selected backend measures a peak (Backend.prepare_matmul)")
    outcomes = []
    with PeakTable() as table:
        for ref in refs:
            for precision in precisions or ref.backend.describe().precisions:
                outcome = peak_measure.measure(ref, precision, device, size, repeats, threads)
                table.add(outcome)
                outcomes.append(outcome)
    measured = [o.measurement for o in outcomes if o.measurement]
    if measured:
        click.echo(f"cached: {peaks.save_measured(measured)}")
    sys.exit(0 if measured else 1)


def _measure_peaks(plans: list[Plan], view: View) -> None:
    """``run --peak``: each framework's peak for the plans' precisions and devices, cached before
    the runs (whose records then read it); a peak that cannot be measured leaves its reason."""
    from accelbench.analysis import peaks
    from accelbench.cli.console import PeakTable, console
    from accelbench.execution import matmul_peak as peak_measure

    wanted = peak_measure.for_plans(plans)
    if not wanted:
        click.echo("--peak: no selected backend measures a peak (Backend.prepare_matmul)", err=True)
        return
    outcomes = []
    with PeakTable(console(stderr=True) if view.as_json or view.quiet else None) as table:
        for ref, precision, device, threads in wanted:
            outcomes.append(peak_measure.measure(ref, precision, device, threads=threads))
            table.add(outcomes[-1])
    measured = [o.measurement for o in outcomes if o.measurement]
    if measured:
        peaks.save_measured(measured)
