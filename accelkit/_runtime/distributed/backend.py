"""torch.distributed for the active backend: its c10d backend, registered at activation.

``dist.init_process_group("<name>")`` (also ``init_device_mesh("<name>", ...)``, and the c10d
backend accelerate picks for the device type) reaches the backend's
``accelkit_make_process_group`` hook, which usually answers with
:func:`accelkit.sdk.host_staged_process_group`. torch.distributed is imported only when the
process uses it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from accelkit._plugins import BackendRecord


def install_distributed(ctx: Any, record: BackendRecord) -> None:
    """Register the c10d backend ``ctx.name`` for device type ``ctx.name`` (and CPU tensors on
    the same groups). A backend without the hook gets a backend that refuses with the fix."""
    import torch.distributed as dist

    if not dist.is_available() or ctx.name in dist.Backend.backend_list:
        return
    supported = record.supports("accelkit_make_process_group")

    def create(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
        from accelkit._runtime.distributed.agreement import CollectiveError
        from accelkit._runtime.distributed.stats import STATS
        from accelkit._runtime.patches import install_dtensor_random

        if not supported:
            raise CollectiveError(
                f"backend {ctx.name!r} has no collectives (its plugin does not implement "
                f"accelkit_make_process_group): init_process_group({ctx.name!r}) cannot work. Move "
                "tensors to the CPU and use the 'gloo' process group, or give the backend the hook "
                "(accelkit.sdk.host_staged_process_group is the shared implementation)."
            )
        group = record.answer(
            "accelkit_make_process_group", dist.ProcessGroup,
            store=store, rank=rank, world_size=world_size, timeout=timeout,
        )
        if group is None:
            raise CollectiveError(f"backend {ctx.name!r}: accelkit_make_process_group answered None")
        STATS.group_created(f"rank {rank} of {world_size}", world_size, ctx.model.interconnect)
        install_dtensor_random(ctx.name)
        _report_at_shutdown(group)
        return group

    dist.Backend.register_backend(ctx.name, create, devices=[ctx.name, "cpu"])


def _report_at_shutdown(group: Any) -> None:
    """In a process that reports to ``accelkit run`` (:mod:`accelkit._run.children`), also write
    the report when ``group`` is shut down (``dist.destroy_process_group``): a launcher may end
    its workers without letting them exit. Ray Train destroys the process group of every worker
    at the end of a run, then kills the worker processes, so their exit handlers never run. A
    process that goes on after that writes its report again at exit, with the figures then."""
    from accelkit._run import children

    if not children.reporting():
        return
    shutdown = group.shutdown

    def shutdown_and_report(*args: Any, **kwargs: Any) -> Any:
        try:
            return shutdown(*args, **kwargs)
        finally:
            children.write_report()

    try:
        group.shutdown = shutdown_and_report
    except AttributeError:  # a plugin's group without instance attributes: its report at exit only
        pass


def distributed_stats() -> dict[str, Any]:
    """``stats()["distributed"]``."""
    from accelkit._runtime.distributed.stats import STATS

    return STATS.snapshot()


def reset_distributed_stats() -> None:
    from accelkit._runtime.distributed.stats import STATS

    STATS.reset()
