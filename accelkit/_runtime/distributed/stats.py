"""``accelkit.stats()["distributed"]``: what the process's collectives moved, how long the host
transport took, and what the target's interconnect would take.

The estimate is the bandwidth term of the ring algorithms collectives use on a torus or ring
(plus ``steps * latency`` when the device model knows a latency): all-reduce moves
``2 (n - 1) / n`` of the message per device, all-gather and reduce-scatter ``(n - 1) / n`` of the
full tensor, broadcast, reduce and point-to-point the message once. It is a lower bound from the
device model's :class:`~accelkit.sdk.Interconnect`, labelled as an estimate.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from accelkit.sdk import Interconnect

TRANSPORT = ("host-staged: device tensors are copied to host memory and moved by gloo over TCP "
             "(reduced in place where the device lends its memory as host memory)")

#: Per collective: (fraction of the message each device sends, ring steps), for world size n.
_RING = {
    "all_reduce": lambda n: (2 * (n - 1) / n, 2 * (n - 1)),
    "reduce_scatter": lambda n: ((n - 1) / n, n - 1),
    "all_gather": lambda n: ((n - 1) / n, n - 1),
    "all_to_all": lambda n: ((n - 1) / n, n - 1),
    "gather": lambda n: ((n - 1) / n, n - 1),
    "scatter": lambda n: ((n - 1) / n, n - 1),
    "broadcast": lambda n: (1.0, n - 1),
    "reduce": lambda n: (1.0, n - 1),
    "send": lambda n: (1.0, 1),
    "recv": lambda n: (1.0, 1),
    "barrier": lambda n: (0.0, 2 * (n - 1)),
}


def estimate_seconds(kind: str, nbytes: int, world: int, interconnect: Interconnect | None) -> float | None:
    """The estimated time of one collective on the target's interconnect, or None if unknown.

    :param nbytes: the message: the reduced tensor (all-reduce, reduce, broadcast), the gathered
        or scattered whole (all-gather, reduce-scatter, gather, scatter), what one rank sends
        (all-to-all, send).
    """
    if interconnect is None or world < 2:
        return None if interconnect is None else 0.0
    fraction, steps = _RING[kind](world)
    seconds = fraction * nbytes / interconnect.bandwidth
    if interconnect.latency is not None:
        seconds += steps * interconnect.latency
    return seconds


@dataclass
class _Kind:
    calls: int = 0
    bytes: int = 0
    host_seconds: float = 0.0
    estimated_seconds: float = 0.0
    world: int = 0  # the largest group the kind ran over: the world size its estimate is for


class CollectiveStats:
    """Counters per collective kind, process-wide (every group of the process adds to them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[str, _Kind] = {}
        self._groups: dict[str, int] = {}
        self._interconnect: Interconnect | None = None
        self._checks: dict[str, int] = {}
        self._staging = {"copied": 0, "lent": 0}

    def group_created(self, name: str, world: int, interconnect: Interconnect | None) -> None:
        with self._lock:
            self._groups[name] = world
            self._interconnect = interconnect

    def check_path(self, path: str) -> None:
        """A group was created whose agreement checks travel by ``path``: ``sockets`` (the
        group's own connections), ``gloo``, or ``off``."""
        with self._lock:
            self._checks[path] = self._checks.get(path, 0) + 1

    def staged(self, lent: bool) -> None:
        """A device tensor went to gloo: through a host copy, or as memory its device lent
        (:meth:`DeviceAllocator.lend_host`)."""
        with self._lock:
            self._staging["lent" if lent else "copied"] += 1

    def record(self, kind: str, nbytes: int, world: int, seconds: float) -> None:
        estimate = estimate_seconds(kind, nbytes, world, self._interconnect)
        with self._lock:
            entry = self._kinds.setdefault(kind, _Kind())
            entry.calls += 1
            entry.bytes += nbytes
            entry.host_seconds += seconds
            entry.estimated_seconds += estimate or 0.0
            entry.world = max(entry.world, world)

    def snapshot(self) -> dict[str, Any]:
        link = self._interconnect
        with self._lock:
            return {
                "transport": TRANSPORT,
                "groups": dict(self._groups),
                "agreement_checks": dict(self._checks),
                "device_tensors": dict(self._staging),
                "interconnect": None if link is None else {
                    "name": link.name, "bandwidth_per_direction": link.bandwidth,
                    "topology": link.topology, "sources": dict(link.sources),
                },
                "collectives": {k: vars(v).copy() for k, v in sorted(self._kinds.items())},
                "estimate_note": "estimated_seconds: ring-algorithm bandwidth bound on the "
                                 "target's interconnect (see the sources), not a measurement",
            }

    def reset(self) -> None:
        with self._lock:
            self._kinds.clear()
            self._staging = dict.fromkeys(self._staging, 0)


STATS = CollectiveStats()
