"""The ``accelbench`` command. Heavy modules (numpy, rich, jsonschema) load inside commands."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO, TypeVar

import click

from .config import parse_option
from .errors import UsageError
from .inputs import FINITE, TIMEOUT
from .schedule import DEFAULT_BLOCK_S, DEFAULT_BLOCKS, DEFAULT_UNTIL_BLOCKS
from .training import TrainSpec  # its fields declare train's recipe options

if TYPE_CHECKING:
    from types import FrameType

    from .blocks import Environment
    from .config import RunConfig
    from .console import ResultsTable
    from .cost import Pricing
    from .planning import Plan
    from .records import Record
    from .registry import BackendRef
    from .replay import Replay
    from .schedule import Schedule

#: a click command (or the function it is made from): what the option decorators take and give
Command = TypeVar("Command", bound=Callable[..., Any])

#: RunConfig fields ``run`` adds to the shared options (``worker`` has its own --workers)
RUN_ONLY_FIELDS = ("workers", "scaling_baseline")


def field_options(
    names: tuple[str, ...] | None = None,
    exclude: tuple[str, ...] = (),
    help: dict[str, str] | None = None,
    declared: type | None = None,
) -> Callable[[Command], Command]:
    """Click options made from the fields' own declarations (``config.Flag``) of ``declared``
    (default RunConfig; train mode's TrainSpec too): the option's name, type and help are written
    once, on the field. Each option's value arrives under the field's name; None when the user did
    not give it (the config file's, or the default, then stands)."""
    decorators = []
    for spec_field in _flagged(declared):
        spec = spec_field.metadata["flag"]
        if spec_field.name in exclude or (names is not None and spec_field.name not in names):
            continue
        option = "--" + (spec.name or spec_field.name).replace("_", "-")
        text = (help or {}).get(spec_field.name, spec.help)
        if spec.kind == "bool":
            decorators.append(click.option(f"{option}/--no-{option[2:]}", spec_field.name, default=None, help=text))
            continue
        kind = {
            "int": int,
            "finite": FINITE,
            "timeout": TIMEOUT,
            "int_list": str,
            "str": click.Choice(spec.choices) if spec.choices else str,
        }[spec.kind]
        decorators.append(click.option(option, spec_field.name, type=kind, help=text))

    def apply(command: Command) -> Command:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


def flagged_fields(declared: type | None = None) -> list[str]:
    """The fields of ``declared`` (default RunConfig) that have a command-line option."""
    return [f.name for f in _flagged(declared)]


def _flagged(declared: type | None) -> list[dataclasses.Field[Any]]:
    from .config import RunConfig

    return [f for f in dataclasses.fields(declared or RunConfig) if "flag" in f.metadata]


def price_options(command: Command) -> Command:
    """Pricing flags shared by run and report."""
    for option in reversed(
        [
            click.option(
                "--prices",
                type=click.Path(dir_okay=False),
                help="Price catalogue JSON adding to/overriding the shipped 2018 one.",
            ),
            click.option("--price", help="Price every run at this catalogue entry (e.g. p3.8xlarge)."),
            click.option("--price-per-hour", type=FINITE, help="Price every run at this hourly price (your own hardware)."),
            click.option(
                "--price-per-kwh",
                type=FINITE,
                help="Price the measured energy at this much per kWh (owned hardware: the cost block's energy).",
            ),
            click.option(
                "--epochs", type=click.IntRange(min=1), default=90, show_default=True, help="Epochs for the cost-to-train figure."
            ),
        ]
    ):
        command = option(command)
    return command


def config_options(command: Command) -> Command:
    """Run-config flags shared by run and worker (each overrides the config file)."""
    command = field_options(exclude=RUN_ONLY_FIELDS)(command)
    for option in reversed(
        [
            click.option("--plugin", "plugin_names", multiple=True, help="Run this plugin's backends (repeatable)."),
            click.option("--backend", "backend_names", multiple=True, help="Run this backend, by name or plugin:name."),
            click.option("--config", "config_file", type=click.Path(dir_okay=False), help="JSON or TOML run config."),
            click.option(
                "--time",
                "time_box",
                metavar="DURATION",
                help="Time whole steps for this long per run, e.g. 45s, 2m (default 45s; counted for --workers > 1).",
            ),
            click.option(
                "--protocol",
                type=click.Choice(["tf_cnn"]),
                help="tf_cnn: tf_cnn_benchmarks' counts, 10 fixed warm-up + 100 timed steps (flags still override).",
            ),
            click.option("--option", "options", multiple=True, help="Backend option KEY=VALUE (repeatable)."),
        ]
    ):
        command = option(command)
    return command


@click.group()
@click.version_option(package_name="accelbench")
def cli() -> None:
    """Benchmark deep-learning training across frameworks and devices."""


@cli.command()
def plugins() -> None:
    """List plugins and their backends as JSON (no framework is imported)."""
    from .registry import PluginHost

    host = PluginHost()
    backends = host.backends()
    listing = []
    for plugin in host.plugins():
        entries = []
        for ref in (r for r in backends if r.plugin.name == plugin.name):
            reason = ref.unavailable_reason()
            engine = ref.backend.engine
            entries.append(
                {
                    "id": ref.id,
                    **ref.backend.describe().to_json(),
                    "engine": engine.name if engine else None,
                    "available": reason is None,
                    "reason": reason or "",
                }
            )
        listing.append(
            {"name": plugin.name, "version": plugin.version, "module": plugin.module, "error": plugin.error, "backends": entries}
        )
    click.echo(json.dumps(listing, indent=2))


@cli.command()
@config_options
@field_options(RUN_ONLY_FIELDS)
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Results file (default results/accelbench-<time>.json).")
@click.option("--force", is_flag=True, help="Replace an existing results file instead of appending to it.")
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
@click.option(
    "--wide",
    is_flag=True,
    help="Every column in the tables, however narrow the terminal (otherwise the "
    "columns beyond backend, status, figures and verdict fold under their row when they do not fit).",
)
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
    prices: str | None,
    price: str | None,
    price_per_hour: float | None,
    price_per_kwh: float | None,
    epochs: int,
    **flags: Any,
) -> None:
    """Run the selected backends (default: every available one) and write a results file."""
    from . import cost, envs, inputs, runner
    from .console import ResultsTable
    from .schedule import UNTIL_TRIAL_TIME_S

    config = _run_config(config_file, {**flags, "levers": levers}, options)
    refs = _selected(plugin_names, backend_names)
    plans = runner.plan(refs, config, _pythons(pythons), [envs.parse_requirements(e) for e in env_matrix])
    runnable = sum(p.precheck is None for p in plans)
    kind = schedule_kind or _default_schedule(plans, config)
    schedule = _schedule(kind, config, until_decided, until_halfwidth, max_time, blocks, block_time, when_busy)
    if schedule.until and kind == "interleaved" and config.time_s is None and config.timed_steps is None and config.workers == 1:
        plans = runner.plan(
            refs, config.replace(time_s=UNTIL_TRIAL_TIME_S), _pythons(pythons), [envs.parse_requirements(e) for e in env_matrix]
        )
    if schedule.until and runnable < 2:
        raise UsageError("--until-decided/--until-halfwidth compare runs: select at least two that can run here")
    pricing = cost.Pricing.from_flags(prices, price, price_per_hour, epochs, price_per_kwh)
    path = Path(output or f"results/accelbench-{datetime.now():%Y%m%d-%H%M%S}.json")
    inputs.check_output(path, force)  # the last check: after it, workers start
    view = _View(quiet=quiet, as_json=as_json, wide=wide)
    if measure_peak:
        _measure_peaks(plans, view)
    done = _execute(plans, path, pricing, ResultsTable, schedule, view, force, create_envs=not no_create_env)
    if (schedule.until or schedule.kind == "lockstep") and view.tables:
        _print_comparison(done, schedule.until.tolerance if schedule.until else None, wide)


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
@click.option("--force", is_flag=True, help="Replace an existing results file instead of appending to it.")
@click.option("--tolerance", default="3%", show_default=True, help="Equivalence bound of then against now.")
@click.option("--no-create-env", is_flag=True, help="Never make a worker environment: a missing one is unavailable.")
@click.option("--wide", is_flag=True, help="Every column in the tables, however narrow the terminal.")
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
    from . import compare as comparing
    from . import cost, environment, inputs, records, replay, runner
    from .console import ResultsTable
    from .schedule import Schedule

    bound = comparing.parse_tolerance(tolerance)
    replays = [replay.replay_of(r) for r in replay.select(records.read_results(results), record_ids)]
    plans = []
    for item in replays:
        plans += runner.plan(_selected((), (item.backend_id,)), item.config, {}, [item.pins] if item.pins else [])
    path = Path(output or f"results/accelbench-rerun-{datetime.now():%Y%m%d-%H%M%S}.json")
    inputs.check_output(path, force)
    schedule = Schedule(rounds=max(p.config.trials for p in plans))
    done = _execute(
        plans,
        path,
        cost.Pricing(cost.load_catalogue()),
        ResultsTable,
        schedule,
        _View(wide=wide),
        force,
        create_envs=not no_create_env,
        exit_on_failure=False,
    )
    _print_then_and_now(replays, done, bound, environment.collect(), wide)
    sys.exit(1 if _failed(done) else 0)


def _print_then_and_now(replays: list[Replay], done: list[Record], bound: float, here: Environment, wide: bool) -> None:
    """Then against now per record (its config hash, the pins it ran with, the comparison), then
    what differs in the machine and in the lock of the Python the workers ran."""
    from . import compare as comparing
    from . import replay
    from .console import ComparisonTable, console, plain

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
    from .schedule import Schedule, StopRule, parse_duration, parse_fraction

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
    from . import compare as comparing
    from .console import ComparisonTable

    results = comparing.comparisons(comparing.runs_of(done), tolerance)
    if results:
        ComparisonTable(results, tolerance, wide=wide).print()
    stop = next((r.schedule.stop_reason for r in done if r.schedule), "")
    click.echo(f"stopped: {stop}")


@dataclass(frozen=True)
class _View:
    """What the terminal gets: ``quiet`` only the results path; ``as_json`` the results document
    on stdout (so the live lines go to stderr)."""

    quiet: bool = False
    as_json: bool = False
    #: every table column, whatever the terminal's width
    wide: bool = False

    @property
    def tables(self) -> bool:
        return not (self.quiet or self.as_json)

    @property
    def live_stream(self) -> TextIO:
        return sys.stderr if self.as_json else sys.stdout


def _pythons(given: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for text in given:
        plugin, sep, path = text.partition("=")
        if not sep or not plugin or not path:
            raise UsageError(f"--python must be PLUGIN=PATH, got {text!r}")
        if not Path(path).is_file() or not os.access(path, os.X_OK):
            raise UsageError(f"--python {plugin}={path}: not an executable file")
        found[plugin] = path
    return found


def _execute(
    plans: list[Plan],
    path: Path,
    pricing: Pricing,
    table: type[ResultsTable],
    schedule: Schedule | None = None,
    view: _View = _View(),
    force: bool = False,
    create_envs: bool = True,
    exit_on_failure: bool = True,
) -> list[Record]:
    """Run the plans, pricing the records and merging them into the results file after every trial
    (so an interruption keeps every finished one, and the records other runs put there stay;
    ``force``: the file is started afresh); print ``table``; exit 1 when a run failed."""
    from . import lockstep, records, runner
    from .console import run_observer

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
    if view.tables:
        table(done, wide=view.wide).print()
    if view.as_json:
        click.echo(json.dumps(records.results_document(done).to_json(), indent=1))
    click.echo(f"results: {writer.side_path or path}", err=view.as_json)
    if exit_on_failure and _failed(done):
        sys.exit(1)
    return done


def _failed(done: list[Record]) -> bool:
    return any(r.status in ("failed", "timeout") for r in done)


@cli.command()
@config_options
@click.option(
    "--rank",
    type=int,
    required=True,
    help="This worker's rank, 0..workers-1 (with --local-workers N: the first of the N ranks this host runs).",
)
@click.option("--workers", type=int, required=True, help="Workers in the job, across every host.")
@click.option(
    "--local-workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Ranks this host runs, --rank and the ones after it: one per device, as a launcher's nproc-per-node.",
)
@click.option(
    "--coordinator", required=True, help="HOST:PORT of the job's coordinator (a scheduler rank 0 starts, for engines with one)."
)
@click.option("--peers", help="Every worker's HOST:PORT, comma-separated, in rank order (engines that need it).")
@click.option("--host", "node_host", help="This host's address as the other hosts reach it (engines that need it).")
@click.option(
    "--servers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Service processes (e.g. parameter servers) rank 0 starts, for engines with them.",
)
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), help="This rank's results file.")
def worker(
    rank: int,
    local_workers: int,
    coordinator: str,
    peers: str | None,
    node_host: str | None,
    servers: int,
    plugin_names: tuple[str, ...],
    backend_names: tuple[str, ...],
    config_file: str | None,
    options: tuple[str, ...],
    output: str,
    **flags: Any,
) -> None:
    """Run the ranks one host holds in a multi-host job; a cluster scheduler starts one per host."""
    from . import distributed, launch, records, runner

    config = _run_config(config_file, {**flags, "scaling_baseline": False}, options)
    refs = _selected(plugin_names, backend_names)
    if len(refs) != 1:
        raise UsageError(f"a worker runs exactly one backend; selected {len(refs)}")
    [item] = runner.plan(refs, config)
    if item.precheck:
        raise UsageError(item.precheck.reason)
    _endpoint(coordinator, "--coordinator")
    peer_list = tuple(peers.split(",")) if peers else ()
    if peer_list and len(peer_list) != config.workers:
        raise UsageError(f"--peers names {len(peer_list)} workers but --workers is {config.workers}: one HOST:PORT a rank")
    for peer in peer_list:
        _endpoint(peer, "--peers")
    cluster = launch.ClusterRank(rank, config.workers, coordinator, peer_list, node_host, servers, local_workers=local_workers)
    engine = refs[0].backend.engine
    if engine is None:  # planning refuses it for --workers > 1; a job of one worker needs an engine all the same
        raise UsageError(f"{refs[0].id} has no multi-worker engine: `accelbench worker` runs a rank of a multi-host job")
    plan = launch.plan_host(engine, cluster)
    record = distributed.run_rank(refs[0], item.config, plan, rank)
    records.write_results(Path(output), [record])
    ranks = f"rank {rank}" if local_workers == 1 else f"ranks {rank}-{rank + local_workers - 1}"
    click.echo(f"{ranks}: {record.status} {record.reason}".strip())
    sys.exit(0 if record.ok else 1)


