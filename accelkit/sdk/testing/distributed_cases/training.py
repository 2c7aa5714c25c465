"""Training on the device's ranks against one process on the CPU: DDP, FSDP2, mixed precision, DTensor."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from accelkit.sdk.testing.distributed_cases._group import _join


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batches(steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g)) for _ in range(steps)]


def _train(model: torch.nn.Module, batches: list, device: torch.device, rank: int = 0, world: int = 1) -> list[float]:
    """SGD on the mean-squared error; each rank takes its contiguous slice of every batch, so the
    mean of the ranks' gradients is the full batch's gradient."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches:
        rows = x.shape[0] // world
        xs, ys = x[rank * rows:(rank + 1) * rows].to(device), y[rank * rows:(rank + 1) * rows].to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v.cpu()) for v in losses]


def _parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return [(p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu() for p in model.parameters()]


def _trained(model: torch.nn.Module, losses: list[float]) -> dict[str, list[float]]:
    return {"losses": losses, "parameters": torch.cat([p.flatten() for p in _parameters(model)]).tolist()}


def _compare_training(device_model: torch.nn.Module, losses: list[float], world: int,
                      low_precision: bool = False) -> dict[str, Any]:
    """Compare with the single-process full-batch run on the CPU; ``low_precision`` (bf16
    compute) loosens the tolerance to bf16's resolution."""
    import torch.distributed as dist

    reference = _model()
    reference_losses = _train(reference, _batches(4, 8), torch.device("cpu"))
    # The full-batch loss is the mean of the ranks' slice losses.
    mean = torch.tensor(losses)
    dist.all_reduce(mean, op=dist.ReduceOp.SUM, group=dist.new_group(backend="gloo"))
    mean /= world
    got, want = _parameters(device_model), _parameters(reference)
    rtol, atol = (2e-2, 2e-2) if low_precision else (1e-5, 1e-6)
    return {
        "losses": mean.tolist(), "reference_losses": reference_losses,
        "losses_close": bool(torch.allclose(mean, torch.tensor(reference_losses), rtol=rtol, atol=atol)),
        "parameters_close": all(torch.allclose(g, w, rtol=rtol, atol=atol) for g, w in zip(got, want)),
        "max_parameter_difference": max(float((g - w).abs().max()) for g, w in zip(got, want)),
    }


def _ddp_training(device: torch.device, rank: int, world: int) -> tuple[torch.nn.Module, list[float]]:
    """:func:`_model` under DDP with several gradient buckets, trained on ``_batches(4, 8)``:
    (the model, this rank's losses)."""
    from torch.nn.parallel import DistributedDataParallel

    model = _model().to(device)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.0001)  # several gradient buckets
    return model, _train(ddp, _batches(4, 8), device, rank, world)


def scenario_ddp() -> dict[str, Any]:
    device, _gloo, rank, world = _join()
    model, losses = _ddp_training(device, rank, world)
    import accelkit

    findings = _compare_training(model, losses, world)
    distributed = accelkit.stats()["distributed"]
    findings["all_reduce_calls"] = distributed["collectives"]["all_reduce"]["calls"]
    findings["agreement_checks"] = distributed["agreement_checks"]  # which path each group's checks took
    findings["trained"] = _trained(model, losses)
    return findings


def scenario_fsdp2() -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device, _gloo, rank, world = _join()
    precision = os.environ.get("ACCELKIT_TEST_PRECISION", "float32")
    model = _model().to(device)
    policy = MixedPrecisionPolicy(param_dtype=getattr(torch, precision), reduce_dtype=torch.float32)
    for layer in (model[0], model[2]):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    shard = model[0].weight
    findings = {"shard_shape": list(shard.to_local().shape), "shard_device": str(shard.to_local().device)}
    losses = _train(model, _batches(4, 8), device, rank, world)
    findings.update(_compare_training(model, losses, world, low_precision=precision != "float32"))
    return findings


def _mixed_precision_reference(batches: list) -> tuple[torch.nn.Module, list[float]]:
    """One process on the CPU, the whole batch, the model unsharded, computing what FSDP2's
    ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` computes: forward and
    backward in a bfloat16 copy of the float32 parameters (on inputs cast to bfloat16, as FSDP's
    root casts them), the bfloat16 gradients cast to float32 for SGD on the float32 parameters."""
    import copy

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches:
        low = copy.deepcopy(model).to(torch.bfloat16)
        loss = torch.nn.functional.mse_loss(low(x.to(torch.bfloat16)), y)
        loss.backward()
        for param, low_param in zip(model.parameters(), low.parameters()):
            param.grad = low_param.grad.float()
        opt.step()
        losses.append(float(loss))
    return model, losses


