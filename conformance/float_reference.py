"""A second reference for bfloat16 and float16 results: CPU computing in float32, rounded once.

CPU's reduced-precision kernels differ in where they round. Some compute in float32 and round
the result once; others round intermediates to the tensor's dtype (``linalg.cross`` rounds each
product to bfloat16 before subtracting). A backend that keeps float32 inside an op, as XLA
does and as PyTorch's own decompositions do (their ``opmath`` casts), then differs from CPU's
kernel by more than the dtype's tolerance wherever the computation cancels, while being the
more accurate of the two.

So a reduced-precision result that fails the comparison with CPU's kernel is compared once
more, under the same tolerance, with the same op run on the CPU on float32 copies of the
reduced-precision tensors, its results rounded to their dtypes. It passes if it matches that;
a wrong result matches neither. The copies are taken before any run (an op that updates its
inputs, such as a norm's running statistics, would otherwise start from updated values). The
tested dtype is widened wherever the sample names it: in tensors and in dtype arguments (a
factory's ``dtype=torch.bfloat16`` computes in float32 too). An op whose float32 run returns
results of another structure has no second reference.
"""

from __future__ import annotations

from typing import Any

import torch

from accelkit_conformance.compare import tensors_in

REDUCED = frozenset({torch.bfloat16, torch.float16})


def forward(op: Any, wide: Any, cpu_sample: Any, expected: Any) -> list | None:
    """The float32 reference of OpInfo ``op`` run on ``wide`` (:func:`widened`, taken before the
    ``dtype`` run on ``cpu_sample`` returned ``expected``): its outputs, then the sample's
    tensors after the call, each rounded to the dtype of its twin in the ``dtype`` run. None
    when there is no such reference."""
    wide_out = _run(op, wide)
    if wide_out is None:
        return None
    like = list(tensors_in(expected)) + list(tensors_in(_arguments(cpu_sample)))
    return rounded_like(list(tensors_in(wide_out)) + list(tensors_in(_arguments(wide))), like)


def gradients(op: Any, wide: Any, wanted: list[int], grads_out: list, cpu_inputs: list) -> list | None:
    """The float32 reference of the gradients of ``cpu_inputs`` (the sample's leaves that
    require grad) through outputs ``wanted``, for output gradients ``grads_out``, with ``op``
    run on ``wide`` (:func:`widened`): each rounded to its input's dtype. None when there is no
    such reference."""
    wide_out = _run(op, wide)
    if wide_out is None:
        return None
    outs = list(tensors_in(wide_out))
    leaves = [t for t in tensors_in(_arguments(wide)) if t.requires_grad]
    if len(leaves) != len(cpu_inputs) or any(k >= len(outs) for k in wanted):
        return None
    try:
        grads = torch.autograd.grad([outs[k] for k in wanted], leaves,
                                    [g.to(outs[k].dtype) for k, g in zip(wanted, grads_out)], allow_unused=True)
    except Exception:  # no float32 gradient where the reduced dtype had one: no reference
        return None
    return [torch.zeros_like(leaf) if g is None else g.to(leaf.dtype) for g, leaf in zip(grads, cpu_inputs)]


def _run(op: Any, wide: Any) -> Any | None:
    """``op``'s outputs on the widened sample; None when there is none, or when the op refuses
    float32 where it took the reduced dtype (no reference then)."""
    if wide is None:
        return None
    try:
        return wide.output_process_fn_grad(op(wide.input, *wide.args, **wide.kwargs))
    except Exception:  # any refusal means there is no float32 reference
        return None


def _arguments(sample: Any) -> tuple:
    return sample.input, sample.args, sample.kwargs


def widened(cpu_sample: Any, dtype: torch.dtype) -> Any | None:
    """A copy of ``cpu_sample`` with ``dtype`` widened to float32: its ``dtype`` tensors as
    float32 leaves, dtype arguments naming ``dtype`` as float32, its other tensors cloned
    (``requires_grad`` kept). Take it before the sample is run. None unless ``dtype`` is a
    reduced-precision float."""
    if dtype not in REDUCED:
        return None

    def widen(t: Any) -> Any:
        if isinstance(t, torch.dtype):
            return torch.float32 if t == dtype else t
        if not isinstance(t, torch.Tensor):
            return t
        with torch.no_grad():
            wide = t.detach().to(torch.float32) if t.dtype == dtype else t.detach().clone()
        return wide.requires_grad_(t.requires_grad)

    return cpu_sample.transform(widen)


def rounded_like(wide: Any, expected: Any) -> Any | None:
    """``wide`` (a float32 run's results) with each tensor rounded to the dtype of the tensor
    in the same place of ``expected`` (the reduced-precision run's); None when the two hold
    different numbers of tensors or a tensor of another shape."""
    wide_tensors, like = list(tensors_in(wide)), list(tensors_in(expected))
    if len(wide_tensors) != len(like) or any(w.shape != e.shape for w, e in zip(wide_tensors, like)):
        return None
    return [w.detach().to(e.dtype) for w, e in zip(wide_tensors, like)]
