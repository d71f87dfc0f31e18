"""Worker environments: a Python environment per distinct set of requirements, made on first use
and cached (pre-commit's hook environments, asv's per-target ones), so frameworks that cannot
share one environment (numpy 2 and numpy < 2) run side by side, each in its own worker.

An environment holds accelbench itself (its worker needs only ``pluggy``, ``click`` and
``packaging``) and the requirements a backend declares (``BackendInfo.environment``), plus any the user adds for a
version matrix (``--env``). It lives in the user's cache under a hash of its requirements, the
Python version and accelbench's version, and is rebuilt when any of them changes. ``uv`` builds it
when it is on PATH (much faster); otherwise ``venv`` and ``pip``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from accelbench.environments.machine import cache_dir
from accelbench.errors import UsageError
from accelbench.records.blocks import WorkerEnvironment
from accelbench.records.jsonform import from_json, to_json

#: what accelbench's worker and the plugin modules import, installed beside accelbench (no-deps)
#: in every environment
WORKER_PACKAGES = ("pluggy>=1.5", "click>=8.1", "packaging>=23")
MANIFEST = "accelbench-env.json"
INSTALL_TIMEOUT_S = 3600


if TYPE_CHECKING:
    from accelbench.registry import BackendRef


class EnvironmentNotMade(Exception):
    """An environment could not be made; the message is the installer's own last line."""


