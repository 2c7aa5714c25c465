"""Random numbers on shards against the whole tensor, and models initialised sharded from the meta device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accelkit.sdk.testing.distributed_cases._group import _join
from accelkit.sdk.testing.distributed_cases.training import _batches, _parameters, _train, _trained


def _random_draws() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Random initialisations and ops as models use them, each writing a tensor it is given."""
    return {
        "uniform_": lambda t: t.uniform_(-2.0, 3.0),
        "normal_": lambda t: torch.nn.init.normal_(t, 0.5, 2.0),
        "trunc_normal_": lambda t: torch.nn.init.trunc_normal_(t, std=0.02),
        "kaiming_uniform_": lambda t: torch.nn.init.kaiming_uniform_(t, a=5**0.5),
        "bernoulli_": lambda t: t.bernoulli_(0.3),
        "dropout": lambda t: torch.nn.functional.dropout(t.fill_(1.5), 0.4),
    }


def scenario_sharded_random() -> dict[str, Any]:
    """DTensor random ops on every placement of a 1-D mesh (and of a 2-D one with 4 ranks) hold
    exactly the values of the same op on the whole tensor, and leave every rank's device
    generator where the whole op leaves it. The shape divides unevenly over the ranks."""
    import torch.distributed.tensor as dt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    device, _gloo, rank, world = _join()
    module = getattr(torch, device.type)
    layouts = {"1-d": (init_device_mesh(device.type, (world,)), [[Shard(0)], [Shard(1)], [Replicate()]])}
    if world == 4:
        layouts["2-d"] = (init_device_mesh(device.type, (2, 2)),
                          [[Shard(0), Shard(1)], [Shard(1), Shard(0)], [Replicate(), Shard(1)], [Shard(0), Shard(0)]])
    shape = (7, 10)
    compared, different = 0, []
    for layout, (mesh, placements_list) in layouts.items():
        for placements in placements_list:
            for name, draw in _random_draws().items():
                torch.manual_seed(11)
                sharded = draw(dt.empty(shape, device_mesh=mesh, placements=placements))
                state = module.get_rng_state()
                got = sharded.full_tensor().cpu()
                torch.manual_seed(11)
                whole = draw(torch.empty(shape, device=device)).cpu()
                compared += 1
                if not torch.equal(got, whole):
                    different.append(f"{layout} {placements} {name}: values")
                if not torch.equal(state, module.get_rng_state()):
                    different.append(f"{layout} {placements} {name}: generator state")
    return {"compared": compared, "different": different, "state_bytes": int(module.get_rng_state().numel())}


def _meta_built() -> torch.nn.Module:
    with torch.device("meta"):
        return torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.GELU(), torch.nn.Linear(24, 4))


def _initialise(model: torch.nn.Module) -> None:
    """TorchTitan's way: every weight and bias drawn from the device generator after seeding."""
    torch.manual_seed(5)
    for layer in (model[0], model[2]):
        torch.nn.init.trunc_normal_(layer.weight, std=0.2)
        torch.nn.init.normal_(layer.bias, std=0.1)


def _fully_shard(model: torch.nn.Module, mesh: Any) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def scenario_fsdp2_meta_init() -> dict[str, Any]:
    """A model built on the meta device, sharded with FSDP2 (bfloat16 parameters, float32
    reduction), moved with ``to_empty`` and initialised randomly equals the model built and
    initialised whole on the device, bit for bit; and it trains as the same FSDP2 model on one
    rank does on the full batch (the reference runs in every rank's process, on a mesh of that
    rank alone)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    device, gloo, rank, world = _join()
    sharded = _meta_init_sharded(device, init_device_mesh(device.type, (world,)))
    whole = _meta_built().to_empty(device=device)
    _initialise(whole)
    init_equal = all(torch.equal(a, b) for a, b in zip(_parameters(sharded), _parameters(whole)))

    own = [dist.new_group([r]) for r in range(world)][rank]
    alone = _meta_init_sharded(device, DeviceMesh.from_group(own, device.type))
    batches = _batches(3, 8)
    rank_losses = _train(sharded, batches, device, rank, world)
    losses = torch.tensor(rank_losses)
    dist.all_reduce(losses, group=gloo)
    losses /= world  # the full batch's loss is the mean of the ranks' slice losses
    single = torch.tensor(_train(alone, batches, device))
    got, want = _parameters(sharded), _parameters(alone)
    return {
        "init_equal": init_equal,
        "local_shape": list(sharded[0].weight.to_local().shape),
        "losses": losses.tolist(), "single_rank_losses": single.tolist(),
        "max_loss_difference": float((losses - single).abs().max()),
        "max_parameter_difference": max(float((g - w).abs().max()) for g, w in zip(got, want)),
        "trained": _trained(sharded, rank_losses),
    }


def _meta_init_sharded(device: torch.device, mesh: Any) -> torch.nn.Module:
    """:func:`_meta_built`, sharded over ``mesh`` (:func:`_fully_shard`), moved to ``device`` with
    ``to_empty`` and initialised there (:func:`_initialise`)."""
    model = _meta_built()
    _fully_shard(model, mesh)
    model.to_empty(device=device)
    _initialise(model)
    return model


def _fsdp2_meta_init_training(device: torch.device, rank: int, world: int) -> tuple[torch.nn.Module, list[float]]:
    """:func:`_meta_init_sharded` over every rank, trained on ``_batches(3, 8)``: (the model, this
    rank's losses)."""
    from torch.distributed.device_mesh import init_device_mesh

    model = _meta_init_sharded(device, init_device_mesh(device.type, (world,)))
    return model, _train(model, _batches(3, 8), device, rank, world)