@cli.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), help="Merged results file.")
def merge(files: tuple[str, ...], output: str) -> None:
    """Merge the per-rank results files of one multi-host job into one record."""
    from . import records

    merged = records.merge_ranks([r for name in files for r in records.read_results(name)])
    records.write_results(Path(output), [merged])
    click.echo(f"merged {len(merged.distributed.per_worker) if merged.distributed else 0} workers: {merged.status} -> {output}")


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
    from . import peak_measure, peaks
    from .console import PeakTable

    refs = peak_measure.per_framework(_selected(plugin_names, backend_names))
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


def _measure_peaks(plans: list[Plan], view: _View) -> None:
    """``run --peak``: each framework's peak for the plans' precisions and devices, cached before
    the runs (whose records then read it); a peak that cannot be measured leaves its reason."""
    from . import peak_measure, peaks
    from .console import PeakTable, console

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


@cli.group()
def env() -> None:
    """Worker environments: one per distinct requirement set, made on first use and cached."""


@env.command("create")
@click.option(
    "--plugin", "plugin_names", multiple=True, help="Only these plugins (default: every one that declares an environment)."
)
@click.option("--env", "env_matrix", multiple=True, metavar="REQUIREMENTS", help="Requirements added (as accelbench run --env).")
def env_create(plugin_names: tuple[str, ...], env_matrix: tuple[str, ...]) -> None:
    """Make the environments the selected plugins' backends run in."""
    from . import envs
    from .registry import PluginHost

    matrix = [envs.parse_requirements(e) for e in env_matrix]
    refs = PluginHost().select(plugin_names)
    wanted = {s.spec for r in refs for s in envs.setups_for(r, {}, matrix) if s.spec is not None}
    if not wanted:
        raise UsageError("no selected backend declares an environment (give --env to make one)")
    failed = 0
    for spec in wanted:
        env = envs.for_spec(spec)
        try:
            envs.ensure(env, True, lambda text: click.echo(text, err=True))
            click.echo(f"{env.path}: {', '.join(spec.requirements)}")
        except envs.EnvironmentNotMade as exc:
            failed += 1
            click.echo(f"error: {exc}", err=True)
    sys.exit(1 if failed else 0)


