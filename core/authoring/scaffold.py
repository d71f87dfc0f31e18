"""``accelbench new-plugin``: a minimal installable plugin distribution to start from.

What it writes passes ``pip install -e .`` and ``pytest`` out of the box, and ``accelbench run
--plugin NAME`` runs it: a backend whose step is a small numpy stand-in for the framework's
training step (replace it), registered through the ``accelbench`` entry-point group, a test of the
plugin contract with the shipped ``accelbench_contract`` fixture, and a README. With
``--framework PKG`` the backend declares PKG as its worker environment (``environment=``), so it
runs in a Python of its own, made on first use, with the plugin's own distribution installed.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from accelbench.api import PLUGIN_API
from accelbench.errors import UsageError
from accelbench.planning import inputs

NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def check_name(name: str) -> str:
    if not NAME.match(name) or keyword.iskeyword(name):
        raise UsageError(f"new-plugin: NAME must be a lower-case Python identifier (letters, digits, _), got {name!r}")
    return name


def write(name: str, folder: Path, framework: str | None = None) -> list[Path]:
    """Write the distribution into ``folder`` (which must not exist yet); the files written."""
    check_name(name)
    if framework is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", framework):
        raise UsageError(f"new-plugin: --framework must be a distribution name, got {framework!r}")
    if folder.exists():
        raise UsageError(f"new-plugin: {folder} already exists")
    parent = next((p for p in folder.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not inputs.can_make_folder_in(parent):
        raise UsageError(f"new-plugin --dir {inputs.shown_path(folder)}: cannot make the folder there")
    package = f"accelbench_{name}"
    files = {
        folder / "pyproject.toml": _pyproject(name, package),
        folder / package / "__init__.py": _module(name, framework),
        folder / "tests" / f"test_{name}.py": _test(name),
        folder / "README.md": _readme(name, package, framework),
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)


def _pyproject(name: str, package: str) -> str:
    return f'''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "accelbench-{name.replace("_", "-")}"
version = "0.1.0"
description = "accelbench plugin: {name}"
requires-python = ">=3.11"
dependencies = ["accelbench"]

[project.optional-dependencies]
test = ["pytest>=8"]

# how accelbench finds the plugin: the entry-point group "accelbench", the plugin's name = its module
[project.entry-points.accelbench]
{name} = "{package}"

[tool.setuptools]
packages = ["{package}"]
'''


def _module(name: str, framework: str | None) -> str:
    environment = (
        (
            f"\n        # the worker runs in an environment of its own with these requirements (and this\n"
            f"        # distribution), made on first use: the framework need not share the host's packages\n"
            f"        environment=({framework!r},),"
        )
        if framework
        else ""
    )
    requires = f"({_module_name(framework)!r},)" if framework else "()"
    version_of = f"metadata.version({framework!r})" if framework else "np.__version__"
    return f'''"""accelbench plugin {name!r}: written by `accelbench new-plugin` (plugin API {PLUGIN_API}).

Replace the numpy stand-in in ``prepare`` and ``step`` with your framework's model, optimizer and
training step. Rules of the protocol: describe the backend without importing the framework
(import it inside ``check``/``prepare``, which run in the worker); never time anything yourself;
``step()`` returns only when the device has finished the step.
"""

from importlib import metadata

import accelbench.api as accelbench

PLUGIN_API = "{PLUGIN_API}"  # the plugin API this plugin was written for


class ModelBackend(accelbench.Backend):
    info = accelbench.BackendInfo(
        name="model", framework={(framework or "numpy")!r}, requires={requires},
        models=("linear",), precisions=("fp32",), devices=("cpu",), version="0.1.0",
        description="a linear layer trained with SGD (a stand-in: replace it with your framework's ResNet-50)",{environment}
    )

    def check(self, config):
        """None when this config can run here; else the reason (the record says ``unavailable``)."""
        return None

    def prepare(self, config):
        import numpy as np  # the framework: imported here, in the worker

        rng = np.random.default_rng(config.seed)
        width = 64
        self.np, self.lr = np, 0.01
        self.x = rng.standard_normal((config.global_batch, width), dtype=np.float32)
        self.y = rng.standard_normal((config.global_batch, width), dtype=np.float32)
        self.w = rng.standard_normal((width, width), dtype=np.float32) / width
        # 2 FLOPs a multiply-add, forward and two backward products
        flops = 6.0 * width * width
        return accelbench.Prepared(device_name="cpu", flops_per_image=flops, framework_version={version_of},
                                   settings={{"width": width, "learning_rate": self.lr}})

    def step(self):
        """One training step; returns its loss once the work is done (numpy is synchronous)."""
        error = self.x @ self.w - self.y
        self.w -= self.lr * (self.x.T @ error) / len(self.x)
        return float((error * error).mean())


@accelbench.hookimpl
def register_backends(register):
    register(ModelBackend())
'''


def _module_name(distribution: str) -> str:
    """The import name most distributions use: lower case, dashes as underscores."""
    return distribution.lower().replace("-", "_").replace(".", "_")


def _test(name: str) -> str:
    return f'''"""The plugin keeps accelbench's contract: it describes itself without importing its framework,
refuses what it cannot run, its steps are synced and its record validates."""


def test_{name}_keeps_the_plugin_contract(accelbench_contract):
    record = accelbench_contract.check_all("{name}:model", global_batch=8)
    assert record.status == "ok" and record.images_per_sec() > 0
'''


def _readme(name: str, package: str, framework: str | None) -> str:
    env_note = (
        (
            f"\nIts worker runs in an environment of its own with `{framework}` (and this distribution)\n"
            f"installed, made on first use and cached: `accelbench env list` shows it.\n"
        )
        if framework
        else ""
    )
    return f"""# accelbench-{name.replace("_", "-")}

An [accelbench](https://github.com/accelbench/accelbench) plugin: `{package}/__init__.py` holds
its backend, registered in the `accelbench` entry-point group by `pyproject.toml`.
{env_note}
```bash
pip install -e '.[test]'            # beside accelbench
pytest                              # the plugin contract, with accelbench's own fixture
accelbench plugins                  # lists {name}
accelbench run --plugin {name}      # runs it under accelbench's protocol
```

Replace the numpy stand-in in `prepare` and `step` with your framework's training step; see the
plugin author guide in accelbench's documentation.
"""
