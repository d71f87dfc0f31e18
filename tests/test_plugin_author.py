"""The plugin author's path: a third-party plugin in its own distribution and its own worker
environment, a versioned public API with one-line migration errors, and the scaffold.

The third-party plugins here are real distributions built by the test in a temporary folder (not
importable from the source tree): their worker environment needs numpy 2 where the host has 1.26,
so a worker that runs at all runs in an environment holding the plugin's own distribution."""

import ast
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import accelbench
from accelbench import api
from accelbench.authoring import scaffold
from accelbench.backend import BackendInfo, PluginAPIError
from accelbench.environments import python_envs as envs

ROOT = Path(__file__).parents[1]

PROBE = '''
"""A plugin whose framework (numpy 2) cannot share the host's numpy."""
import accelbench.api as accelbench

PLUGIN_API = "2.0"


class Probe(accelbench.Backend):
    info = accelbench.BackendInfo(name="probe", framework="numpy", requires=("numpy",), models=("mlp",),
                                  version="{version}", environment=("numpy>=2",))

    def prepare(self, config):
        import numpy as np
        import np2probe
        self.w = np.ones((8, 8), dtype=np.float32)
        return accelbench.Prepared(device_name="cpu", framework_version=np.__version__,
                                   settings={{"numpy": np.__version__, "plugin_file": np2probe.__file__}})

    def step(self):
        self.w = self.w @ self.w / 8
        return float(self.w[0, 0])


@accelbench.hookimpl
def register_backends(register):
    register(Probe())
'''


def plugin_distribution(folder: Path, name: str, module_text: str, version: str = "0.1.0") -> Path:
    """A plugin distribution's source: package ``name`` with this ``__init__.py``, registered as
    plugin ``name`` in the accelbench entry-point group."""
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text(module_text)
    (folder / "pyproject.toml").write_text(
        textwrap.dedent(f'''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "{version}"
        [project.entry-points.accelbench]
        {name} = "{name}"
        [tool.setuptools]
        packages = ["{name}"]
        ''')
    )
    return folder


def probe_source(folder: Path, version: str = "0.1.0") -> Path:
    return plugin_distribution(folder, "np2probe", PROBE.format(version=version), version)


def pip(*args: str, cwd: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation", *args],
        check=True,
        cwd=cwd,
    )


