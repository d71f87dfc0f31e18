"""The ``accelbench`` command group and ``main``: signals, refusals on one line, exit codes. The
commands are in this package's other modules. Heavy modules (numpy, rich, jsonschema) load inside commands."""

from __future__ import annotations

import errno
import signal
import sys
from typing import TYPE_CHECKING

import click

from accelbench.errors import UsageError

if TYPE_CHECKING:
    from types import FrameType


@click.group()
@click.version_option(package_name="accelbench")
def cli() -> None:
    """Benchmark deep-learning training across frameworks and devices."""


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