@env.command("list")
def env_list() -> None:
    """The cached environments: path, Python, requirements, size."""
    from . import envs

    for entry in envs.listing():
        installed = ", ".join(f"{name} {version}" for name, version in entry["installed"].items())
        serves = f"  plugin {entry['plugin']}" if entry["plugin"] else ""
        click.echo(
            f"{entry['path']}  python {entry['python']}  {entry['size_mb']} MB  "
            f"{', '.join(entry['requirements']) or '-'}{serves}  [{installed or 'versions not recorded'}]"
        )


@env.command("remove")
@click.argument("keys", nargs=-1)
def env_remove(keys: tuple[str, ...]) -> None:
    """Delete cached environments (these keys, or every one)."""
    from . import envs

    for path in envs.remove(tuple(keys)):
        click.echo(f"removed {path}")


@cli.command("new-plugin")
@click.argument("name")
@click.option(
    "--framework",
    metavar="PKG",
    help="The distribution the plugin's framework comes from: the backend "
    "declares it as its worker environment (a Python of its own).",
)
@click.option("--dir", "folder", type=click.Path(file_okay=False), help="Where to write it (default ./accelbench-NAME).")
def new_plugin(name: str, framework: str | None, folder: str | None) -> None:
    """Write a minimal plugin distribution NAME to start from: pyproject.toml with the entry
    point, a backend, a contract test and a README; `pip install -e .` and `pytest` pass as it is."""
    from . import scaffold

    target = Path(folder or f"accelbench-{name.replace('_', '-')}")
    for path in scaffold.write(name, target, framework):
        click.echo(f"wrote {path}")
    click.echo(f"next: cd {target} && pip install -e '.[test]' && pytest && accelbench run --plugin {name}")


