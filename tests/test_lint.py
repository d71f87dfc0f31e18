"""Lint and types are part of the suite: pyflakes, pycodestyle and import order over the project's
code (the rules in pyproject.toml's [tool.ruff]), and mypy over core and the built-in plugins
([tool.mypy])."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    done = subprocess.run([ruff, "check", "core", "plugins", "tests", "docs"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_mypy_finds_nothing(tmp_path):
    """mypy over the package as it is installed: core/ is ``accelbench``, plugins/ its ``plugins``
    and schemas/ its ``schemas`` (a tree of links, since mypy reads no package-dir mapping)."""
    package = tmp_path / "accelbench"
    package.mkdir()
    for module in (ROOT / "core").iterdir():
        if module.suffix == ".py" or (module.is_dir() and (module / "__init__.py").exists()):
            (package / module.name).symlink_to(module)
    for name in ("plugins", "schemas"):
        (package / name).symlink_to(ROOT / name)
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), "-p", "accelbench"],
                          cwd=tmp_path, env={**os.environ, "MYPYPATH": str(tmp_path)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
