"""The scenarios :func:`accelkit.sdk.testing.distributed.run_ranks` runs, one per process and rank.

``python -m accelkit.sdk.testing.distributed_cases SCENARIO`` under torchrun's environment
activates ``ACCELKIT_DEVICE``, joins the process group of that name and prints one JSON line of
findings (``A+B`` runs scenarios A then B in the same ranks, their findings under their names).
Every comparison is made here, per rank, against an independent reference computed in the same
process: gloo on CPU tensors (a second group of the same ranks) for collectives, a
single-process full-batch run on the CPU for training.

Scenarios: ``collectives``, ``reductions``, ``mismatch``, ``dead_rank``, ``timeout``, ``ddp``,
``fsdp2``, ``fsdp2_mixed``, ``dtensor``, ``checkpoint``, ``sharded_random``, ``fsdp2_meta_init``.

The trainings of ``ddp`` and ``fsdp2_meta_init`` also run under another launcher's process group
through :func:`train` (Ray Train's workers call it), which reports what those scenarios' findings
carry under ``trained``: the launchers' runs compare number for number.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from accelkit.sdk.testing.distributed import RESULT_PREFIX

Case = Callable[[torch.device, Any, int, int], list[torch.Tensor]]


_joined: tuple[torch.device, Any, int, int] | None = None


def _join(timeout_s: float = 60.0) -> tuple[torch.device, Any, int, int]:
    """Activate the device, join its process group and a gloo group of the same ranks, once per
    process (scenarios run together share them): ``(device, gloo group, rank, world size)``."""
    global _joined
    if _joined is not None:
        return _joined
    import torch.distributed as dist

    import accelkit

    device = accelkit.select_device(os.environ["ACCELKIT_DEVICE"])
    if os.environ.get("ACCELKIT_TEST_LOCAL_DEVICE"):
        # CUDA's pattern under torchrun: each rank takes the device of its local rank.
        device = torch.device(device.type, int(os.environ["LOCAL_RANK"]))
        getattr(torch, device.type).set_device(device)
    bound = {"device_id": device} if os.environ.get("ACCELKIT_TEST_DEVICE_ID") else {}
    dist.init_process_group(device.type, timeout=timedelta(seconds=timeout_s), **bound)
    gloo = dist.new_group(backend="gloo")
    _joined = device, gloo, dist.get_rank(), dist.get_world_size()
    return _joined


# -- collectives against gloo on CPU -------------------------------------------------------------


def _values(rank: int, n: int, dtype: torch.dtype = torch.float32, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def collective_cases(world: int) -> dict[str, Case]:
    """Each case runs one collective on ``device`` tensors in ``group`` and returns the tensors
    whose values must equal the same call's on CPU tensors in the gloo group."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    cases: dict[str, Case] = {}

    def all_reduce(op: str, dtype: torch.dtype) -> Case:
        def case(d, group, rank, world):
            x = _values(rank, 37, dtype).to(d)
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=group)
            return [x]
        return case

    for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
        cases[f"all_reduce.{op}"] = all_reduce(op, torch.float32)
    for op in ("BAND", "BOR", "BXOR"):
        cases[f"all_reduce.{op}.int32"] = all_reduce(op, torch.int32)
    cases["all_reduce.SUM.bfloat16"] = all_reduce("SUM", torch.bfloat16)
    cases["all_reduce.SUM.int64"] = all_reduce("SUM", torch.int64)

    def all_reduce_view(d, group, rank, world):
        # gloo reduces a view's storage as if it were contiguous, so the reference runs on a copy.
        base = _values(rank, 24).reshape(4, 6).to(d)
        view = base[:, 1::2]
        if d.type == "cpu":
            dense = view.contiguous()
            dist.all_reduce(dense, group=group)
            view.copy_(dense)
        else:
            dist.all_reduce(view, group=group)
        return [base]

    cases["all_reduce.non_contiguous_view"] = all_reduce_view

    def broadcast(d, group, rank, world):
        x = _values(rank, 11).to(d)
        dist.broadcast(x, src=world - 1, group=group)
        return [x]

    def reduce(d, group, rank, world):
        x = _values(rank, 9).to(d)
        dist.reduce(x, dst=0, op=dist.ReduceOp.MAX, group=group)
        return [x] if rank == 0 else []

    def all_gather(d, group, rank, world):
        out = [torch.empty(5, device=d) for _ in range(world)]
        dist.all_gather(out, _values(rank, 5).to(d), group=group)
        return out

    def all_gather_bf16(d, group, rank, world):
        out = [torch.empty(5, dtype=torch.bfloat16, device=d) for _ in range(world)]
        dist.all_gather(out, _values(rank, 5, torch.bfloat16).to(d), group=group)
        return out

    def all_gather_into_tensor(d, group, rank, world):
        out = torch.empty(world * 6, device=d)
        dist.all_gather_into_tensor(out, _values(rank, 6).to(d), group=group)
        return [out]

    def reduce_scatter(d, group, rank, world):
        out = torch.empty(4, device=d)
        dist.reduce_scatter(out, [_values(rank, 4, salt=i).to(d) for i in range(world)], group=group)
        return [out]

    def reduce_scatter_tensor(d, group, rank, world):
        out = torch.empty(3, device=d)
        dist.reduce_scatter_tensor(out, _values(rank, 3 * world).to(d), group=group)
        return [out]

    def all_to_all_single_even(d, group, rank, world):
        out = torch.empty(2 * world, 3, device=d)
        dist.all_to_all_single(out, _values(rank, 6 * world).reshape(2 * world, 3).to(d), group=group)
        return [out]

    def all_to_all_single_uneven(d, group, rank, world):
        # rank r sends r + j + 1 rows to rank j, so rank j receives r + j + 1 rows from rank r.
        sends = [rank + j + 1 for j in range(world)]
        receives = [r + rank + 1 for r in range(world)]
        out = torch.empty(sum(receives), 2, device=d)
        inp = _values(rank, 2 * sum(sends)).reshape(-1, 2).to(d)
        dist.all_to_all_single(out, inp, receives, sends, group=group)
        return [out]

    def all_to_all_list(d, group, rank, world):
        # Uneven sizes (rank r sends r + 1 elements to each rank): gloo's own list all_to_all
        # refuses them, so the reference is its all_to_all_single over the concatenation.
        inputs = [_values(rank, rank + 1, salt=j).to(d) for j in range(world)]
        out = [torch.empty(j + 1, device=d) for j in range(world)]
        if d.type != "cpu":
            dist.all_to_all(out, inputs, group=group)
            return out
        flat = torch.empty(sum(o.numel() for o in out))
        dist.all_to_all_single(flat, torch.cat(inputs), [o.numel() for o in out], [i.numel() for i in inputs], group=group)
        return list(flat.split([o.numel() for o in out]))

    def gather(d, group, rank, world):
        out = [torch.empty(4, device=d) for _ in range(world)] if rank == 1 else None
        dist.gather(_values(rank, 4).to(d), out, dst=1, group=group)
        return out or []

    def scatter(d, group, rank, world):
        out = torch.empty(4, device=d)
        chunks = [_values(rank, 4, salt=j).to(d) for j in range(world)] if rank == 0 else None
        dist.scatter(out, chunks, src=0, group=group)
        return [out]

    def send_recv(d, group, rank, world):
        x = _values(rank, 7).to(d)
        if rank == 0:
            for peer in range(1, world):
                dist.send(x, peer, group=group)
            return [x]
        dist.recv(x, 0, group=group)
        return [x]

    def batch_isend_irecv(d, group, rank, world):
        send, recv = _values(rank, 5).to(d), torch.empty(5, device=d)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world, group),
               dist.P2POp(dist.irecv, recv, (rank - 1) % world, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return [recv]

    def async_all_reduce(d, group, rank, world):
        xs = [_values(rank, 8, salt=i).to(d) for i in range(3)]
        works = [dist.all_reduce(x, group=group, async_op=True) for x in xs]
        for work in works:
            work.wait()
        return xs

    def functional_all_reduce(d, group, rank, world):
        return [funcol.all_reduce(_values(rank, 6).to(d), "sum", group or dist.group.WORLD)]

    def functional_all_gather(d, group, rank, world):
        return [funcol.all_gather_tensor(_values(rank, 3).to(d), 0, group or dist.group.WORLD)]

    def barrier(d, group, rank, world):
        dist.barrier(group=group)
        return []

    def results_outlive_the_next_collective(d, group, rank, world):
        # A device may keep a collective's host staging memory as the result's own; the next
        # collective of that size must then not be staged through it.
        first = _values(rank, 1024).to(d)
        dist.all_reduce(first, group=group)
        second = _values(rank, 1024, salt=1).to(d)
        dist.all_reduce(second, group=group)
        third = torch.zeros(1024, device=d) if rank else _values(rank, 1024, salt=2).to(d)
        dist.broadcast(third, src=0, group=group)
        return [first, second, third]

    def broadcast_into_storage_never_written(d, group, rank, world):
        # A device may give storage never written one array that several tensors share (tpu
        # does, for zeros); rewriting one of them in place must leave the others alone.
        x, other = torch.empty(16, device=d), torch.empty(16, device=d)
        x.sum(), other.sum()  # read before the collective
        before = other.cpu()
        if rank == 0:
            x.copy_(_values(rank, 16))
        dist.broadcast(x, src=0, group=group)
        return [x, torch.tensor(torch.equal(other.cpu().view(torch.int32), before.view(torch.int32)))]  # bits: NaN garbage too

    for fn in (broadcast, reduce, all_gather, all_gather_bf16, all_gather_into_tensor, reduce_scatter,
               reduce_scatter_tensor, all_to_all_single_even, all_to_all_single_uneven, all_to_all_list,
               gather, scatter, send_recv, batch_isend_irecv, async_all_reduce, functional_all_reduce,
               functional_all_gather, barrier, results_outlive_the_next_collective,
               broadcast_into_storage_never_written):
        cases[fn.__name__] = fn
    cases.update(reduction_cases(world))
    return cases


# -- PREMUL_SUM and AVG as NCCL defines them, against gloo's SUM on CPU ----------------------------

#: The reduce ops a device group runs as NCCL's (gloo has no PREMUL_SUM; its AVG is not NCCL's):
#: PREMUL_SUM with a Python float factor, with a one-element float32 tensor factor on the
#: device, and AVG.
NCCL_OPS = ("PREMUL_SUM", "PREMUL_SUM_device_factor", "AVG")


def _nccl_op(name: str, d: torch.device, rank: int, world: int, dtype: torch.dtype) -> tuple[Any, torch.Tensor]:
    """The op to pass on ``d``, and the factor NCCL multiplies each input by: a 0-dim tensor of
    ``dtype`` (its value rounded to ``dtype`` from the float, or from the float32 tensor, given).
    The ranks' factors differ (NCCL allows that): 1/3, 1/5, ... (no bfloat16 number among
    them), and 0.7, 0.5, ..."""
    import torch.distributed as dist

    if name == "AVG":
        return dist.ReduceOp.AVG, torch.tensor(1.0 / world, dtype=dtype)
    if name == "PREMUL_SUM":
        factor = 1.0 / (3 + 2 * rank)
        return dist._make_nccl_premul_sum(factor), torch.tensor(factor, dtype=dtype)
    factor32 = torch.tensor(0.7 - 0.2 * rank)
    return dist._make_nccl_premul_sum(factor32.to(d)), factor32.to(dtype)


def reduction_cases(world: int) -> dict[str, Case]:
    """PREMUL_SUM and AVG through every reducing collective, on float32 and bfloat16, and AVG on
    integers. On a device the collective runs as called; on the CPU (the reference, in plain
    gloo) the same computation is done by hand: each rank's input times its factor (rounded to
    the dtype, in the dtype: NCCL's PREMUL_SUM, and its AVG on floating point), gloo's SUM, and
    for integer AVG the sum divided by the world size, rounded toward zero. Out-of-place
    collectives also return their inputs, which must be unchanged; ``reduce`` returns every
    rank's tensor: the root's result, and the others' tensors as they were (NCCL's)."""
    import torch.distributed as dist

    sum_op = dist.ReduceOp.SUM
    cases: dict[str, Case] = {}

    def op(name: str, d, rank, world, dtype: torch.dtype) -> Any:
        return _nccl_op(name, d, rank, world, dtype)[0]

    def mine(name: str, rank, world, x: torch.Tensor) -> torch.Tensor:
        """This rank's contribution to gloo's SUM: ``x`` times its factor (a copy for integers)."""
        return x * _nccl_op(name, x.device, rank, world, x.dtype)[1] if x.is_floating_point() else x.clone()

    def average(total: torch.Tensor) -> torch.Tensor:
        """The result from gloo's SUM: for integers divided by the world size, toward zero."""
        return total if total.is_floating_point() else torch.div(total, world, rounding_mode="trunc")

    def all_reduce(name: str, dtype: torch.dtype) -> Case:
        def case(d, group, rank, world):
            x = _values(rank, 4 * world, dtype).to(d)
            if d.type != "cpu":
                dist.all_reduce(x, op=op(name, d, rank, world, dtype), group=group)
                return [x]
            total = mine(name, rank, world, x)
            dist.all_reduce(total, op=sum_op, group=group)
            return [average(total)]
        return case

    def all_reduce_coalesced(name: str, dtype: torch.dtype) -> Case:
        def case(d, group, rank, world):
            xs = [_values(rank, n, dtype, salt=salt).to(d) for salt, n in enumerate((4 * world, 4 * world, 4))]
            if d.type != "cpu":
                with dist._coalescing_manager(group):
                    for x in xs:
                        dist.all_reduce(x, op=op(name, d, rank, world, dtype), group=group)
                return xs
            totals = [mine(name, rank, world, x) for x in xs]
            with dist._coalescing_manager(group):  # gloo's coalesced sum: its order of additions
                for total in totals:
                    dist.all_reduce(total, op=sum_op, group=group)
            return [average(total) for total in totals]
        return case

    def reduce(name: str, dtype: torch.dtype) -> Case:
        def case(d, group, rank, world):
            x = _values(rank, 4 * world, dtype).to(d)
            if d.type != "cpu":
                dist.reduce(x, dst=world - 1, op=op(name, d, rank, world, dtype), group=group)
                return [x]
            total = mine(name, rank, world, x)
            dist.reduce(total, dst=world - 1, op=sum_op, group=group)
            return [average(total) if rank == world - 1 else x]
        return case

    def reduce_scatter(name: str, dtype: torch.dtype) -> Case:
        def case(d, group, rank, world):
            out = torch.empty(4, dtype=dtype, device=d)
            ins = [_values(rank, 4, dtype, salt=j).to(d) for j in range(world)]
            if d.type != "cpu":
                dist.reduce_scatter(out, ins, op=op(name, d, rank, world, dtype), group=group)
                return [out, *ins]
            dist.reduce_scatter(out, [mine(name, rank, world, t) for t in ins], op=sum_op, group=group)
            return [average(out), *ins]
        return case

    def reduce_scatter_tensor(name: str, dtype: torch.dtype) -> Case:
        def case(d, group, rank, world):
            out = torch.empty(4, dtype=dtype, device=d)
            inp = _values(rank, 4 * world, dtype).to(d)
            if d.type != "cpu":
                dist.reduce_scatter_tensor(out, inp, op=op(name, d, rank, world, dtype), group=group)
                return [out, inp]
            dist.reduce_scatter_tensor(out, mine(name, rank, world, inp), op=sum_op, group=group)
            return [average(out), inp]
        return case

    def reduce_scatter_tensor_coalesced(name: str, dtype: torch.dtype) -> Case:
        def case(d, group, rank, world):
            outs = [torch.empty(4, dtype=dtype, device=d) for _ in range(2)]
            ins = [_values(rank, 4 * world, dtype, salt=salt).to(d) for salt in range(2)]
            if d.type != "cpu":
                with dist._coalescing_manager(group):
                    for out, inp in zip(outs, ins):
                        dist.reduce_scatter_tensor(out, inp, op=op(name, d, rank, world, dtype), group=group)
                return [*outs, *ins]
            for out, inp in zip(outs, ins):
                dist.reduce_scatter_tensor(out, mine(name, rank, world, inp), op=sum_op, group=group)
            return [*(average(out) for out in outs), *ins]
        return case

    def all_reduce_view(d, group, rank, world):
        base = _values(rank, 24).reshape(4, 6).to(d)
        view = base[:, 1::2]
        if d.type != "cpu":
            dist.all_reduce(view, op=op("PREMUL_SUM", d, rank, world, view.dtype), group=group)
        else:
            total = mine("PREMUL_SUM", rank, world, view)
            dist.all_reduce(total, op=sum_op, group=group)
            view.copy_(total)
        return [base]

    collectives = (all_reduce, all_reduce_coalesced, reduce, reduce_scatter, reduce_scatter_tensor,
                   reduce_scatter_tensor_coalesced)
    for collective in collectives:
        for name in NCCL_OPS:
            for dtype in (torch.float32, torch.bfloat16):
                cases[f"{collective.__name__}.{name}.{str(dtype).removeprefix('torch.')}"] = collective(name, dtype)
    cases["all_reduce.AVG.int32"] = all_reduce("AVG", torch.int32)
    cases["reduce.AVG.int64"] = reduce("AVG", torch.int64)
    cases["reduce_scatter_tensor.AVG.int64"] = reduce_scatter_tensor("AVG", torch.int64)
    cases["all_reduce.PREMUL_SUM.non_contiguous_view"] = all_reduce_view
    return cases


def _compare(cases: dict[str, Case], device: torch.device, gloo: Any, rank: int, world: int) -> dict[str, str]:
    """Run each case on ``device`` and on the CPU through ``gloo``: ``"ok"`` or what differed."""
    findings = {}
    for name, case in cases.items():
        try:
            got = [t.cpu() for t in case(device, None, rank, world)]
            want = case(torch.device("cpu"), gloo, rank, world)
            same = len(got) == len(want) and all(
                g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want))
            findings[name] = "ok" if same else f"differs from gloo on CPU: {got} vs {want}"
        except Exception as exc:
            findings[name] = f"error: {type(exc).__name__}: {exc}"
    return findings