@cli.command()
@click.argument("files", nargs=-1, required=True)
def validate(files: tuple[str, ...]) -> None:
    """Validate results files against the schema, naming each wrong field."""
    from . import records, validation

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
@click.option(
    "--wide",
    is_flag=True,
    help="Every column in the tables, however narrow the terminal (otherwise the "
    "columns beyond backend, status, figures and verdict fold under their row when they do not fit).",
)
def compare(files: tuple[str, ...], tolerance: str | None, margin: str | None, as_json: bool, wide: bool) -> None:
    """Pair runs by config and report throughput ratios with 95% intervals.

    Exit code: 0 all within, ahead or not behind (or no bound given), 1 some outside or behind,
    3 some undecided.
    """
    from . import compare as comparing
    from .schedule import parse_fraction

    if tolerance and margin:
        raise UsageError("give one of --tolerance and --margin")
    bound = comparing.parse_tolerance(tolerance) if tolerance else None
    behind = parse_fraction(margin, "--margin") if margin else None
    results = comparing.compare(comparing.load_runs(list(files)), bound, margin=behind)
    if as_json:
        click.echo(comparing.to_json(results, bound, behind))
    else:
        from .console import ComparisonTable

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
@price_options
def report(
    files: tuple[str, ...],
    out_dir: str | None,
    reference: bool,
    tolerance: str,
    evidence: str | None,
    markdown: bool,
    prices: str | None,
    price: str | None,
    price_per_hour: float | None,
    price_per_kwh: float | None,
    epochs: int,
) -> None:
    """Write an HTML study report (throughput vs batch, images per dollar, every run) from results
    files, or with --evidence DIR --markdown print a folder of results files as Markdown tables."""
    from . import cost, records
    from . import report as reporting
    from .compare import parse_tolerance

    if evidence or markdown:
        if not (evidence and markdown) or files or out_dir:
            raise UsageError("--evidence: give it a folder with --markdown, and no FILES or --out")
        from . import evidence as evidence_files

        click.echo(evidence_files.markdown(evidence_files.load(evidence), evidence), nl=False)
        return
    if not files or not out_dir:
        raise UsageError("report: give results FILES and --out DIR (or --evidence DIR --markdown)")
    bound = parse_tolerance(tolerance)
    loaded = [r for name in files for r in records.read_results(name)]
    pricing = cost.Pricing.from_flags(prices, price, price_per_hour, epochs, price_per_kwh)
    page = reporting.write(loaded, out_dir, pricing, include_reference=reference, tolerance=bound)
    click.echo(f"report: {page}")


