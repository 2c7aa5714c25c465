"""The run a conformance process belongs to: backend, profile, dtypes and declarations.

The pytest plugin creates it at configure time (before any suite module is imported); the
suites read it with :func:`current` to decide what to parametrize and how to compare.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from accelkit_conformance.expectations import Declared
from accelkit_conformance.profiles import Profile


@dataclass(frozen=True)
class Settings:
    """One conformance run in this process.

    :ivar backend: the accelkit backend under test.
    :ivar profile: how much of each suite runs.
    :ivar dtypes: dtype names the ops and modules suites run in.
    :ivar declared: the backend's declared expectations.
    :ivar device: ``torch.device(backend, 0)`` in a process that runs tests, else None.
    """

    backend: str
    profile: Profile
    dtypes: tuple[str, ...]
    declared: Declared
    device: torch.device | None = None

    @property
    def torch_dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(getattr(torch, d) for d in self.dtypes)


_current: Settings | None = None


def install(settings: Settings) -> None:
    global _current
    _current = settings


def current() -> Settings:
    """The run's settings; raises with the way to start a run when there is none."""
    if _current is None or _current.device is None:
        raise RuntimeError(
            "the accelkit conformance suites run under their pytest plugin: use "
            "`accelkit conformance run --backend NAME`, or "
            "`pytest -p accelkit_conformance.plugin --accelkit-backend NAME <suite files>`"
        )
    return _current
