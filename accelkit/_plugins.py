"""Finding backends: the plugin manager, entry-point discovery, who owns each backend name, and
the one door through which the core calls a plugin.

Calling plugin code: every call goes through :meth:`BackendRecord.call` (loading uses the same
guard). A hook runs on the plugin that owns the backend only, never on the others, so a plugin
that ignores the hooks' ``name`` argument cannot answer for another backend. Anything plugin
code raises, ``SystemExit`` and other ``BaseException`` subclasses included, becomes a
:class:`PluginError` naming the plugin and the hook; only ``KeyboardInterrupt`` passes through.

Owning a name: when two entry points announce one backend name,

- an in-tree backend (an entry point of the ``accelkit`` distribution) keeps it, and the other
  plugin's claim is refused;
- between two third-party plugins neither is used: the backend is unavailable and the reason
  names both;
- a name PyTorch itself parses as a device type (``cuda``, ``meta``, ``xla``, ...) is refused.

A plugin registered at run time (:meth:`Registry.register`) whose name is taken is refused with
:class:`BackendConflictError`. Every refused claim is kept in :attr:`Registry.conflicts`, which
``accelkit devices`` shows.
"""

from __future__ import annotations

import importlib.metadata
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy
import torch

from accelkit import hookspecs
from accelkit._errors import BackendConflictError, PluginError


ENTRY_POINT_GROUP = "accelkit.backends"
#: The distribution whose entry points are the in-tree backends (ref, tpu, neuron).
IN_TREE_DISTRIBUTION = "accelkit"


def describe(exc: BaseException) -> str:
    """``"SystemExit: 3"``; only the type's name when the exception has no message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def guarded(prefix: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, with anything it raises but ``KeyboardInterrupt`` turned into a
    :class:`PluginError` whose message is ``prefix`` followed by the exception."""
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - plugin code may raise anything, SystemExit too
        raise PluginError(f"{prefix}{describe(exc)}") from exc


def call_hook(pm: pluggy.PluginManager, plugin: object, origin: str, hook: str, **kwargs: Any) -> Any:
    """Call ``hook`` on ``plugin`` alone (pluggy's subset caller); raises :class:`PluginError`."""

    def on_plugin_only() -> Any:
        others = [p for p in pm.get_plugins() if p is not plugin]
        return pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)

    return guarded(f"plugin {origin}: {hook} raised ", on_plugin_only)


@dataclass
class BackendRecord:
    """What the core knows about one backend name: its announcement, owner and (lazily) probe.

    ``load_error`` is set when no plugin can serve the name: its plugin failed to import,
    register or announce, or two third-party plugins claim it (such a record has no ``plugin``).
    ``init_error`` is set when activation failed. Either makes the backend unavailable, with the
    error as the reason.
    """

    name: str
    info: Any = None  # accelkit.sdk.BackendInfo
    plugin: Any = field(default=None, repr=False)
    origin: str = ""
    in_tree: bool = False
    load_error: str | None = None
    init_error: str | None = None
    pm: pluggy.PluginManager | None = field(default=None, repr=False)
    _probe: Any = field(default=None, repr=False)

    def supports(self, hook_name: str) -> bool:
        """Whether the backend's plugin implements an optional hook (compiler, collectives).

        Read from the plugin manager's records, so no plugin code runs.
        """
        if self.plugin is None or self.pm is None:
            return False
        caller = getattr(self.pm.hook, hook_name, None)
        return caller is not None and any(impl.plugin is self.plugin for impl in caller.get_hookimpls())

    def call(self, hook: str, **kwargs: Any) -> Any:
        """Call ``hook`` on this backend's plugin only and return its answer.

        Firstresult hooks give the plugin's answer (or ``None``), 1:N hooks a list of at most one.

        :raises PluginError: the hook raised (anything but ``KeyboardInterrupt``), or no plugin
            serves this name; the message names the plugin, the hook and the exception.
        """
        if self.plugin is None or self.pm is None:
            raise PluginError(f"backend {self.name!r} has no usable plugin: {self.load_error}")
        return call_hook(self.pm, self.plugin, self.origin, hook, **kwargs)

    def answer(self, hook: str, expected: type | tuple[type, ...], **kwargs: Any) -> Any:
        """The plugin's answer to the firstresult ``hook`` (``name`` is passed for it):
        ``None`` or an instance of ``expected``.

        :raises PluginError: the hook raised, or answered with another type (named).
        """
        value = self.call(hook, name=self.name, **kwargs)
        if value is not None and not isinstance(value, expected):
            wanted = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
            raise PluginError(f"plugin {self.origin}: {hook} returned {type(value).__name__}, not {wanted}")
        return value

    def plugin_file(self) -> str | None:
        """The file of the module that defines the plugin (for files shipped next to it)."""
        import sys

        module = self.plugin if isinstance(self.plugin, type(sys)) else sys.modules.get(type(self.plugin).__module__)
        return getattr(module, "__file__", None)

    def probe(self) -> Any:
        """The backend's :class:`DeviceProbe`, computed once; a raising probe becomes a reason."""
        if self._probe is None:
            self._probe = self._ask_probe()
        return self._probe

    def _ask_probe(self) -> Any:
        from accelkit.sdk import DeviceProbe

        if self.load_error:
            return DeviceProbe(False, False, reason=self.load_error)
        try:
            answer = self.call("accelkit_probe", name=self.name)
        except PluginError as exc:
            return DeviceProbe(False, False, reason=str(exc))
        if answer is None:
            return DeviceProbe(False, False, reason=f"plugin {self.origin} does not implement accelkit_probe")
        if not isinstance(answer, DeviceProbe):
            return DeviceProbe(
                False, False,
                reason=f"plugin {self.origin}: accelkit_probe returned {type(answer).__name__}, "
                "not accelkit.sdk.DeviceProbe",
            )
        return answer