@cli.command()
@click.argument("source")
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--preset",
    type=click.Choice(["small", "imagenet"]),
    help="Training defaults for this dataset (default: small for digits, imagenet for a folder).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the digits' train/val split.")
def data(source: str, out: str, preset: str | None, seed: int) -> None:
    """Convert SOURCE into the dataset format of every installed backend that trains under OUT.

    SOURCE is 'digits' (scikit-learn's bundled handwritten digits, no download) or an image folder
    with train/<class>/* and val/<class>/* (ImageNet's layout). Every record is read back and
    checked against its source file; OUT/dataset.json is written last.
    """
    from . import conversion, datasets
    from .registry import PluginHost

    datasets.check_source(source)  # both before any framework's worker starts
    datasets.check_out(Path(out))
    try:
        manifest = conversion.convert_dataset(source, Path(out), PluginHost().backends(), preset, seed)
    except RuntimeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    counts = ", ".join(f"{split} {info['count']}" for split, info in manifest["splits"].items())
    click.echo(
        f"{manifest['name']}: {manifest['num_classes']} classes, {counts} images; "
        f"formats: {', '.join(manifest['formats'])} (verified) -> {out}"
    )


# the RunConfig fields train mode takes from its command line (the rest are the timing loop's)
TRAIN_RUN_FLAGS = (
    "model",
    "variant",
    "global_batch",
    "per_device_batch",
    "device",
    "device_count",
    "precision",
    "image_size",
    "threads",
    "seed",
    "memory_limit_mb",
)