def scenario_collectives() -> dict[str, Any]:
    device, gloo, rank, world = _join()
    findings: dict[str, Any] = _compare(collective_cases(world), device, gloo, rank, world)
    import accelkit

    findings["stats"] = accelkit.stats()["distributed"]
    findings["stats"]["device"] = str(device)
    return findings


def scenario_reductions() -> dict[str, Any]:
    """The cases of :func:`reduction_cases`, then what the group refuses: PREMUL_SUM on integers
    and AVG on bool (``TypeError`` on every rank, as NCCL's process group), and one rank's SUM
    against another's PREMUL_SUM (a mismatch); an in-place PREMUL_SUM keeps the tensor's
    version counter, as every collective does."""
    import torch.distributed as dist

    device, gloo, rank, world = _join()
    findings: dict[str, Any] = _compare(reduction_cases(world), device, gloo, rank, world)
    half = dist._make_nccl_premul_sum(0.5)
    findings["refused.all_reduce.PREMUL_SUM.int32"] = _outcome(
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32, device=device), op=half))
    findings["refused.reduce_scatter_tensor.PREMUL_SUM.int64"] = _outcome(lambda: dist.reduce_scatter_tensor(
        torch.empty(2, dtype=torch.int64, device=device), torch.ones(2 * world, dtype=torch.int64, device=device),
        op=half))
    findings["refused.all_reduce.AVG.bool"] = _outcome(
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool, device=device), op=dist.ReduceOp.AVG))
    findings["op_mismatch"] = _outcome(
        lambda: dist.all_reduce(torch.ones(4, device=device), op=dist.ReduceOp.SUM if rank == 0 else half))
    x = torch.full((4,), float(rank + 1), device=device)
    version = x._version
    dist.all_reduce(x, op=half)
    findings["usable_after"] = x.cpu().tolist() == [0.5 * sum(range(1, world + 1))] * 4
    findings["version_unchanged"] = x._version == version
    return findings


