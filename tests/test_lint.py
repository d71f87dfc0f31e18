"""Lint, format and types are part of the suite: pyflakes, pycodestyle and import order over the
project's code (the rules in pyproject.toml's [tool.ruff]), ruff's format, and mypy over core
(--strict flags) and the built-in plugins ([tool.mypy])."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_code_is_as_ruff_formats_it():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    done = subprocess.run(
        [ruff, "format", "--check", "core", "plugins", "tests", "docs"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    done = subprocess.run([ruff, "check", "core", "plugins", "tests", "docs"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


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


def mypy(root: Path, *targets: str) -> subprocess.CompletedProcess:
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


def test_mypy_finds_nothing(tmp_path):
    """mypy over the package as it is installed: core and the built-in plugins."""
    done = mypy(installed_layout(tmp_path), "-p", "accelbench")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_a_record_indexed_by_a_string_key_is_a_type_error(tmp_path):
    """Records are typed end to end: the type checker refuses ``record["status"]`` wherever it
    is written (and at run time it raises, naming the attribute)."""
    (installed_layout(tmp_path) / "consumer.py").write_text(
        "from accelbench.records import read_results\n\n"
        "for record in read_results('r.json'):\n"
        "    print(record.status, record['status'])\n"
    )
    done = mypy(tmp_path, "consumer.py")
    assert done.returncode == 1 and 'consumer.py:4: error: Invalid index type "str" for "Record"' in done.stdout, done.stdout