@cli.command()
@click.option("--plugin", "plugin_names", multiple=True, help="Train this plugin's backends (repeatable).")
@click.option("--backend", "backend_names", multiple=True, help="Train this backend, by name or plugin:name.")
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False),
    help="A dataset converted by `accelbench data` (default: the embedded digits).",
)
@field_options(
    TRAIN_RUN_FLAGS,
    help={
        "model": "Model, as the backend names it (default: the dataset preset's).",
        "global_batch": "Global batch (default: the preset's, 64 digits / 256 ImageNet).",
        "image_size": "Square training image side (default: the dataset's, or 224).",
        "seed": "Random seed (initialisation, shuffling, augmentation).",
    },
)
@click.option("--timeout", type=TIMEOUT, default=24 * 3600.0, show_default=True, help="Seconds before a run is stopped.")
@field_options(declared=TrainSpec)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Results file (default results/accelbench-train-<time>.json)."
)
@click.option("--force", is_flag=True, help="Replace an existing results file instead of appending to it.")
@click.option(
    "--wide",
    is_flag=True,
    help="Every column in the tables, however narrow the terminal (otherwise the "
    "columns beyond backend, status, figures and verdict fold under their row when they do not fit).",
)
@price_options
def train(
    plugin_names: tuple[str, ...],
    backend_names: tuple[str, ...],
    data_dir: str | None,
    timeout: float,
    output: str | None,
    force: bool,
    wide: bool,
    prices: str | None,
    price: str | None,
    price_per_hour: float | None,
    price_per_kwh: float | None,
    epochs: int,
    **flags: Any,
) -> None:
    """Train to a target top-1 on a real dataset: accuracy curves, time and cost to accuracy."""
    from . import conversion, cost, datasets, inputs, runner
    from .config import RunConfig
    from .console import TrainingTable

    refs = _selected(plugin_names, backend_names, training=True)
    if isinstance(flags.get("decay_epochs"), str):
        flags["decay_epochs"] = _int_list(flags["decay_epochs"], "--decay-epochs")
    target = flags.get("target_top1")
    if target is not None and not 0 < target <= 1:
        raise UsageError(f"--target-top1 must be in (0, 1], got {target:g}")
    # everything the user gave is checked before the digits are converted (workers) or a run starts
    pricing = cost.Pricing.from_flags(prices, price, price_per_hour, epochs, price_per_kwh)
    path = Path(output or f"results/accelbench-train-{datetime.now():%Y%m%d-%H%M%S}.json")
    inputs.check_output(path, force)
    dataset = datasets.load(data_dir, what="--data") if data_dir is not None else datasets.load(conversion.default_dataset(refs))
    config = RunConfig.from_dict({**training_config(dataset, flags), "timeout_s": timeout})
    plans = runner.plan(refs, config)
    _execute(plans, path, pricing, TrainingTable, view=_View(wide=wide), force=force)


