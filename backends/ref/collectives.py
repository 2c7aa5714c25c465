"""ref's torch.distributed process group: host-staged through gloo over TCP (the shared one).

ref is the reference: it moves bytes exactly as gloo on CPU does, which the distributed conformance suite compares the other backends with.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from accelkit.sdk import hookimpl, host_staged_process_group


@hookimpl
def accelkit_make_process_group(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    return host_staged_process_group(store, rank, world_size, timeout)
