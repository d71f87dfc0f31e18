import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def testplugins_path(tmp_path_factory) -> Path:
    """The third-party test plugin distribution, pip-installed into its own folder for this session."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(target), str(HERE / "thirdparty")],
                   check=True, cwd=tmp_path_factory.mktemp("build"))
    return target


@pytest.fixture
def accelbench_cli(testplugins_path, tmp_path):
    """Run the installed ``accelbench`` command with the test plugins on the path."""

    def run(*args: str, plugins: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(testplugins_path))
        env.pop("ACCELBENCH_PLUGINS", None)
        if plugins is not None:
            env["ACCELBENCH_PLUGINS"] = plugins
        return subprocess.run([sys.executable, "-m", "accelbench", *args], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=timeout)

    return run


def load_records(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text())["records"]
