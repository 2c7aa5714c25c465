"""Finding backends: the plugin manager, entry-point discovery and per-backend records."""

from __future__ import annotations

import importlib.metadata
import threading
from dataclasses import dataclass, field
from typing import Any

import pluggy

from accelkit import hookspecs

hookimpl = pluggy.HookimplMarker("accelkit")

ENTRY_POINT_GROUP = "accelkit.backends"


@dataclass
class BackendRecord:
    """What the core knows about one backend: its announcement, origin and (lazily) its probe.

    ``load_error`` is set when the plugin could not be imported or registered (such a record
    has no ``info``); ``init_error`` when activation failed. Either makes it unavailable, with
    the error as the reason.
    """

    name: str
    info: Any = None  # accelkit.sdk.BackendInfo
    plugin: Any = field(default=None, repr=False)
    origin: str = ""
    load_error: str | None = None
    init_error: str | None = None
    _probe: Any = field(default=None, repr=False)

    def supports(self, hook_name: str) -> bool:
        """Whether the backend's plugin implements an optional hook (compiler, collectives)."""
        return self.plugin is not None and hasattr(self.plugin, hook_name)

    def probe(self, pm: pluggy.PluginManager) -> Any:
        """The backend's :class:`DeviceProbe`, computed once; a raising probe becomes a reason."""
        from accelkit.sdk import DeviceProbe

        if self._probe is None:
            if self.load_error:
                self._probe = DeviceProbe(False, False, reason=self.load_error)
            else:
                try:
                    answer = pm.hook.accelkit_probe(name=self.name)
                    if answer is None:
                        answer = DeviceProbe(
                            False, False, reason=f"plugin {self.origin} does not implement accelkit_probe"
                        )
                except Exception as exc:  # a probe may fail for any reason; keep it as the reason
                    answer = DeviceProbe(
                        False, False, reason=f"probe failed: {type(exc).__name__}: {exc}"
                    )
                self._probe = answer
        return self._probe


class Registry:
    """The process's plugin manager and the backends it found."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("accelkit")
        self.pm.add_hookspecs(hookspecs)
        self.backends: dict[str, BackendRecord] = {}
        self._loaded = False
        self._lock = threading.RLock()

    def load_entry_points(self) -> None:
        """Import and register every ``accelkit.backends`` entry point, once.

        A plugin that fails to import or register is kept as an unavailable record with the
        error as its reason, so one broken package never hides the others.
        """
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                if self.pm.get_plugin(ep.name) is not None or ep.name in self.backends:
                    continue
                origin = f"{ep.value} ({ep.dist.name if ep.dist else 'unknown distribution'})"
                try:
                    plugin = ep.load()
                except Exception as exc:
                    self.backends[ep.name] = BackendRecord(
                        ep.name,
                        origin=origin,
                        load_error=f"plugin {ep.value} failed to import: {type(exc).__name__}: {exc}",
                    )
                    continue
                self.register(plugin, name=ep.name, origin=origin)

    def register(self, plugin: object, name: str | None = None, origin: str = "") -> list[str]:
        """Register a plugin object or module and record the backends it announces.

        :returns: the names of the backends it announced.
        """
        origin = origin or getattr(plugin, "__name__", type(plugin).__name__)
        with self._lock:
            try:
                self.pm.register(plugin, name=name)
                infos = self.pm.subset_hook_caller(
                    "accelkit_register_backend",
                    remove_plugins=[p for p in self.pm.get_plugins() if p is not plugin],
                )()
            except Exception as exc:
                if self.pm.is_registered(plugin):
                    self.pm.unregister(plugin)
                key = name or origin
                self.backends[key] = BackendRecord(
                    key, origin=origin, load_error=f"plugin {origin} was rejected: {exc}"
                )
                return []
            names = []
            for info in infos:
                if info is None:
                    continue
                if info.name in self.backends and self.backends[info.name].info is not None:
                    raise ValueError(
                        f"backend {info.name!r} from {origin} is already provided by "
                        f"{self.backends[info.name].origin}"
                    )
                self.backends[info.name] = BackendRecord(info.name, info=info, plugin=plugin, origin=origin)
                names.append(info.name)
            return names

    def get(self, name: str) -> BackendRecord | None:
        self.load_entry_points()
        return self.backends.get(name)

    def records(self) -> list[BackendRecord]:
        self.load_entry_points()
        return list(self.backends.values())


_registry: Registry | None = None
_registry_lock = threading.Lock()


def registry() -> Registry:
    """The process-wide registry (created on first use)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = Registry()
        return _registry
