"""Collectives on the device against gloo on CPU tensors, NCCL's PREMUL_SUM and AVG among them."""

from __future__ import annotations

from typing import Any

import torch

from accelkit.sdk.testing.distributed_cases._group import Case, _join, _outcome, _values


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
