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


def run_backend(plugin: str, **config) -> dict:
    """Run one built-in backend through the host (worker process, timing loop) and return its
    schema-checked record. Small shapes by default, so tests take seconds."""
    from accelbench import records, runner
    from accelbench.config import RunConfig
    from accelbench.registry import PluginHost

    defaults = dict(image_size=32, num_classes=10, global_batch=8, warmup_steps=1, timed_steps=5)
    refs = PluginHost().select([plugin])
    [record] = runner.execute(runner.plan(refs, RunConfig(**{**defaults, **config})), records.check_all)
    return record


def loss_falls(losses: list[float], window: int = 5, factor: float = 0.7) -> bool:
    first, last = losses[:window], losses[-window:]
    return sum(last) / window < factor * sum(first) / window