@dataclass
class _Claim:
    """One plugin's claim on a backend name, before ownership is settled.

    ``name`` is the announced name, or the entry point's name when the plugin failed before
    announcing one (then ``error`` says why).
    """

    name: str
    origin: str
    in_tree: bool
    plugin: Any = None
    info: Any = None
    error: str | None = None


def _torch_device_type(name: str) -> bool:
    """Whether PyTorch already parses ``name`` as a device type of its own (``cuda``, ``meta``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.device('mkldnn') warns that it is deprecated
            torch.device(name)
    except RuntimeError:
        return False
    return True


class Registry:
    """The process's plugin manager, the backends it found and the claims it refused."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("accelkit")
        self.pm.add_hookspecs(hookspecs)
        self.backends: dict[str, BackendRecord] = {}
        #: backend (or built-in device) name -> one sentence per refused claim on it.
        self.conflicts: dict[str, list[str]] = {}
        self._loaded = False
        self._lock = threading.RLock()

    # -- entry points ----------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        """Import and register every ``accelkit.backends`` entry point, once, then settle who
        owns each name.

        A plugin that fails to import, register or announce is kept as an unavailable record (or,
        when its entry point's name is taken, as a conflict of that name) with the error as its
        reason, so one broken package never hides the others.
        """
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            claims: dict[str, list[_Claim]] = {}
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                claim = self._claim_entry_point(ep)
                if claim is not None:
                    claims.setdefault(claim.name, []).append(claim)
            for name, group in claims.items():
                self._settle(name, group)

    def _claim_entry_point(self, ep: importlib.metadata.EntryPoint) -> _Claim | None:
        """Load one entry point: its claim, or None when its plugin hosts no backend."""
        dist = ep.dist.name if ep.dist is not None else None
        origin = f"{ep.value} ({dist or 'unknown distribution'})"
        in_tree = dist is not None and dist.replace("_", "-").lower() == IN_TREE_DISTRIBUTION
        claim = _Claim(ep.name, origin, in_tree)
        try:
            plugin = guarded(f"plugin {origin} failed to import: ", ep.load)
            info = self._announce(plugin, origin, f"{dist}:{ep.name}")
        except PluginError as exc:
            claim.error = str(exc)
            return claim
        if info is None:
            return None
        claim.name, claim.plugin, claim.info = info.name, plugin, info
        return claim

    def _settle(self, name: str, claims: list[_Claim]) -> None:
        """Record the owner of ``name`` among the entry points that claim it, and every refusal."""
        announced = [c for c in claims if c.info is not None]
        refusals = [c.error for c in claims if c.error]
        in_tree = next((c for c in announced if c.in_tree), None)
        if _torch_device_type(name):
            refusals += [self._refuse(c, f"{name!r} is a PyTorch device type") for c in announced]
        elif in_tree is not None:
            self.backends[name] = self._record(in_tree)
            refusals += [
                self._refuse(c, f"{name!r} is accelkit's in-tree backend ({in_tree.origin}), "
                             "which a plugin cannot replace; rename the plugin's backend")
                for c in announced if c is not in_tree
            ]
        elif len(announced) == 1:
            self.backends[name] = self._record(announced[0])
        elif announced:
            announced.sort(key=lambda c: c.origin)  # the message must not depend on sys.path order
            origins = [c.origin for c in announced]
            self.backends[name] = BackendRecord(
                name,
                origin=", ".join(origins),
                load_error=(
                    f"backend name {name!r} is announced by {len(origins)} plugins, "
                    f"{_and(origins)}; accelkit uses none of them. Uninstall all but one."
                ),
            )
            for c in announced:
                others = _and([o.origin for o in announced if o is not c])
                why = f"{others} announces {name!r} too, and accelkit chooses neither"
                refusals.append(self._refuse(c, why))
        else:  # every claim failed to load: the first one's error is the backend's reason
            self.backends[name] = BackendRecord(name, origin=claims[0].origin, load_error=refusals.pop(0))
        if refusals:
            self.conflicts.setdefault(name, []).extend(refusals)

    # -- registering -----------------------------------------------------------------------------

    def register(self, plugin: object) -> list[str]:
        """Register a plugin object or module at run time and record the backend it announces.

        :returns: the names of the backends it announced (``[]`` when it hosts none).
        :raises PluginError: the plugin failed to register or to announce itself.
        :raises BackendConflictError: the name it announces is already taken (by an installed
            or an earlier registered plugin) or is a PyTorch device type; the message names both
            plugins, and nothing is registered.
        """
        origin = getattr(plugin, "__name__", None) or f"{type(plugin).__qualname__} object"
        origin = f"{origin} (accelkit.register_backend)"
        with self._lock:
            info = self._announce(plugin, origin, None)
            if info is None:
                return []
            claim = _Claim(info.name, origin, False, plugin, info)
            owner = self.backends.get(info.name)
            if owner is not None:
                why = f"{info.name!r} is already provided by {owner.origin}"
                if owner.in_tree:
                    why = (
                        f"{info.name!r} is accelkit's in-tree backend ({owner.origin}), which a "
                        "plugin cannot replace"
                    )
            elif _torch_device_type(info.name):
                why = f"{info.name!r} is a PyTorch device type"
            else:
                self.backends[info.name] = self._record(claim)
                return [info.name]
            refusal = self._refuse(claim, why)
            self.conflicts.setdefault(info.name, []).append(refusal)
            raise BackendConflictError(f"{refusal}. Give the backend another name.")

    def unregister(self, plugin: object) -> None:
        """Forget a plugin and the backends it owns (the tests' clean-up)."""
        with self._lock:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            for name in [n for n, r in self.backends.items() if r.plugin is plugin]:
                del self.backends[name]

    def _announce(self, plugin: object, origin: str, pm_name: str | None) -> Any:
        """Register ``plugin`` with the plugin manager and return its :class:`BackendInfo`.

        :raises PluginError: registration or the announcement failed; the plugin is then not
            registered.
        """
        from accelkit.sdk import BackendInfo

        if self.pm.is_registered(plugin):
            raise PluginError(f"plugin {origin} is already registered (under another name)")
        try:
            guarded(f"plugin {origin} could not be registered: ", self.pm.register, plugin, name=pm_name)
        except PluginError:
            if self.pm.is_registered(plugin):  # pluggy records the plugin before reading its hooks
                self.pm.unregister(plugin)
            raise
        try:
            info = call_hook(self.pm, plugin, origin, "accelkit_register_backend")
            if isinstance(info, list):  # 1:N hook on one plugin: at most one answer
                info = next((answer for answer in info if answer is not None), None)
            if info is not None and not isinstance(info, BackendInfo):
                raise PluginError(
                    f"plugin {origin}: accelkit_register_backend returned {type(info).__name__}, "
                    "not accelkit.sdk.BackendInfo"
                )
        except PluginError:
            self.pm.unregister(plugin)
            raise
        if info is None:
            self.pm.unregister(plugin)  # it hosts no backend, so none of its hooks is ever called
        return info

    def _record(self, claim: _Claim) -> BackendRecord:
        return BackendRecord(
            claim.name, info=claim.info, plugin=claim.plugin, origin=claim.origin,
            in_tree=claim.in_tree, pm=self.pm,
        )

    def _refuse(self, claim: _Claim, why: str) -> str:
        """Unregister a refused claim's plugin (none of its hooks runs again) and say why."""
        if claim.plugin is not None and self.pm.is_registered(claim.plugin):
            self.pm.unregister(claim.plugin)
        return f"plugin {claim.origin} announces {claim.name!r}, refused: {why}"

    # -- reading ---------------------------------------------------------------------------------

    def get(self, name: str) -> BackendRecord | None:
        self.load_entry_points()
        return self.backends.get(name)

    def records(self) -> list[BackendRecord]:
        self.load_entry_points()
        return list(self.backends.values())


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


_registry: Registry | None = None
_registry_lock = threading.Lock()


def registry() -> Registry:
    """The process-wide registry (created on first use)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = Registry()
        return _registry
