"""The launch half of an estimate: what handing programs to the device from the host costs.

An estimate has two parts with the same meaning on every backend (issue #41):

- **device time** (``Estimate.seconds``): how long the chip is busy running the programs; the
  backend's own model (tpu: a roofline per XLA program; neuron: a simulated schedule).
- **launch time** (``Estimate.launch_seconds``): the time the device waits on the host, because
  every program execution (an XLA executable, a NEFF) costs the host the target's per-launch
  time (:attr:`DeviceModel.launch_seconds`) before the device can start it.

The rule, one for every backend: the host issues its launches one after the other, each taking
``launch_seconds``; the device runs each program once it is issued and the previous one has
finished. At each host wait (a read to the host, ``synchronize()``) the segment since the last
wait ends: its launch time is how long it took minus the device time it holds, i.e. the time
the device sat idle waiting for launches. So a program waited on alone costs
``device + launch``; a long run of small programs costs about one launch each
(``Σ launch − Σ device``, launch-bound); a few big programs hide all their launches but the
first (device-bound).

Backends only report what they know: each program execution (:meth:`LaunchLedger.launch`) and
each host wait (:meth:`LaunchLedger.wait`); :meth:`LaunchLedger.fields` gives the
:class:`Estimate` its launch fields.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


class LaunchLedger:
    """Launches and host waits since the last :meth:`reset`, and the launch time they expose.

    :param launch_seconds: host time per program execution on the target
        (:attr:`DeviceModel.launch_seconds`); 0 counts launches and waits but charges nothing.
    """

    def __init__(self, launch_seconds: float = 0.0) -> None:
        if launch_seconds < 0:
            raise ValueError("launch_seconds must not be negative")
        self.launch_seconds = launch_seconds
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget every launch and wait (``accelkit.reset_stats()``)."""
        with self._lock:
            self._launches = 0
            self._syncs = 0
            self._exposed = 0.0  # launch time of the segments closed by a wait
            self._open_segment()

    def _open_segment(self) -> None:
        # Clocks relative to the segment's start: when the host has issued its last launch,
        # when the device finishes the last program issued, and the device time in between.
        self._host = 0.0
        self._device = 0.0
        self._busy = 0.0
        self._segment_launches = 0

    def launch(self, device_seconds: float) -> None:
        """One program execution whose device time is ``device_seconds``."""
        self.launch_all((device_seconds,))

    def launch_all(self, device_seconds: Sequence[float]) -> None:
        """Program executions one after the other, the i-th taking ``device_seconds[i]``: the
        host issues each ``launch_seconds`` after the previous one, and the device starts it
        once it is issued and the previous program has finished (a backend that records its
        launches in batches hands them over here in one step)."""
        with self._lock:
            step = self.launch_seconds
            host, device, busy = self._host, self._device, self._busy
            for seconds in device_seconds:
                host += step
                device = (device if device > host else host) + seconds
                busy += seconds
            self._host, self._device, self._busy = host, device, busy
            self._launches += len(device_seconds)
            self._segment_launches += len(device_seconds)

    def wait(self) -> None:
        """The host waits for the device (a read to the host, ``synchronize()``). A wait with
        nothing launched since the previous one costs nothing and is not counted."""
        with self._lock:
            if not self._segment_launches:
                return
            self._syncs += 1
            self._exposed += max(0.0, self._device - self._busy)
            self._open_segment()

    def fields(self) -> dict[str, Any]:
        """``launch_seconds``, ``launches`` and ``syncs`` for :class:`Estimate`. Launches not yet
        waited for count as if waited for now (the run ends by waiting for them)."""
        with self._lock:
            return {"launch_seconds": self._exposed + max(0.0, self._device - self._busy),
                    "launches": self._launches, "syncs": self._syncs}