def training_config(dataset: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    from . import training

    return training.run_config_data(
        dataset, {k: flags.get(k) for k in TRAIN_RUN_FLAGS}, {k: flags.get(k) for k in flagged_fields(TrainSpec)}
    )


def _run_config(config_file: str | None, flags: dict[str, Any], options: tuple[str, ...]) -> RunConfig:
    from .config import TF_CNN_PROTOCOL, RunConfig, load_config_file, parse_lever
    from .schedule import parse_duration

    data: dict[str, Any] = load_config_file(config_file) if config_file else {}
    if flags.get("protocol") == "tf_cnn":
        data.update(TF_CNN_PROTOCOL)
        data.pop("time_s", None)
    if flags.get("time_box") is not None:
        data["time_s"] = parse_duration(flags["time_box"], "--time")
        data.pop("timed_steps", None)
    for name in flagged_fields():
        if flags.get(name) is not None:
            data[name] = flags[name]
    if isinstance(data.get("batch_sizes"), str):
        data["batch_sizes"] = _int_list(data["batch_sizes"], "--batch-sizes")
    if options:
        data["options"] = {**data.get("options", {}), **dict(map(parse_option, options))}
    if flags.get("levers"):
        data["levers"] = [parse_lever(text) for text in flags["levers"]]
    return RunConfig.from_dict(data)


def _endpoint(text: str, flag: str) -> None:
    """HOST:PORT with a host and a port in 1..65535, refused here rather than deep in an engine."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"{flag} {text!r}: give HOST:PORT with a port in 1..65535")


def _int_list(text: str, flag: str) -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    if "" in parts:  # "8,,16" or a trailing comma: an item lost in typing, never dropped silently
        raise UsageError(f"{flag} has an empty item in {text!r}: give comma-separated integers")
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {text!r}") from None


def _selected(plugin_names: tuple[str, ...], backend_names: tuple[str, ...], training: bool = False) -> list[BackendRef]:
    from .registry import PluginHost

    refs = PluginHost().select(plugin_names, backend_names)
    if plugin_names or backend_names:
        return refs  # asked for by name: an unavailable one still gets a record saying why
    available = [r for r in refs if r.unavailable_reason() is None and (not training or r.backend.describe().data_format)]
    if not available:
        raise UsageError(
            "no backend is available"
            + (" that trains" if training else "")
            + ": install a framework, e.g. pip install 'accelbench[all]'"
        )
    return available


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what Slurm, Kubernetes and systemd send): handled like Ctrl-C — workers
    and engine services stopped, finished records kept — and the exit code says which signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum
        self.signal_name = f"stopped by {signal.Signals(signum).name}"


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


def _one_line(text: str) -> str:
    """A refusal on one line, whatever it quotes: a value the user gave may hold a line break."""
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def main() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_stopped)
    try:
        cli.main(standalone_mode=False)
    except UsageError as exc:
        click.echo(f"error: {_one_line(str(exc))}", err=True)
        sys.exit(2)
    except click.UsageError as exc:  # bad flag or value: one line, like our own errors
        click.echo(f"error: {_one_line(exc.format_message())}", err=True)
        sys.exit(2)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        # only a path the user typed can be too long for the file system: a refusal, wherever it is met
        click.echo(f"error: {exc.filename!r}: {exc.strerror}", err=True)
        sys.exit(2)
    except click.exceptions.Abort as exc:
        click.echo(getattr(exc.__context__, "signal_name", "aborted"), err=True)
        sys.exit(getattr(exc.__context__, "exit_code", 130))
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