@dataclass(frozen=True)
class EnvSpec:
    """What an environment must hold, beyond accelbench: requirement strings, in order, and the
    distribution of a third-party plugin (its pip arguments, and its name and version), which its
    workers import the plugin from."""

    requirements: tuple[str, ...]
    #: how to install the plugin's own distribution here, as the host has it (``plugin_install_args``)
    plugin: tuple[str, ...] = ()
    #: "name version" of that distribution: a new version makes a new environment
    plugin_version: str = ""

    def key(self) -> str:
        # accelbench's source too: an environment holds accelbench editable from one source tree
        content = {
            "requirements": sorted(self.requirements),
            "worker": WORKER_PACKAGES,
            "python": sys.version.split()[0],
            "accelbench": _accelbench_version(),
            "source": _accelbench_source(),
        }
        if self.plugin:  # only then: the built-ins' environments keep their keys
            content.update(plugin=list(self.plugin), plugin_version=self.plugin_version)
        text = json.dumps(content, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def with_overrides(self, extra: tuple[str, ...]) -> "EnvSpec":
        """These requirements, with ``extra`` replacing any of the same distribution (``--env``)."""
        names = {_requirement_name(r) for r in extra}
        kept = tuple(r for r in self.requirements if _requirement_name(r) not in names)
        return replace(self, requirements=kept + tuple(extra))


@dataclass(frozen=True)
class PythonEnv:
    path: Path
    spec: EnvSpec

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def exists(self) -> bool:
        return (self.path / MANIFEST).exists() and self.python.exists()


def root() -> Path:
    return cache_dir("envs")


def for_spec(spec: EnvSpec) -> PythonEnv:
    return PythonEnv(root() / spec.key(), spec)


def parse_requirements(text: str, flag: str = "--env") -> tuple[str, ...]:
    """``"framework==2.20.*,its-addon==2.20.*"`` -> its requirement strings, each checked."""
    from packaging.requirements import InvalidRequirement, Requirement

    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    if not parts:
        raise UsageError(f"{flag}: no requirement in {text!r}")
    for part in parts:
        try:
            Requirement(part)
        except InvalidRequirement as exc:  # packaging's message spans lines: its first says why
            raise UsageError(f"{flag}: {part!r} is not a requirement ({str(exc).splitlines()[0]})") from None
    return parts


def create(env: PythonEnv, say: Callable[[str], None] = print) -> float:
    """Make the environment (replacing a half-made one); seconds taken. EnvironmentNotMade with
    the installer's reason when it cannot be made; nothing is left behind then."""
    started = time.monotonic()
    staging = env.path.with_name(env.path.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        say(f"  creating the environment ({'uv' if shutil.which('uv') else 'venv + pip'})")
        _make_venv(staging)
        python = staging / "bin" / "python"
        # accelbench without its host-side dependencies (plots, statistics), then what its worker
        # imports and what the backend needs, resolved together
        say("  installing accelbench (its worker's part)")
        _install(python, _accelbench_source(), "installing accelbench", no_deps=True)
        if env.spec.plugin:  # first: a distribution that cannot be installed fails fast
            what = f"installing the plugin's distribution {env.spec.plugin_version}"
            say(f"  {what}")
            # without its dependencies: what its worker needs is its backend's declared environment
            _install(python, list(env.spec.plugin), what, no_deps=True)
        what = f"installing {', '.join(env.spec.requirements) or 'the worker packages'}"
        say(f"  {what}")
        _install(python, [*WORKER_PACKAGES, *env.spec.requirements], what)
    except EnvironmentNotMade:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    installed = _installed_versions(staging / "bin" / "python", env.spec.requirements)
    say(f"  installed: {', '.join(f'{name} {version}' for name, version in installed.items()) or '-'}")
    made = EnvManifest(env.spec, env.spec.key(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), installed)
    (staging / MANIFEST).write_text(json.dumps(to_json(made)))
    shutil.rmtree(env.path, ignore_errors=True)
    staging.rename(env.path)
    _fix_venv_paths(env.path, staging)
    return time.monotonic() - started


def ensure(env: PythonEnv, allow_create: bool, say: Callable[[str], None] = print) -> PythonEnv:
    """The environment, made now if it does not exist yet (and ``allow_create``). Two processes
    that need one environment at once (two runs, two CI jobs on one cache) make it once: the
    second waits for the first's lock and then finds it made."""
    if env.exists():
        return env
    if not allow_create:
        raise EnvironmentNotMade(f"environment {env.path} does not exist (--no-create-env; make it with accelbench env create)")
    with _creation_lock(env, say):
        if env.exists():
            return env
        say(
            f"making a worker environment for {', '.join(env.spec.requirements) or 'accelbench only'} "
            f"in {env.path} (first use; cached)"
        )
        seconds = create(env, say)
    say(f"environment ready in {seconds:.0f} s")
    return env


@contextmanager
def _creation_lock(env: PythonEnv, say: Callable[[str], None]) -> Iterator[None]:
    """An exclusive lock on ``<environment>.lock`` beside it while it is made: without it a second
    maker would delete the first's half-made ``.partial`` folder from under its installer."""
    import fcntl

    env.path.parent.mkdir(parents=True, exist_ok=True)
    with open(env.path.with_name(env.path.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process making the environment {env.path}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class EnvManifest:
    """What an environment's folder says of it (``accelbench-env.json``), written once it is made."""

    spec: EnvSpec
    key: str
    created_utc: str
    #: the versions of its requirements' distributions, as installed
    installed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CachedEnv:
    """A cached environment, as ``accelbench env list`` shows it."""

    path: str
    manifest: EnvManifest
    python: str
    size_mb: int


def listing() -> list[CachedEnv]:
    """Every cached environment: path, Python, requirements, size."""
    found: list[CachedEnv] = []
    if not root().exists():
        return found
    for path in sorted(root().iterdir()):
        manifest = path / MANIFEST
        if not manifest.exists():
            continue
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        found.append(
            CachedEnv(
                str(path),
                from_json(EnvManifest, json.loads(manifest.read_text()), str(manifest)),
                _python_version(path / "bin" / "python"),
                round(size / 2**20),
            )
        )
    return found


def remove(keys: tuple[str, ...] = ()) -> list[str]:
    """Delete the environments with these keys (all when none given); their paths. A key that
    names no environment is refused before anything is deleted."""
    entries = listing()
    unknown = [key for key in keys if key not in {entry.manifest.key for entry in entries}]
    if unknown:
        raise UsageError(f"env remove: no environment has the key {unknown[0]!r} (accelbench env list shows them)")
    removed = []
    for entry in entries:
        if not keys or entry.manifest.key in keys:
            shutil.rmtree(entry.path)
            removed.append(entry.path)
    return removed


def _make_venv(path: Path) -> None:
    uv = shutil.which("uv")
    command = [uv, "venv", "--quiet", "--python", sys.executable, str(path)] if uv else [sys.executable, "-m", "venv", str(path)]
    _run(command, "creating the environment")


def _install(python: Path, requirements: list[str], what: str, no_deps: bool = False) -> None:
    uv = shutil.which("uv")
    base = (
        [uv, "pip", "install", "--quiet", "--python", str(python)]
        if uv
        else [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    )
    _run([*base, *(["--no-deps"] if no_deps else []), *requirements], what)


def _run(command: list[str], what: str) -> None:
    # without the host's PYTHONPATH: the installer would take a distribution found there (a
    # plugin's, say) as already installed in the environment
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=environ)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentNotMade(f"{what}: {exc}") from None
    if done.returncode:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
        raise EnvironmentNotMade(f"{what} failed: {reason.strip()}")


def _accelbench_source() -> list[str]:
    """How to install this very accelbench: editable from its source tree when it runs from one
    (found from the package itself: a stray ``*.egg-info`` on the path may shadow the installed
    metadata), else as it was installed (a local folder, or its released version)."""
    package = Path(__file__).resolve().parents[1]  # accelbench's own folder, above this sub-package
    project = package.parent
    if (project / "pyproject.toml").is_file() and not any(p in package.parts for p in ("site-packages", "dist-packages")):
        return ["-e", str(project)]
    return list(_as_installed(metadata.distribution("accelbench")))


def plugin_install_args(dist: metadata.Distribution | None) -> tuple[str, ...]:
    """How to install a plugin's distribution into a worker environment, as the host has it:
    editable from its source folder when the host's is editable, the same wheel or folder when it
    was installed from one, the same version from the index otherwise (PEP 610's direct_url.json
    says which). Nothing for accelbench itself (the built-in plugins ship inside it)."""
    if dist is None or _requirement_name(dist.name) == "accelbench":
        return ()
    return _as_installed(dist)


def _as_installed(dist: metadata.Distribution) -> tuple[str, ...]:
    """pip's arguments for ``dist`` as this host has it, from PEP 610's direct_url.json: editable
    from its folder, the same wheel or folder, the same direct URL, else its version from the index."""
    name = dist.name
    direct = dist.read_text("direct_url.json")
    if direct:
        info = json.loads(direct)
        url = info.get("url", "")
        if url.startswith("file://"):
            path = url.removeprefix("file://")
            return ("-e", path) if info.get("dir_info", {}).get("editable") else (path,)
        if url:
            return (f"{name} @ {url}",)
    return (f"{name}=={dist.version}",)


def _accelbench_version() -> str:
    try:
        return metadata.version("accelbench")
    except metadata.PackageNotFoundError:
        return "0"


def _requirement_name(requirement: str) -> str:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(requirement).name)


def _installed_versions(python: Path, requirements: tuple[str, ...]) -> dict[str, str]:
    """The versions the environment holds of its requirements' distributions (read there)."""
    names = [_requirement_name(r) for r in requirements]
    script = (
        "import json, sys\nfrom importlib import metadata\nfound = {}\n"
        "for name in sys.argv[1:]:\n    try: found[name] = metadata.version(name)\n"
        "    except metadata.PackageNotFoundError: pass\nprint(json.dumps(found))"
    )
    try:
        done = subprocess.run([str(python), "-c", script, *names], capture_output=True, text=True, timeout=60)
        versions: dict[str, str] = json.loads(done.stdout or "{}")
        return versions
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


def _python_version(python: Path) -> str:
    try:
        return subprocess.run(
            [str(python), "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _fix_venv_paths(path: Path, staging: Path) -> None:
    """A venv records its own path in its scripts' shebangs and activate scripts; the worker
    runs ``bin/python -m``, which needs none of them, so only ``pyvenv.cfg`` must be right."""
    cfg = path / "pyvenv.cfg"
    if cfg.exists():
        cfg.write_text(cfg.read_text().replace(str(staging), str(path)))


@dataclass(frozen=True)
class WorkerSetup:
    """Which Python a plan's workers run: the host's (neither set), one the user made
    (``--python PLUGIN=PATH``), or an environment made from requirements."""

    python: str | None = None
    spec: EnvSpec | None = None
    #: the requirements the user added for a version matrix (``--env``), part of the run's label
    added: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return "user" if self.python else "environment" if self.spec else "host"

    def label(self) -> str:
        return ",".join(self.added)


HOST = WorkerSetup()


def setups_for(
    ref: "BackendRef", pythons: dict[str, str] | None = None, matrix: list[tuple[str, ...]] | None = None
) -> list[WorkerSetup]:
    """The worker setups of a registered backend (its declared environment, its plugin's
    distribution)."""
    return setups(
        ref.backend.describe().environment, ref.plugin.name, pythons or {}, matrix or [], distribution=ref.plugin.distribution
    )


def setups(
    info_environment: tuple[str, ...], plugin: str, pythons: dict[str, str], matrix: list[tuple[str, ...]], distribution: str = ""
) -> list[WorkerSetup]:
    """The worker setups a backend runs under: ``--python`` for its plugin wins; else one per
    ``--env`` entry (its requirements over the backend's own); else the host's Python when the
    host already has what the backend's environment would hold (``pip install accelbench[all]``),
    else that environment (made on first use), holding the plugin's own distribution too."""
    if plugin in pythons:
        return [WorkerSetup(python=pythons[plugin])]
    base = EnvSpec(info_environment, *_plugin_fields(distribution))
    if matrix:
        return [WorkerSetup(spec=base.with_overrides(extra), added=extra) for extra in matrix]
    return [HOST] if host_satisfies(info_environment) else [WorkerSetup(spec=base)]


def _plugin_fields(distribution: str) -> tuple[tuple[str, ...], str]:
    """The plugin distribution's install arguments and "name version" (nothing for accelbench's
    own plugins, or a plugin not installed as a distribution)."""
    if not distribution:
        return (), ""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return (), ""
    args = plugin_install_args(dist)
    return (args, f"{dist.name} {dist.version}") if args else ((), "")


def host_satisfies(requirements: tuple[str, ...]) -> bool:
    """Whether the host's installed distributions meet every requirement (by metadata; nothing
    is imported)."""
    from packaging.requirements import Requirement

    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            return False
        if not requirement.specifier.contains(installed, prereleases=True):
            return False
    return True


def interpreter(
    setup: WorkerSetup, allow_create: bool, say: Callable[[str], None] = print
) -> tuple[str | None, WorkerEnvironment]:
    """The Python to start workers with (None: the host's) and the record's description of it;
    EnvironmentNotMade when its environment cannot be made."""
    if setup.python:  # one the user made
        if not Path(setup.python).exists():
            raise EnvironmentNotMade(f"--python {setup.python}: no such interpreter")
        return setup.python, WorkerEnvironment("user", setup.python)
    spec = setup.spec
    if spec is None:
        return None, WorkerEnvironment("host", sys.executable)
    env = ensure(for_spec(spec), allow_create, say)
    return str(env.python), WorkerEnvironment(
        "environment", str(env.python), key=spec.key(), requirements=list(spec.requirements), plugin=spec.plugin_version or None
    )
