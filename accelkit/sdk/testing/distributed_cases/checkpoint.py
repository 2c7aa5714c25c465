"""DCP checkpoints of FSDP2-sharded models, saved and loaded on the same and on another number of ranks."""

from __future__ import annotations

import os
from typing import Any

import torch

from accelkit.sdk.testing.distributed_cases._group import _join
from accelkit.sdk.testing.distributed_cases.training import _batches, _model, _parameters, _train


def scenario_checkpoint(directory: str) -> dict[str, Any]:
    """Train FSDP2-sharded, save with DCP, load into a freshly initialised sharded model; the
    full parameters saved are also written beside the checkpoint (``<directory>.pt``) for
    :func:`scenario_checkpoint_reshard`."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    device, _gloo, rank, world = _join()
    model = _model().to(device)
    fully_shard(model)
    _train(model, _batches(2, 8), device, rank, world)
    dcp.save(get_model_state_dict(model), checkpoint_id=directory)
    saved = _parameters(model)
    if rank == 0:
        torch.save(saved, directory + ".pt")
    dist.barrier()

    loaded, changed = _load_sharded(directory, device, saved)
    return {
        "fresh_differs": changed,
        "round_trip_equal": all(torch.equal(a, b) for a, b in zip(loaded, saved)),
        "files": sorted(os.listdir(directory)),
        "local_device": str(model[0].weight.to_local().device),
    }


def _load_sharded(directory: str, device: torch.device, saved: list[torch.Tensor]) -> tuple[list, bool]:
    """A new model sharded over this world, initialised with another seed, then loaded from the
    checkpoint: (its full parameters, whether the fresh ones differed from ``saved``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(99)
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
    fully_shard(fresh)
    changed = not all(torch.equal(a, b) for a, b in zip(_parameters(fresh), saved))
    state = get_model_state_dict(fresh)
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(fresh, state)
    return _parameters(fresh), changed


def scenario_checkpoint_reshard(directory: str) -> dict[str, Any]:
    """Load a checkpoint that :func:`scenario_checkpoint` saved from another number of ranks:
    DCP reshards it onto this world's FSDP2 shards."""
    device, _gloo, _rank, world = _join()
    saved = torch.load(directory + ".pt")
    loaded, changed = _load_sharded(directory, device, saved)
    return {
        "world": world,
        "fresh_differs": changed,
        "resharded_equal": all(torch.equal(a, b) for a, b in zip(loaded, saved)),
    }