# -- failures ------------------------------------------------------------------------------------


def _outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        fn()
        return {"raised": None, "seconds": time.perf_counter() - started}
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "seconds": time.perf_counter() - started}


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


# -- training against one process on the CPU -----------------------------------------------------


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


# -- random numbers on shards against the whole tensor ------------------------------------------


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


# -- the trainings any launcher runs --------------------------------------------------------------

#: What :func:`train` runs, by name: each takes ``(device, rank, world)`` and returns the trained
#: model and this rank's losses.
TRAININGS: dict[str, Callable[[torch.device, int, int], tuple[torch.nn.Module, list[float]]]] = {
    "ddp": _ddp_training,
    "fsdp2_meta_init": _fsdp2_meta_init_training,
}


def _trained(model: torch.nn.Module, losses: list[float]) -> dict[str, list[float]]:
    return {"losses": losses, "parameters": torch.cat([p.flatten() for p in _parameters(model)]).tolist()}


def train(name: str, device: torch.device, rank: int, world: int) -> dict[str, list[float]]:
    """Run the training ``name`` of :data:`TRAININGS` as rank ``rank`` of ``world``, in the default
    process group that the launcher initialised on ``device`` (torchrun's ranks: the scenarios of
    the same names, whose findings carry this under ``trained``; Ray Train's workers:
    ``TorchConfig(backend=device.type)``), and return what each worker reports, as Python floats:
    ``losses``, this rank's loss at each step (on its slice of every batch), and ``parameters``,
    the model's full parameters after training, flattened into one list. Every collective runs
    in the default group, so two launchers that give the ranks the same device and world size
    give the same results.

    ``ddp``: :func:`_model` under DDP with several gradient buckets, SGD on ``_batches(4, 8)``,
    each rank on its slice of every batch: the mean of the ranks' losses and the parameters are
    one process's on the whole batches (:func:`single_process_training`). ``fsdp2_meta_init``: a
    model built on the meta device, sharded with FSDP2 (bfloat16 parameters, float32
    reduction), moved with ``to_empty``, initialised from the device generator and trained on
    ``_batches(3, 8)``."""
    return _trained(*TRAININGS[name](device, rank, world))


