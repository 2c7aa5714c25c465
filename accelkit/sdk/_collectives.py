"""Collectives: the shared c10d process group a backend answers ``accelkit_make_process_group``
with, when its bytes travel through host memory (gloo over TCP) rather than the device's own
interconnect."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def host_staged_process_group(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    """A ``torch.distributed.ProcessGroup`` for the active backend's device: every collective checks
    that the ranks' arguments agree (else every rank raises ``CollectiveMismatchError``), stages
    device tensors through host memory, runs gloo's collective, and writes the results back into
    the device tensors. Timeouts and dead ranks raise ``CollectiveError`` within ``timeout``.
    Reduce ops are gloo's, except ``PREMUL_SUM`` and ``AVG``, which are NCCL's: gloo's SUM with
    the multiplication (or integer AVG's division) done on the device.

    The arguments are the hook's, passed through::

        @hookimpl
        def accelkit_make_process_group(store, rank, world_size, timeout):
            return host_staged_process_group(store, rank, world_size, timeout)

    :raises AccelkitError: no backend is active (c10d creates groups only after activation).
    """
    from accelkit.sdk._runtime_link import host_staged_group

    return host_staged_group(store, rank, world_size, timeout)
