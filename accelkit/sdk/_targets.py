"""One run's estimate on several generations of the active backend (``accelkit run --estimate-on``).

The user names the targets in ``ACCELKIT_ESTIMATE_ON`` (``"v5e,v6e,trn2"``; ``accelkit run
--estimate-on`` sets it). A backend estimates those of its own generations from the same record
of the run: every program execution's device time on each target (its own model of that
generation) and the same launches and host waits, each target's ledger charging that target's
per-launch cost. Targets of another backend cannot be estimated from this run; they are listed
with the reason, and a run on that backend gives them (``accelkit compare`` puts the reports of
both runs in one table).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from accelkit.sdk._launches import LaunchLedger
from accelkit.sdk._records import DeviceModel

ESTIMATE_ON_ENV = "ACCELKIT_ESTIMATE_ON"


def requested_targets() -> list[str]:
    """The target names in ``ACCELKIT_ESTIMATE_ON``, lower-case, in order, without repeats; empty
    when it is unset."""
    names: list[str] = []
    for name in os.environ.get(ESTIMATE_ON_ENV, "").split(","):
        name = name.strip().lower()
        if name and name not in names:
            names.append(name)
    return names


def other_backend_reason(target: str, backend: str, generations: Iterable[str]) -> str:
    """Why ``target`` is not estimated by ``backend``'s run, and how to get it."""
    return (f"not a {backend} generation ({', '.join(generations)}): estimate it from a run on its own backend "
            f"(accelkit run --device <backend> --estimate-on {target} --report DIR2 ...), then "
            f"`accelkit compare DIR DIR2` shows both runs in one table")


class TargetComparison:
    """Device and launch time of one run on several target generations, from the same record.

    :param models: the device model of each target, the active one included or not; each gets
        its own :class:`LaunchLedger` with its ``launch_seconds``.
    :param not_estimated: requested targets this backend cannot estimate, with the reason.

    The backend calls :meth:`launch` for every program execution with that program's device
    time on each target (in the order of ``models``) and :meth:`wait` at every host wait.
    """

    def __init__(self, models: Sequence[DeviceModel], not_estimated: dict[str, str] | None = None) -> None:
        self.models = tuple(models)
        self.names = tuple(m.name for m in self.models)
        self.not_estimated = dict(not_estimated or {})
        self._ledgers = [LaunchLedger(m.launch_seconds) for m in self.models]
        self._lock = threading.Lock()
        self._device = [0.0] * len(self.models)

    def launch(self, device_seconds: Sequence[float]) -> None:
        """One program execution, taking ``device_seconds[i]`` on ``models[i]``."""
        self.launch_all((device_seconds,))

    def launch_all(self, device_seconds: Sequence[Sequence[float]]) -> None:
        """Program executions one after the other, the j-th taking ``device_seconds[j][i]`` on
        ``models[i]``."""
        with self._lock:
            for i, ledger in enumerate(self._ledgers):
                on_target = [seconds[i] for seconds in device_seconds]
                total = self._device[i]
                for seconds in on_target:
                    total += seconds
                self._device[i] = total
                ledger.launch_all(on_target)

    def wait(self) -> None:
        """A host wait (see :meth:`LaunchLedger.wait`)."""
        for ledger in self._ledgers:
            ledger.wait()

    def reset(self) -> None:
        with self._lock:
            self._device = [0.0] * len(self.models)
            for ledger in self._ledgers:
                ledger.reset()

    def by_target(self) -> dict[str, dict[str, Any]]:
        """``{target: {seconds, launch_seconds, total_seconds, launches, syncs}}``, the
        :attr:`Estimate.by_target` of the run."""
        with self._lock:
            device = list(self._device)
        out = {}
        for name, seconds, ledger in zip(self.names, device, self._ledgers):
            fields = ledger.fields()
            out[name] = {"seconds": seconds, "launch_seconds": fields["launch_seconds"],
                         "total_seconds": seconds + fields["launch_seconds"],
                         "launches": fields["launches"], "syncs": fields["syncs"]}
        return out
