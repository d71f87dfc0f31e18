"""Every command, every option, given what a hostile user types (hypothesis): each invocation ends
in exit 0 (or a command's own verdict code) or in exit 2 with one line that names what was wrong,
never a traceback, never a hang past a bound, and a refusal changes no file.

The commands run in this process (``accelbench.cli.main``), in a folder of their own, with the
test plugins' fixed-time backend selected where a command runs backends: a value that is valid
runs it for real, in a step of 10 microseconds. Hypothesis keeps the examples that failed once in
``tests/hypothesis/`` (committed), so a failure found once is tried again on every run.
"""

import os
import signal
import sys
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from accelbench import cli

#: what a hostile user types: empty, blank, signs, limits, not-a-number, unicode, long, lists
#: and key=value shapes gone wrong; paths are added per example (a folder, a FIFO, a missing one)
VALUES = [
    "",
    " ",
    "-1",
    "0",
    "1",
    "3",
    "0.5",
    "nan",
    "inf",
    "-inf",
    "1e309",
    "9" * 30,
    "x" * 3000,
    "é☃",
    "\t\n",
    ",",
    "1,,2",
    "=",
    "k=",
    "=v",
    "3%",
    "150%",
    "-3%",
    "10s",
    "0s",
    "5m",
    "fp32",
    "cpu",
    "sleepy",
    "sleepy:fixed-time",
]
PATHS = ("folder", "fifo", "missing", "unwritable", "empty-file", "bad-json")
#: arguments that keep a command on the fixed-time test backend, quick and bounded
BASE = {
    "run": ["--plugin", "sleepy", "--option", "step_ms=0.01", "--timed-steps", "3", "--warmup-steps", "1", "--timeout", "20"],
    "worker": ["--plugin", "sleepy", "--option", "step_ms=0.01", "--timed-steps", "3", "--timeout", "20"],
    "train": ["--plugin", "sleepy", "--timeout", "20"],
    "peak": ["--plugin", "sleepy"],
}
#: commands whose valid runs install packages from the registry: only their refusals are tried
SKIPPED = {"env create"}
#: examples a command is given per run; a hostile pass of your own: ACCELBENCH_HOSTILE_EXAMPLES=300 pytest this file
EXAMPLES = int(os.environ.get("ACCELBENCH_HOSTILE_EXAMPLES", "12"))
#: seconds an invocation may take before it counts as a hang
BOUND_S = 90
EXIT_CODES = {0, 1, 2, 3}


def commands() -> dict[str, click.Command]:
    found = {}
    for name, command in cli.cli.commands.items():
        if isinstance(command, click.Group):
            found.update({f"{name} {sub}": c for sub, c in command.commands.items() if f"{name} {sub}" not in SKIPPED})
        else:
            found[name] = command
    return found


COMMANDS = commands()


def make_path(folder: Path, kind: str) -> str:
    path = folder / f"given-{kind}"
    if kind == "folder":
        path.mkdir(exist_ok=True)
    elif kind == "fifo" and not path.exists():
        os.mkfifo(path)
    elif kind == "unwritable":
        return "/proc/accelbench-cannot-write-here/out.json"
    elif kind == "empty-file":
        path.write_text("")
    elif kind == "bad-json":
        path.write_text('{"schema_version": 3, "records": [1, "two"]}')
    return str(path)


@st.composite
def invocation(draw, name: str) -> tuple[list[str], list[str]]:
    """argv after the command's name, and the words a refusal may name (flags, values, arguments)."""
    command = COMMANDS[name]
    value = st.one_of(st.sampled_from(VALUES), st.sampled_from(PATHS).map(lambda kind: f"<path:{kind}>"))
    params = [p for p in command.params if p.name != "help"]
    chosen = draw(st.lists(st.sampled_from(params), max_size=4)) if params else []
    # a refusal may name what was not given, too (a missing argument or option), or the command
    argv, names = [], [*name.split(), *(opt for p in params for opt in getattr(p, "opts", ()) if opt.startswith("-"))]
    names += [p.human_readable_name.lower().strip(".").rstrip("s") for p in params if isinstance(p, click.Argument)]
    for param in chosen:
        if isinstance(param, click.Argument):
            count = 1 if param.nargs == 1 else draw(st.integers(0, 2))
            argv += [draw(value) for _ in range(count)]
            names.append(param.human_readable_name.lower())
        elif param.is_flag:
            argv.append(param.opts[-1])
            names.append(param.opts[-1])
        else:
            argv += [param.opts[-1], draw(value)]
            names += list(param.opts)
    return argv, names


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    def hang(signum, frame):
        raise TimeoutError(f"accelbench {' '.join(argv)[:300]} ran past {BOUND_S} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(BOUND_S)
    sys.argv = ["accelbench", *argv]
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def files_of(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file() and not p.is_fifo()
    }


@pytest.fixture
def in_a_folder(tmp_path, monkeypatch, testplugins_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(testplugins_path))
    monkeypatch.setenv("PYTHONPATH", str(testplugins_path))
    monkeypatch.setenv("COLUMNS", "120")
    return tmp_path


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_ends_cleanly_whatever_it_is_given(name, in_a_folder, capsys):
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=DirectoryBasedExampleDatabase(Path(__file__).parent / "hypothesis"),
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(invocation(name))
    def check(drawn):
        given_argv, names = drawn
        argv = [make_path(in_a_folder, v[6:-1]) if v.startswith("<path:") else v for v in given_argv]
        before = files_of(in_a_folder)
        code, out, err = run_cli([*name.split(), *argv, *BASE.get(name, [])], capsys)
        assert "Traceback" not in out + err, err
        assert code in EXIT_CODES, (code, err)
        if code == 2:
            lines = [line for line in err.splitlines() if line.strip()]
            assert len(lines) == 1, err
            given = [*names, *argv, *BASE.get(name, [])]
            # an empty value is named by its quotes; click names "-inf" or "-3%" by its first letters
            given += [repr(v) for v in argv if not v.strip()] + [v[:2] for v in argv if v.startswith("-")]
            given += ["unexpected extra argument"]  # click's, for arguments too many (blank ones show as "( )")
            named = [n for n in given if len(n.strip()) > 1 and n.lower() in lines[0].lower()]
            assert named, f"the refusal names nothing it was given: {lines[0]!r} for {argv}"
            assert files_of(in_a_folder) == before, f"a refusal changed files: {argv}"

    check()