def _fsdp2_mixed(device: torch.device, rank: int, world: int, shape: tuple[int, ...],
                 divide: float | None) -> dict[str, Any]:
    """Train :func:`_model` with FSDP2 on a mesh of ``shape`` (HSDP on a 2-D one: replicas x
    shards) and ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`` on every layer
    and the root, ``reshard_after_forward=True``; compare with :func:`_mixed_precision_reference`.

    ``divide`` sets FSDP's gradient divide factor F, which FSDP reduce-scatters with
    ``PREMUL_SUM(1/F)`` (unless F is the shard group's size); each rank then scales its loss by
    F / world so the gradients are still the batch mean's. Without it FSDP reduce-scatters (and
    on a 2-D mesh all-reduces) with ``AVG``. The reduce ops FSDP passed are recorded.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard")[-len(shape):])
    ops: dict[str, set[str]] = {"reduce_scatter": set(), "all_reduce": set()}
    reduce_scatter, all_reduce = dist.reduce_scatter_single, dist.all_reduce

    def seen(kind: str, collective: Callable) -> Callable:
        def call(*args, **kwargs):
            op = kwargs.get("op", dist.ReduceOp.SUM)
            ops[kind].add(next(n for n in ("SUM", "AVG", "PREMUL_SUM") if op == getattr(dist.ReduceOp, n)))
            return collective(*args, **kwargs)
        return call

    dist.reduce_scatter_single, dist.all_reduce = seen("reduce_scatter", reduce_scatter), seen("all_reduce", all_reduce)
    try:
        model = _model().to(device)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for module in (model[0], model[2], model):
            fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
            if divide:
                module.set_gradient_divide_factor(divide)  # each module's own parameters
        scale = (divide or world) / world
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = _batches(4, 8)
        rows = 8 // world
        losses = []
        for x, y in batches:
            xs, ys = x[rank * rows:(rank + 1) * rows].to(device), y[rank * rows:(rank + 1) * rows].to(device)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xs), ys)
            (loss * scale).backward()
            opt.step()
            losses.append(loss.detach())
        local = [float(v.cpu()) for v in losses]
    finally:
        dist.reduce_scatter_single, dist.all_reduce = reduce_scatter, all_reduce

    reference, reference_losses = _mixed_precision_reference(batches)
    mean = torch.tensor(local)  # the whole batch's loss is the mean of the ranks' slices' losses
    dist.all_reduce(mean, group=dist.new_group(backend="gloo"))
    mean /= world
    got, want = _parameters(model), _parameters(reference)
    return {
        "mesh": list(mesh.shape), "shard_shape": list(model[0].weight.to_local().shape),
        "reduce_ops": {kind: sorted(names) for kind, names in ops.items()},
        "losses": mean.tolist(), "reference_losses": reference_losses,
        "max_loss_difference": float((mean - torch.tensor(reference_losses)).abs().max()),
        "max_parameter_difference": max(float((g - w).abs().max()) for g, w in zip(got, want)),
        "max_parameter_change": max(float((w - s).abs().max()) for w, s in zip(want, _parameters(_model()))),
    }


def scenario_fsdp2_mixed() -> dict[str, Any]:
    """FSDP2 in bfloat16 with float32 reductions (:func:`_fsdp2_mixed`), twice in the same ranks:
    ``fsdp`` over every rank with a gradient divide factor (PREMUL_SUM), and ``hsdp`` on the 2-D
    mesh ``ACCELKIT_TEST_MESH`` (``RxS``, default ``1xWORLD``) with FSDP's own AVG."""
    device, _gloo, rank, world = _join()
    shape = tuple(int(n) for n in os.environ.get("ACCELKIT_TEST_MESH", f"1x{world}").split("x"))
    return {"fsdp": _fsdp2_mixed(device, rank, world, (world,), divide=4.0 * world),
            "hsdp": _fsdp2_mixed(device, rank, world, shape, divide=None)}


def scenario_dtensor() -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import torch.distributed as dist

    device, _gloo, rank, world = _join()
    mesh = init_device_mesh(device.type, (world,))  # on the default group _join made
    findings_group = dist.get_backend(mesh.get_group())
    findings: dict[str, Any] = {"mesh_device_type": mesh.device_type, "mesh_backend": findings_group}
    full = torch.arange(4.0 * world * 3).reshape(4 * world, 3)
    sharded = distribute_tensor(full.to(device), mesh, [Shard(0)])
    findings["local_shape"] = list(sharded.to_local().shape)
    findings["local_device"] = str(sharded.to_local().device)
    findings["shard_is_rows"] = bool(torch.equal(sharded.to_local().cpu(), full.chunk(world)[rank]))
    replicated = sharded.redistribute(mesh, [Replicate()])
    findings["redistribute_replicate"] = bool(torch.equal(replicated.to_local().cpu(), full))
    findings["reshard_columns"] = bool(torch.equal(
        sharded.redistribute(mesh, [Shard(1)]).full_tensor().cpu(), full))
    findings["sum"] = float((sharded * 2).sum().full_tensor().cpu()) == float(full.sum() * 2)

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(6, 8 * world), torch.nn.ReLU(), torch.nn.Linear(8 * world, 5))
    tp = torch.nn.Sequential(torch.nn.Linear(6, 8 * world), torch.nn.ReLU(), torch.nn.Linear(8 * world, 5))
    tp.load_state_dict(plain.state_dict())
    tp = parallelize_module(tp.to(device), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(5))
    out = tp(x.to(device))
    out.sum().backward()
    want = plain(x)
    want.sum().backward()
    findings["tp_output_close"] = bool(torch.allclose(out.cpu(), want, rtol=1e-5, atol=1e-6))
    findings["tp_local_weight_shape"] = list(tp[0].weight.to_local().shape)
    findings["tp_grad_close"] = bool(torch.allclose(tp[0].weight.grad.full_tensor().cpu(), plain[0].weight.grad,
                                                    rtol=1e-5, atol=1e-6))

    # Tensor parallelism shards attention by heads: causal attention on head shards.
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 2 * world, 5, 4, generator=g) for _ in range(3))
    heads = [distribute_tensor(t.to(device), mesh, [Shard(1)]).requires_grad_() for t in (q, k, v)]
    attended = torch.nn.functional.scaled_dot_product_attention(*heads, is_causal=True)
    attended.sum().backward()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want_attention = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    want_attention.sum().backward()
    findings["tp_attention_placements"] = str(attended.placements)
    findings["tp_attention_close"] = bool(torch.allclose(attended.full_tensor().cpu(), want_attention.detach(),
                                                         rtol=1e-5, atol=1e-6))
    findings["tp_attention_grad_close"] = all(
        torch.allclose(d.grad.full_tensor().cpu(), w.grad, rtol=1e-5, atol=1e-6) for d, w in zip(heads, leaves))
    return findings
