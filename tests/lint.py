"""Lint, format and types, run before the suite (the README's test command and `.ci/run`):
``python tests/lint.py``. ruff's rules (pyflakes, pycodestyle, import order: pyproject.toml's
[tool.ruff]) and its format over the project's code, then mypy over the package as it is
installed: core at the --strict flags, the built-in plugins at the defaults ([tool.mypy]).
Exits non-zero on the first check that finds something, after printing what it found."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: what ruff looks at: the package, its plugins, the tests and scripts, the docs' hooks
CODE = ("core", "plugins", "tests", "docs")


def ruff_executable() -> str:
    return shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ruff_executable(), *args, *CODE], cwd=ROOT, capture_output=True, text=True)


def installed_layout(root: Path) -> Path:
    """The package as it is installed, as a tree of links under ``root`` (mypy reads no
    package-dir mapping): core/ is ``accelbench``, plugins/ its ``plugins``, schemas/ its ``schemas``."""
    package = root / "accelbench"
    package.mkdir()
    for module in (ROOT / "core").iterdir():
        if module.suffix == ".py" or (module.is_dir() and (module / "__init__.py").exists()):
            (package / module.name).symlink_to(module)
    for name in ("plugins", "schemas"):
        (package / name).symlink_to(ROOT / name)
    return root


def mypy(root: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(root / "cache"),
            *targets,
        ],
        cwd=root,
        env={**os.environ, "MYPYPATH": str(root)},
        capture_output=True,
        text=True,
    )


def checks(scratch: Path) -> list[tuple[str, subprocess.CompletedProcess[str]]]:
    """Each check's name and what it printed, in order, stopping at the first that fails."""
    done: list[tuple[str, subprocess.CompletedProcess[str]]] = []
    for name, run in (
        ("ruff check", lambda: ruff("check")),
        ("ruff format --check", lambda: ruff("format", "--check")),
        ("mypy", lambda: mypy(installed_layout(scratch), "-p", "accelbench")),
    ):
        done.append((name, run()))
        if done[-1][1].returncode != 0:
            break
    return done


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="accelbench-lint-") as scratch:
        for name, result in checks(Path(scratch)):
            status = "ok" if result.returncode == 0 else f"failed (exit {result.returncode})"
            print(f"lint: {name}: {status}", flush=True)
            if result.returncode != 0:
                sys.stdout.write(result.stdout + result.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
