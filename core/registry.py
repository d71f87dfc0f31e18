"""Plugin loading and the typed facade over pluggy: core code never calls ``pm.hook.*`` itself.

Plugins come from the ``accelbench`` entry-point group, built-in ones included. Set
``ACCELBENCH_PLUGINS=name,name`` to load only those entry points (tests, one-framework users).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Iterable

import pluggy

from accelbench import hookspecs
from accelbench.backend import IDENTIFIER, Backend, BackendInfo
from accelbench.errors import UsageError
from accelbench.launch import Engine

ENTRY_POINT_GROUP = "accelbench"
ALLOW_LIST_VARIABLE = "ACCELBENCH_PLUGINS"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    version: str
    module: str
    #: import error text when the plugin failed to load, else ""
    error: str = ""
    #: the distribution that provides it ("accelbench" for the built-ins; "" when not installed)
    distribution: str = ""


@dataclass(frozen=True)
class BackendRef:
    plugin: PluginInfo
    backend: Backend

    @property
    def id(self) -> str:
        return f"{self.plugin.name}:{self.backend.describe().name}"

    def framework_version(self) -> str:
        """The installed version of the first required module's distribution ("" if unknown)."""
        from accelbench.environments.machine import distribution_version

        return next((v for v in map(distribution_version, self.backend.describe().requires) if v), "")

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this host at all (its framework is missing), else None.

        Looks modules up with find_spec only: nothing is imported.
        """
        info = self.backend.describe()
        if info.environment:  # the host's or, made on first use, an environment of its own
            return None
        missing = [m for m in info.requires if importlib.util.find_spec(m) is None]
        if missing:
            return f"{info.framework} is not installed (module {', '.join(missing)} not found)"
        return None


class PluginHost:
    def __init__(self, use_entry_points: bool = True, extra: Iterable[object] = ()):
        self._pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self._pm.add_hookspecs(hookspecs)
        self._plugins: dict[str, PluginInfo] = {}
        if use_entry_points:
            self._load_entry_points()
        for plugin in extra:
            self.add(plugin)
        self._pm.check_pending()

    def add(self, plugin: object, name: str | None = None, version: str = "0") -> None:
        """Register an in-process plugin (a module or object with hookimpls)."""
        registered = self._pm.register(plugin, name=name)
        if registered is None:  # pluggy refuses a plugin blocked by that name: it registered nothing
            return
        module = getattr(plugin, "__name__", type(plugin).__module__)
        self._plugins[registered] = PluginInfo(registered, version, module)

    def plugins(self) -> list[PluginInfo]:
        """Every plugin, with the error that keeps it (or some of its backends) out, if any."""
        self.backends()  # a registrar's errors are found by asking it
        return sorted(self._plugins.values(), key=lambda p: p.name)

    def backends(self) -> list[BackendRef]:
        """Every well-formed backend of every loaded plugin, asking each plugin's registrar in turn.

        A registrar that raises, or a backend whose description is malformed, never stops the
        others: the plugin is listed with the error, and its good backends still run.
        """
        refs: list[BackendRef] = []
        for impl in self._pm.hook.register_backends.get_hookimpls():
            plugin = self._plugins[impl.plugin_name]
            found: list[BackendRef] = []
            try:
                impl.function(register=lambda backend, p=plugin: found.append(BackendRef(p, backend)))
            except Exception as exc:  # noqa: BLE001 - a third party's bug is reported, not fatal
                self._fail(plugin, f"register_backends raised {type(exc).__name__}: {exc}")
            for ref in found:
                problem = _backend_problem(ref.backend)
                if problem:
                    self._fail(plugin, problem)
                else:
                    refs.append(ref)
        _refuse_duplicates(refs)
        return sorted(refs, key=lambda r: r.id)

    def _fail(self, plugin: PluginInfo, error: str) -> None:
        current = self._plugins[plugin.name]
        if error not in current.error:
            joined = f"{current.error}; {error}" if current.error else error
            self._plugins[plugin.name] = PluginInfo(current.name, current.version, current.module, joined)

    def select(self, plugins: Iterable[str] = (), backends: Iterable[str] = ()) -> list[BackendRef]:
        """Backends matching the named plugins and backend names/ids; unknown names are an error."""
        plugins, backends = list(plugins), list(backends)
        known = self.backends()
        for name in plugins:
            if name not in self._plugins:
                raise UsageError(f"unknown plugin {name!r} (loaded: {', '.join(self._plugins) or 'none'})")
            if self._plugins[name].error and not any(r.plugin.name == name for r in known):
                raise UsageError(f"plugin {name!r} failed to load: {self._plugins[name].error}")
        for name in backends:
            if not any(name in (r.id, r.backend.describe().name) for r in known):
                raise UsageError(f"unknown backend {name!r} (known: {', '.join(r.id for r in known)})")
        chosen = [
            r
            for r in known
            if (not plugins or r.plugin.name in plugins)
            and (not backends or r.id in backends or r.backend.describe().name in backends)
        ]
        return sorted(chosen, key=lambda r: _position(r, backends))

    def _load_entry_points(self) -> None:
        allowed = _allow_list()
        points = metadata.entry_points(group=ENTRY_POINT_GROUP)
        unknown = sorted(allowed - {ep.name for ep in points}) if allowed is not None else []
        if unknown:  # a typo would otherwise list no plugin and say nothing
            raise UsageError(
                f"{ALLOW_LIST_VARIABLE}: no installed plugin is named {', '.join(map(repr, unknown))} "
                f"(installed: {', '.join(sorted({ep.name for ep in points})) or 'none'})"
            )
        for ep in points:
            if ep.name in self._plugins or (allowed is not None and ep.name not in allowed):
                continue
            version = ep.dist.version if ep.dist else "0"
            distribution = ep.dist.name if ep.dist else ""
            try:
                module: ModuleType = ep.load()
                api_problem = _api_problem(module)
            except Exception as exc:  # a broken plugin is reported, never fatal to the others
                self._plugins[ep.name] = PluginInfo(ep.name, version, ep.value, _one_line(exc), distribution)
                continue
            if api_problem:
                self._plugins[ep.name] = PluginInfo(ep.name, version, ep.value, api_problem, distribution)
                continue
            self._pm.register(module, name=ep.name)
            self._plugins[ep.name] = PluginInfo(ep.name, version, ep.value, distribution=distribution)


def _one_line(exc: Exception) -> str:
    """A plugin's load error as one line: a migration error is its own message (it names what
    replaced the removed name), anything else its type and first line."""
    from accelbench.backend import PluginAPIError

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, PluginAPIError) else f"{type(exc).__name__}: {text}"


def _api_problem(module: ModuleType) -> str:
    """Why a plugin that declares the plugin API it was written for cannot load here ("" if it
    can): one written for a newer major version than this accelbench speaks."""
    from accelbench.api import PLUGIN_API

    declared = getattr(module, "PLUGIN_API", None)
    if declared is None:
        return ""
    major = str(declared).split(".")[0]
    if not major.isdigit():
        return f"PLUGIN_API must be a version string such as {PLUGIN_API!r}, not {declared!r}"
    if int(major) > int(PLUGIN_API.split(".")[0]):
        return f"written for plugin API {declared}; this accelbench speaks plugin API {PLUGIN_API}: upgrade accelbench"
    return ""


@functools.cache
def framework_modules() -> tuple[str, ...]:
    """The top-level modules every registered backend requires: a worker reports which of them it
    loaded (evidence that each framework lives only in its own worker)."""
    try:
        refs = PluginHost().backends()
    except UsageError:
        return ()
    return tuple(sorted({m.partition(".")[0] for r in refs for m in r.backend.describe().requires}))


def _backend_problem(backend: object) -> str | None:
    """Why this registered object cannot be run as a backend, or None."""
    if not isinstance(backend, Backend):
        return f"registered {type(backend).__name__}, which is not an accelbench.Backend"
    try:
        info = backend.describe()
    except Exception as exc:  # noqa: BLE001
        return f"{type(backend).__name__}.describe() raised {type(exc).__name__}: {exc}"
    if not isinstance(info, BackendInfo):
        return f"{type(backend).__name__}.describe() returned {type(info).__name__}, not a BackendInfo"
    try:
        problems = info.problems()
    except Exception as exc:  # noqa: BLE001 - a description too broken to check is broken
        problems = [f"malformed ({type(exc).__name__}: {exc})"]
    engine = backend.engine
    if engine is not None and (not isinstance(engine, Engine) or not IDENTIFIER.match(str(engine.name))):
        problems.append("engine must be an accelbench.launch.Engine with a name (letters, digits, _ . + -)")
    return f"backend {info.name!r}: {'; '.join(problems)}" if problems else None


def _allow_list() -> set[str] | None:
    raw = os.environ.get(ALLOW_LIST_VARIABLE)
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def _position(ref: BackendRef, names: list[str]) -> int:
    """Backends named on the command line run in the order they were named."""
    for index, name in enumerate(names):
        if name in (ref.id, ref.backend.describe().name):
            return index
    return len(names)


def _refuse_duplicates(refs: list[BackendRef]) -> None:
    seen: set[str] = set()
    for ref in refs:
        if ref.id in seen:
            raise UsageError(f"backend {ref.id} is registered twice")
        seen.add(ref.id)
