"""A rank that disagrees, dies or stays silent: what the others see."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from accelkit.sdk.testing.distributed_cases._group import _join, _outcome


def scenario_mismatch() -> dict[str, Any]:
    import torch.distributed as dist

    device, _gloo, rank, world = _join()
    findings = {}
    findings["sizes"] = _outcome(lambda: dist.all_reduce(torch.ones(4 if rank == 0 else 6, device=device)))
    findings["dtypes"] = _outcome(lambda: dist.all_reduce(
        torch.ones(4, device=device, dtype=torch.float32 if rank == 0 else torch.int32)))
    findings["collectives"] = _outcome(lambda: dist.all_reduce(torch.ones(4, device=device)) if rank == 0
                                       else dist.broadcast(torch.ones(4, device=device), src=0))
    findings["roots"] = _outcome(lambda: dist.broadcast(torch.ones(4, device=device), src=rank))
    findings["all_gather_output"] = _outcome(lambda: dist.all_gather(
        [torch.empty(3, device=device) for _ in range(world + (rank == 0))], torch.ones(3, device=device)))
    # rank 0 sends 2 elements to the last rank, which expects 1 from each rank.
    sends = [1] * (world - 1) + [2 if rank == 0 else 1]
    findings["all_to_all_splits"] = _outcome(lambda: dist.all_to_all_single(
        torch.empty(world, device=device), torch.ones(sum(sends), device=device), [1] * world, sends))
    received = torch.full((5,), 7.0, device=device)
    if rank == 0:
        findings["send_recv_sizes"] = _outcome(lambda: dist.send(torch.ones(3, device=device), 1))
    elif rank == 1:
        findings["send_recv_sizes"] = _outcome(lambda: dist.recv(received, 0))
    findings["received_unchanged"] = bool(torch.equal(received.cpu(), torch.full((5,), 7.0)))
    x = torch.full((3,), float(rank + 1), device=device)
    dist.all_reduce(x)
    findings["usable_after"] = x.cpu().tolist() == [float(sum(range(1, world + 1)))] * 3
    dist.barrier()
    import accelkit

    findings["agreement_checks"] = accelkit.stats()["distributed"]["agreement_checks"]
    return findings


def scenario_dead_rank() -> dict[str, Any]:
    import torch.distributed as dist

    device, _gloo, rank, world = _join(timeout_s=float(os.environ.get("ACCELKIT_TEST_TIMEOUT", "10")))
    dist.barrier()
    if rank == world - 1:
        os._exit(17)
    return {"all_reduce": _outcome(lambda: dist.all_reduce(torch.ones(4, device=device)))}


def scenario_timeout() -> dict[str, Any]:
    import torch.distributed as dist

    timeout = float(os.environ.get("ACCELKIT_TEST_TIMEOUT", "4"))
    device, _gloo, rank, world = _join(timeout_s=timeout)
    dist.barrier()
    if rank == world - 1:
        time.sleep(timeout * 2.5)
        return {"slept": True}
    return {"all_reduce": _outcome(lambda: dist.all_reduce(torch.ones(4, device=device))), "timeout": timeout}
