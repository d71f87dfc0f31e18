"""Checking what a user gives, before any worker starts: files, numbers and the output path.

Every problem is a ``UsageError`` naming the file or flag (one line on stderr, exit code 2), never
a traceback, and nothing is written before all of it has been checked.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import click

from accelbench.errors import UsageError


def read_text(path: str | Path, what: str) -> str:
    """A UTF-8 text file's contents; anything but a regular file (a FIFO would block the read
    forever, a device never end, a folder fail obscurely) is refused first."""
    shown = shown_path(path)
    try:
        if Path(path).exists() and not Path(path).is_file():
            raise UsageError(f"{what} {shown}: not a regular file")
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{what} {shown}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {shown}: not UTF-8 text (byte {exc.start})") from None


def shown_path(path: str | Path) -> str:
    """A path as a message shows it: quoted where it would otherwise not be seen (empty, blank at
    either end)."""
    text = str(path)
    return repr(text) if not text.strip() or text != text.strip() else text


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:  # json keeps the last silently: a setting given twice is a mistake to name
            raise ValueError(f"the key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def parse_json(text: str, what: str) -> Any:
    """Strict JSON: NaN and Infinity (which Python would accept) are refused, as are a key given
    twice in one object and absurd nesting."""
    try:
        return json.loads(text, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what}: not JSON ({exc})") from None
    except ValueError as exc:
        raise UsageError(f"{what}: not JSON ({exc})") from None
    except RecursionError:
        raise UsageError(f"{what}: nested too deeply to be a config or results file") from None


def read_json(path: str | Path, what: str = "file") -> Any:
    return parse_json(read_text(path, what), f"{what} {shown_path(path)}")


def check_finite(data: Any, what: str, where: str = "$") -> None:
    """Refuse NaN and infinities anywhere in ``data`` (a TOML file may hold them)."""
    if isinstance(data, float) and not math.isfinite(data):
        raise UsageError(f"{what}: {where} is {data}, not a finite number")
    if isinstance(data, dict):
        for key, value in data.items():
            check_finite(value, what, f"{where}.{key}")
    elif isinstance(data, list):
        for index, value in enumerate(data):
            check_finite(value, what, f"{where}[{index}]")


class FiniteFloat(click.ParamType):  # type: ignore[type-arg]  # generic in click's stubs only
    """A float option that refuses nan and ±inf (click's FLOAT accepts them)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float) and math.isfinite(value):
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


FINITE = FiniteFloat()

#: the longest timeout a run may be given: a day's bound on a week-long run is generous, and
#: beyond about 1e9 s the deadline arithmetic overflows the clocks it is compared with
MAX_TIMEOUT_S = 30 * 24 * 3600.0


class Timeout(FiniteFloat):
    """Seconds: finite, positive and at most ``MAX_TIMEOUT_S``."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not 0 < number <= MAX_TIMEOUT_S:
            self.fail(f"{value!r} is not between 0 and {MAX_TIMEOUT_S:.0f} seconds (30 days)", param, ctx)
        return number


TIMEOUT = Timeout()


def can_make_folder_in(parent: Path) -> bool:
    """Tried, not asked: ``os.access`` says yes to root in /proc or on a read-only mount."""
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".accelbench-try-"))
    except OSError:
        return False
    return True


def check_output(path: Path, force: bool) -> None:
    """Check ``-o PATH`` before any worker starts.

    Its folder must exist or be makeable and be writable; an existing file must be an accelbench
    results file (its records stay and the new ones are merged in, ``records.ResultsWriter``;
    ``--force`` replaces it). Any other file is never overwritten.
    """
    from accelbench.records import validation

    if path.is_dir():
        raise UsageError(f"-o {path}: is a folder; give a file name")
    check_writable_folder(path.parent)
    if not path.exists() or force:
        return
    refusal = UsageError(
        f"-o {path}: exists and is not an accelbench results file; it is never overwritten (choose another path)"
    )
    try:
        document = parse_json(read_text(path, "-o"), f"-o {path}")
    except UsageError:
        raise refusal from None
    if validation.errors("results", document):
        raise refusal


def check_writable_folder(folder: Path, flag: str = "-o") -> None:
    """The folder exists and a file can be created in it, or it can be made (tried, then removed:
    a refusal leaves nothing behind, not even an empty folder; the writer makes it)."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag}: {existing} is a file, so no folder can be made under it")
    if existing != folder:
        if not can_make_folder_in(existing):
            raise UsageError(f"{flag}: cannot write in {folder}: cannot make a folder in {existing}")
        return
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write in {folder}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{flag}: cannot write in {folder}")
