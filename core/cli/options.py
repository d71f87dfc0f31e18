"""What the commands share: options made from the config fields' own declarations, the pricing
and run-config flags, and the checks of values that more than one command reads."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO, TypeVar

import click

from accelbench.errors import UsageError
from accelbench.planning.config import parse_option
from accelbench.planning.inputs import FINITE, TIMEOUT

if TYPE_CHECKING:
    from accelbench.planning.config import RunConfig
    from accelbench.registry import BackendRef


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
    from accelbench.planning.config import RunConfig

    return [f for f in dataclasses.fields(declared or RunConfig) if "flag" in f.metadata]


#: ``--wide``, for the commands that print tables
wide_option = click.option(
    "--wide",
    is_flag=True,
    help="Every column in the tables, however narrow the terminal (otherwise the "
    "columns beyond backend, status, figures and verdict fold under their row when they do not fit).",
)
#: ``--force``, for the commands that write a results file
force_option = click.option("--force", is_flag=True, help="Replace an existing results file instead of appending to it.")


def slurm_options(for_run: bool) -> Callable[[Command], Command]:
    """A Slurm job's shape, declared once for ``run --slurm`` (where each is optional and says it
    is for --slurm) and ``slurm-script`` (where --nodes and --job-dir are required)."""
    prefix = "--slurm: " if for_run else ""
    where = " (default: beside -o)" if for_run else ""

    def add(command: Command) -> Command:
        for option in reversed(
            [
                click.option("--nodes", type=click.IntRange(min=1), required=not for_run, help=f"{prefix}Nodes of the job."),
                click.option(
                    "--tasks-per-node", type=click.IntRange(min=1), default=1, show_default=True, help=f"{prefix}Ranks per node."
                ),
                click.option("--partition", help=f"{prefix}Slurm partition."),
                click.option("--account", help=f"{prefix}Slurm account."),
                click.option(
                    "--slurm-time", metavar="LIMIT", help=f"{prefix}The job's time limit, as sbatch takes it (e.g. 30:00)."
                ),
                click.option(
                    "--job-dir",
                    required=not for_run,
                    type=click.Path(file_okay=False),
                    help=f"{prefix}A folder every node sees, for the run config, the ranks' files and Slurm's output{where}.",
                ),
            ]
        ):
            command = option(command)
        return command

    return add


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


@dataclass(frozen=True)
class View:
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


def python_paths(given: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for text in given:
        plugin, sep, path = text.partition("=")
        if not sep or not plugin or not path:
            raise UsageError(f"--python must be PLUGIN=PATH, got {text!r}")
        if not Path(path).is_file() or not os.access(path, os.X_OK):
            raise UsageError(f"--python {plugin}={path}: not an executable file")
        found[plugin] = path
    return found


def run_config(config_file: str | None, flags: dict[str, Any], options: tuple[str, ...]) -> RunConfig:
    from accelbench.execution.schedule import parse_duration
    from accelbench.planning.config import TF_CNN_PROTOCOL, RunConfig, load_config_file, parse_lever

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
        data["batch_sizes"] = int_list(data["batch_sizes"], "--batch-sizes")
    if options:
        data["options"] = {**data.get("options", {}), **dict(map(parse_option, options))}
    if flags.get("levers"):
        data["levers"] = [parse_lever(text) for text in flags["levers"]]
    return RunConfig.from_dict(data)


def endpoint(text: str, flag: str) -> None:
    """HOST:PORT with a host and a port in 1..65535, refused here rather than deep in an engine."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"{flag} {text!r}: give HOST:PORT with a port in 1..65535")


def int_list(text: str, flag: str) -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    if "" in parts:  # "8,,16" or a trailing comma: an item lost in typing, never dropped silently
        raise UsageError(f"{flag} has an empty item in {text!r}: give comma-separated integers")
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {text!r}") from None


def selected(plugin_names: tuple[str, ...], backend_names: tuple[str, ...], training: bool = False) -> list[BackendRef]:
    from accelbench.registry import PluginHost

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
