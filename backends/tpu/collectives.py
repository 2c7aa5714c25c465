"""tpu's torch.distributed process group: host-staged through gloo over TCP (the shared one).

XLA's own cross-process collectives (PJRT's CPU client has them) would replace it; until then ICI is modelled, not used.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from accelkit.sdk import hookimpl, host_staged_process_group


@hookimpl
def accelkit_make_process_group(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    return host_staged_process_group(store, rank, world_size, timeout)