def run_accelbench(*args: str, path: Path, cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(path), "XDG_CACHE_HOME": str(cache), "ACCELBENCH_PLUGINS": "np2probe"}
    return subprocess.run(
        [sys.executable, "-m", "accelbench", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=900
    )


def mark_editable(target: Path, source: Path) -> None:
    """What ``pip install -e`` records (PEP 610), on the --target install: the test cannot install
    editable into the session's own environment, so the host is told its copy is an editable one
    of ``source`` and the environment installs it editable from there."""
    [dist_info] = target.glob("np2probe-*.dist-info")
    (dist_info / "direct_url.json").write_text(json.dumps({"url": source.as_uri(), "dir_info": {"editable": True}}))


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("envcache")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["editable", "wheel"])
def test_a_third_party_plugin_runs_in_its_own_environment_with_its_own_distribution(how, tmp_path, env_cache):
    source = probe_source(tmp_path / "src")
    target = tmp_path / "site"
    if how == "wheel":
        wheels = tmp_path / "wheels"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(wheels),
                str(source),
            ],
            check=True,
            cwd=tmp_path,
        )
        pip("--target", str(target), str(next(wheels.glob("*.whl"))), cwd=tmp_path)
    else:
        pip("--target", str(target), str(source), cwd=tmp_path)
        mark_editable(target, source)
    done = run_accelbench(
        "run",
        "--plugin",
        "np2probe",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "3",
        "-o",
        str(tmp_path / "r.json"),
        path=target,
        cache=env_cache,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [record] = json.loads((tmp_path / "r.json").read_text())["records"]
    assert record["status"] == "ok", record["reason"]
    assert record["settings"]["numpy"].startswith("2.")  # the host has numpy 1.26
    worker = record["environment"]["worker"]
    assert worker["kind"] == "environment" and worker["plugin"].startswith("np2probe 0.1.0")
    # the worker imported the plugin as its environment holds it, not from the host's copy: an
    # editable install runs the source folder's code, a wheel its copy in the environment
    where = source if how == "editable" else env_cache
    assert record["settings"]["plugin_file"].startswith(str(where)), record["settings"]["plugin_file"]


def test_the_environment_is_keyed_by_the_plugins_version_and_source(tmp_path):
    base = envs.EnvSpec(("numpy>=2",))
    one = envs.EnvSpec(("numpy>=2",), plugin=("-e", "/src/np2probe"), plugin_version="np2probe 0.1.0")
    two = envs.EnvSpec(("numpy>=2",), plugin=("-e", "/src/np2probe"), plugin_version="np2probe 0.2.0")
    elsewhere = envs.EnvSpec(("numpy>=2",), plugin=("/wheels/np2probe-0.1.0-py3-none-any.whl",), plugin_version="np2probe 0.1.0")
    assert len({base.key(), one.key(), two.key(), elsewhere.key()}) == 4
    assert envs.for_spec(one).path != envs.for_spec(two).path


def test_two_processes_needing_one_environment_make_it_once(tmp_path, monkeypatch):
    """Two runs (or two CI jobs) sharing a cache need one environment at once: the second waits
    for the first's lock and finds it made, rather than delete the first's half-made folder."""
    import threading
    import time

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    made, said = [], []

    def slow_create(env, say):
        made.append(env.path)
        time.sleep(0.5)  # the second caller arrives while this one installs
        (env.path / "bin").mkdir(parents=True)
        (env.path / "bin" / "python").touch()
        (env.path / envs.MANIFEST).write_text("{}")
        return 0.5

    monkeypatch.setattr(envs, "create", slow_create)
    env = envs.for_spec(envs.EnvSpec(("numpy>=2",)))
    callers = [threading.Thread(target=envs.ensure, args=(env, True, said.append)) for _ in range(2)]
    for caller in callers:
        caller.start()
        time.sleep(0.1)
    for caller in callers:
        caller.join(10)
    assert made == [env.path] and env.exists()
    assert f"waiting for another process making the environment {env.path}" in said, said


def test_how_the_plugins_distribution_is_installed_follows_the_host(tmp_path):
    source = probe_source(tmp_path / "src")
    target = tmp_path / "site"
    pip("--target", str(target), str(source), cwd=tmp_path)
    [dist_info] = target.glob("np2probe-*.dist-info")
    from importlib import metadata

    dist = metadata.PathDistribution(dist_info)
    assert envs.plugin_install_args(dist) == (str(source),)
    mark_editable(target, source)
    assert envs.plugin_install_args(metadata.PathDistribution(dist_info)) == ("-e", str(source))
    (dist_info / "direct_url.json").unlink()
    assert envs.plugin_install_args(metadata.PathDistribution(dist_info)) == ("np2probe==0.1.0",)
    assert envs.plugin_install_args(metadata.distribution("accelbench")) == ()  # the built-ins ship inside


@pytest.mark.slow
def test_a_plugin_whose_distribution_cannot_be_installed_is_unavailable_with_the_reason(tmp_path, env_cache):
    source = probe_source(tmp_path / "src")
    target = tmp_path / "site"
    pip("--target", str(target), str(source), cwd=tmp_path)
    gone = tmp_path / "gone"
    [dist_info] = target.glob("np2probe-*.dist-info")
    (dist_info / "direct_url.json").write_text(json.dumps({"url": gone.as_uri(), "dir_info": {}}))
    done = run_accelbench(
        "run",
        "--plugin",
        "np2probe",
        "--timed-steps",
        "2",
        "-o",
        str(tmp_path / "r.json"),
        path=target,
        cache=tmp_path / "cache",
        cwd=tmp_path,
    )
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    [record] = json.loads((tmp_path / "r.json").read_text())["records"]
    assert record["status"] == "unavailable", record
    assert "installing the plugin's distribution np2probe" in record["reason"] and "Traceback" not in record["reason"]


def test_a_removed_field_is_one_line_naming_its_replacement():
    with pytest.raises(
        PluginAPIError,
        match=r"^BackendInfo: 'default_variant' was removed in plugin API 2: list the "
        r"default first in variants=\{model: \(default, \.\.\.\)\}$",
    ):
        BackendInfo(name="x", framework="f", requires=(), models=("m",), variants={"m": ("v1",)}, default_variant="v1")
    with pytest.raises(PluginAPIError, match="'default_precision' was removed in plugin API 2: list the default first"):
        BackendInfo(name="x", framework="f", requires=(), models=("m",), default_precision="fp32")
    with pytest.raises(PluginAPIError, match="variants is a dict .* since plugin API 2"):
        BackendInfo(name="x", framework="f", requires=(), models=("m",), variants=("v1",))
    with pytest.raises(PluginAPIError, match="'models' is required since plugin API 2"):
        BackendInfo(name="x", framework="f", requires=())


def test_a_plugin_written_for_the_old_api_is_that_plugins_error_alone(tmp_path, accelbench_cli, testplugins_path):
    old = plugin_distribution(
        tmp_path / "old",
        "oldplugin",
        textwrap.dedent("""
        import accelbench

        class Old(accelbench.Backend):
            info = accelbench.BackendInfo(name="resnet50", framework="none", requires=(), models=("resnet50",),
                                          variants=("v1",), default_variant="v1", default_precision="fp32")

        @accelbench.hookimpl
        def register_backends(register):
            register(Old())
        """),
    )
    target = tmp_path / "site"
    pip("--target", str(target), str(old), cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(testplugins_path)])}
    env.pop("ACCELBENCH_PLUGINS", None)
    done = subprocess.run(
        [sys.executable, "-m", "accelbench", "plugins"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    plugins = {p["name"]: p for p in listing}
    error = plugins["oldplugin"]["error"]
    assert error.count("\n") == 0 and "'default_variant' was removed in plugin API 2" in error
    assert not plugins["sleepy"]["error"] and not plugins["tf_benchmarks"]["error"]


def test_the_public_api_is_versioned_re_exported_and_documented():
    assert api.PLUGIN_API == accelbench.PLUGIN_API and api.PLUGIN_API.split(".")[0] == "2"
    assert set(api.__all__) <= set(accelbench.__all__)
    for name in api.__all__:
        value = getattr(api, name)
        assert getattr(accelbench, name) is value
        if callable(value):
            assert (value.__doc__ or "").strip(), f"{name} has no docstring"
    page = (ROOT / "docs" / "plugins" / "api.md").read_text()
    assert "::: accelbench.api" in page


def imports_of(path: Path) -> list[str]:
    """The accelbench modules a file imports (absolute imports only: a plugin's own relative
    imports stay inside the plugin)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("accelbench"):
            found += [node.module] if node.module != "accelbench" else [f"accelbench.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("accelbench")]
    return found


def test_built_in_plugins_import_only_the_public_module():
    """The built-ins are registered exactly as third-party plugins, and use only what a third
    party can: ``accelbench.api`` (its names also at the top level) and the helpers shipped for
    plugins under ``accelbench.plugins``."""
    allowed_top = {f"accelbench.{name}" for name in accelbench.__all__}
    wrong = {}
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for module in imports_of(path):
            if module in ("accelbench", "accelbench.api") or module in allowed_top or module.startswith("accelbench.plugins"):
                continue
            wrong.setdefault(str(path.relative_to(ROOT)), []).append(module)
    assert wrong == {}


def test_the_scaffold_refuses_a_bad_name_and_an_existing_folder(tmp_path):
    from accelbench.errors import UsageError

    with pytest.raises(UsageError, match="lower-case Python identifier"):
        scaffold.write("My-Plugin", tmp_path / "x")
    (tmp_path / "there").mkdir()
    with pytest.raises(UsageError, match="already exists"):
        scaffold.write("demo", tmp_path / "there")
    written = scaffold.write("withfw", tmp_path / "fw", framework="someframework")
    module = next(p for p in written if p.name == "__init__.py").read_text()
    assert "environment=('someframework',)" in module and "requires=('someframework',)" in module


@pytest.mark.slow
def test_the_scaffolds_plugin_installs_passes_its_tests_and_runs(tmp_path, accelbench_cli):
    """`accelbench new-plugin`, then in a fresh virtual environment (sharing the session's
    installed packages through a .pth file, so nothing is downloaded): `pip install -e .`,
    `pytest` and `accelbench run --plugin demo`."""
    made = accelbench_cli("new-plugin", "demo", "--dir", str(tmp_path / "demo"))
    assert made.returncode == 0, made.stderr
    assert "pip install -e" in made.stdout
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # addsitedir, not a bare path: the session's own .pth files (its editable accelbench) run too
    (Path(site) / "host.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ACCELBENCH_PLUGINS", "VIRTUAL_ENV")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), *args], capture_output=True, text=True, env=env, cwd=tmp_path / "demo", timeout=600)

    installed = run("-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", ".")
    assert installed.returncode == 0, installed.stderr
    tested = run("-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
    assert "1 passed" in tested.stdout
    ran = run(
        "-m",
        "accelbench",
        "run",
        "--plugin",
        "demo",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "5",
        "-o",
        str(tmp_path / "demo.json"),
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    [record] = json.loads((tmp_path / "demo.json").read_text())["records"]
    assert record["status"] == "ok" and record["plugin"]["name"] == "demo"