def single_process_training() -> dict[str, list[float]]:
    """The ``ddp`` training of :func:`train` in one process on the CPU on the whole batches, as
    :func:`train` reports it: the losses and parameters that the ranks' must equal (the ranks'
    losses averaged) to float32 rounding."""
    model = _model()
    return _trained(model, _train(model, _batches(4, 8), torch.device("cpu")))


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


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "collectives": scenario_collectives,
    "reductions": scenario_reductions,
    "mismatch": scenario_mismatch,
    "dead_rank": scenario_dead_rank,
    "timeout": scenario_timeout,
    "ddp": scenario_ddp,
    "fsdp2": scenario_fsdp2,
    "fsdp2_mixed": scenario_fsdp2_mixed,
    "dtensor": scenario_dtensor,
    "checkpoint": scenario_checkpoint,
    "checkpoint_reshard": scenario_checkpoint_reshard,
    "sharded_random": scenario_sharded_random,
    "fsdp2_meta_init": scenario_fsdp2_meta_init,
}


def main(argv: list[str]) -> int:
    name, *args = argv
    try:
        if "+" in name:  # several scenarios in one launch (a launch costs the ranks' startup)
            findings = {part: SCENARIOS[part](*args) for part in name.split("+")}
        else:
            findings = SCENARIOS[name](*args)
    except Exception:
        findings = {"scenario_error": traceback.format_exc()}
    print(RESULT_PREFIX + json.dumps(findings, default=str), flush=True)
    import torch.distributed as dist

    if dist.is_initialized() and "scenario_error" not in findings and name not in ("dead_rank", "timeout"):
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
