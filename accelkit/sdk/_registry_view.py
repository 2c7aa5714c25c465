"""A read-only view of the backends accelkit found, for tools that inspect backends without
activating one (the conformance suite, a backend's own CI)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from accelkit.sdk._kernels import AutocastPolicy
from accelkit.sdk._records import BackendInfo, DeviceProbe, Expectations


@dataclass(frozen=True)
class BackendView:
    """One discovered backend name, read-only.

    :ivar name: the backend's name.
    :ivar origin: the entry point (or registered object) behind it, with its distribution.
    :ivar in_tree: whether it ships with accelkit.
    :ivar info: its announcement; ``None`` when no plugin can serve the name.
    :ivar load_error: why no plugin can serve the name (import failure, conflict), else ``None``.
    """

    name: str
    origin: str
    in_tree: bool
    info: BackendInfo | None
    load_error: str | None
    _record: Any

    def probe(self) -> DeviceProbe:
        """Whether it can run here (computed once per process; a raising probe is a reason)."""
        return self._record.probe()

    def implements(self, hook: str) -> bool:
        """Whether its plugin implements ``hook`` (e.g. ``"accelkit_make_compiler"``); no plugin
        code runs."""
        return self._record.supports(hook)

    def expectations(self) -> Expectations:
        """Its declared gaps, the core's default filled in (see
        :func:`accelkit.hookspecs.accelkit_conformance_expectations`).

        :raises accelkit.PluginError: the hook raised or answered with another type.
        :raises ValueError: its expectations file is malformed.
        """
        from accelkit._contract import expectations

        return expectations(self._record)

    def autocast_policy(self) -> AutocastPolicy:
        """Its autocast policy, the core's default filled in.

        :raises accelkit.PluginError: the hook raised or answered with another type.
        """
        from accelkit._contract import autocast_policy

        return autocast_policy(self._record)

    def fallback_policy(self) -> str:
        """The CPU-fallback policy it would run with: ``ACCELKIT_FALLBACK``, else its default.

        :raises accelkit.AccelkitError: ``ACCELKIT_FALLBACK`` names no policy.
        """
        from accelkit.sdk._runtime_link import fallback_policy_from_env

        return fallback_policy_from_env(self.info.default_fallback if self.info is not None else "warn")


def backends() -> Mapping[str, BackendView]:
    """Every backend name accelkit found (plugins loaded on first use), read-only, by name.

    Refused claims (a name two plugins announce) appear as views with a ``load_error``.
    """
    from accelkit._plugins import registry

    return MappingProxyType({
        r.name: BackendView(r.name, r.origin, r.in_tree, r.info, r.load_error, r)
        for r in registry().records()
    })
