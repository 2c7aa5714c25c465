"""neuron's decompositions: ops without a tile program of their own, written exactly in ops
neuron runs natively. One module per op family (``pool``, ``arith``, ``sort``, ``linalg``, ...:
see :func:`decompositions`); this one has the backward ops PyTorch has no decomposition for.

Each op here maps every output-gradient element to input positions along each spatial dim
independently (a gather's reverse), so its backward is a chain of ``index_add`` folds, one per
spatial dim, from the last to the first:

* nearest upsampling (``upsample_nearest{1,2,3}d_backward`` and the ``_exact`` forms): output
  ``o`` reads input ``min(floor((o + offset) * scale), n - 1)`` (offset 0.5 for ``_exact``);
* linear upsampling (``upsample_linear1d``/``bilinear2d``/``trilinear3d_backward``): output
  ``o`` reads inputs ``i0`` and ``i1`` with weights ``1 - λ`` and ``λ``;
* bicubic upsampling (``upsample_bicubic2d_backward``): output ``o`` reads the four inputs
  around its source position (clamped to the input) with the cubic convolution's weights;
* replication padding (``replication_pad{1,2,3}d_backward``): output ``o`` reads input
  ``clamp(o - pad_before, 0, n - 1)``.

``roll`` is here too, as one ``index_select`` per dim. And a few of PyTorch's own
decompositions outside its core-ATen table, each run here against the CPU (``VETTED``).

Indices and weights follow the CPU kernels' formulas in float32 (``UpSample.h``). A reduced
float gradient (bfloat16, float16) is folded in float32 and rounded once at the end, as the CPU's
upsampling backward kernels accumulate in float32; float32 sums may differ from the CPU's in
their last bits only (the order of the additions differs: per dim here, per output element
there). The CPU's replication-pad backward adds in the gradient's own type, so a bfloat16 edge
sum there carries one rounding per term; here it carries one (within a bfloat16 step of it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _fold(grad: torch.Tensor, dim: int, size: int, terms: Sequence[tuple[torch.Tensor, torch.Tensor | None]]
          ) -> torch.Tensor:
    """Sum ``grad`` along ``dim`` onto ``size`` positions: each ``(index, weight)`` term adds
    ``grad * weight`` (weight None: 1) at ``index[o]`` for output position ``o``."""
    shape = list(grad.shape)
    shape[dim] = size
    folded = grad.new_zeros(shape)
    for index, weight in terms:
        source = grad
        if weight is not None:
            source = grad * weight.view([-1] + [1] * (grad.dim() - dim - 1))
        folded = folded.index_add(dim, index, source)
    return folded


def _scale(in_size: int, out_size: int, scale: float | None, align_corners: bool = False) -> float:
    """``area_pixel_compute_scale`` / ``compute_scales_value``: input positions per output
    position, as a float32 value."""
    if align_corners:
        value = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        value = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    return float(torch.tensor(value, dtype=torch.float32))


def _positions(out_size: int, device: torch.device) -> torch.Tensor:
    return torch.arange(out_size, dtype=torch.float32, device=device)


def _nearest_index(in_size: int, out_size: int, scale: float | None, exact: bool, device: torch.device) -> torch.Tensor:
    offset = 0.5 if exact else 0.0
    source = ((_positions(out_size, device) + offset) * _scale(in_size, out_size, scale)).floor()
    return source.to(torch.int64).clamp(max=in_size - 1)


def _linear_terms(in_size: int, out_size: int, scale: float | None, align_corners: bool, device: torch.device
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    factor = _scale(in_size, out_size, scale, align_corners)
    positions = _positions(out_size, device)
    if align_corners:
        source = positions * factor
    else:
        source = ((positions + 0.5) * factor - 0.5).clamp(min=0.0)
    i0 = source.to(torch.int64)  # source >= 0: truncation is floor
    i1 = (i0 + 1).clamp(max=in_size - 1)
    lambda1 = (source - i0.to(torch.float32)).clamp(max=1.0)
    return [(i0, 1.0 - lambda1), (i1, lambda1)]


#: The cubic convolution's parameter in PyTorch's bicubic kernels.
_CUBIC_A = -0.75


def _cubic_near(x: torch.Tensor) -> torch.Tensor:
    """The cubic convolution's weight at a distance below 1 (``cubic_convolution1``)."""
    return ((_CUBIC_A + 2) * x - (_CUBIC_A + 3)) * x * x + 1


def _cubic_far(x: torch.Tensor) -> torch.Tensor:
    """The cubic convolution's weight at a distance in [1, 2) (``cubic_convolution2``)."""
    return ((_CUBIC_A * x - 5 * _CUBIC_A) * x + 8 * _CUBIC_A) * x - 4 * _CUBIC_A


def _cubic_terms(in_size: int, out_size: int, scale: float | None, align_corners: bool, device: torch.device
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Output ``o``'s four taps ``floor(src) - 1 .. floor(src) + 2`` (clamped to the input, as the
    CPU reads them) and their weights."""
    factor = _scale(in_size, out_size, scale, align_corners)
    positions = _positions(out_size, device)
    source = positions * factor if align_corners else (positions + 0.5) * factor - 0.5
    floor = source.floor()
    t = source - floor
    weights = [_cubic_far(t + 1.0), _cubic_near(t), _cubic_near(1.0 - t), _cubic_far((1.0 - t) + 1.0)]
    base = floor.to(torch.int64)
    return [((base + k - 1).clamp(0, in_size - 1), weight) for k, weight in enumerate(weights)]


def _fold_spatial(grad: torch.Tensor, input_size: Sequence[int],
                  terms_for: Callable[[int, int, int], list[tuple[torch.Tensor, torch.Tensor | None]]]) -> torch.Tensor:
    """Fold each of the trailing spatial dims (last first); ``terms_for(d, in, out)`` gives dim
    ``d``'s (index, weight) terms."""
    spatial = len(input_size) - 2
    result_dtype = grad.dtype
    folded = grad.to(_accumulation_dtype(grad.dtype))
    for d in reversed(range(spatial)):
        dim = 2 + d
        folded = _fold(folded, dim, input_size[dim], terms_for(d, input_size[dim], grad.shape[dim]))
    return folded.to(result_dtype)


def _scales(output_size: Sequence[int], positional: tuple, named: dict) -> tuple:
    """One scale (or None) per spatial dim, given positionally or by name (``scales_h``...)."""
    names = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}[len(output_size)]
    return tuple(positional) + tuple(named.get(name) for name in names[len(positional):])


def _upsample_nearest_backward(exact: bool) -> Callable[..., torch.Tensor]:
    def backward(grad_output, output_size, input_size, *scales, **named_scales):
        scales = _scales(output_size, scales, named_scales)
        return _fold_spatial(grad_output, input_size, lambda d, n_in, n_out: [
            (_nearest_index(n_in, n_out, scales[d], exact, grad_output.device), None)])

    return backward


def _upsample_linear_backward(grad_output, output_size, input_size, align_corners, *scales, **named_scales):
    scales = _scales(output_size, scales, named_scales)
    return _fold_spatial(grad_output, input_size, lambda d, n_in, n_out: _linear_terms(
        n_in, n_out, scales[d], align_corners, grad_output.device))


def _upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners, *scales, **named_scales):
    scales = _scales(output_size, scales, named_scales)
    return _fold_spatial(grad_output, input_size, lambda d, n_in, n_out: _cubic_terms(
        n_in, n_out, scales[d], align_corners, grad_output.device))


def _replication_pad_backward(grad_output, self, padding):
    spatial = len(padding) // 2
    # padding lists (before, after) pairs from the last dim to the first
    before = [padding[2 * (spatial - 1 - d)] for d in range(spatial)]
    leading = self.dim() - spatial
    input_size = [1] * 2 + list(self.shape[leading:])
    grad = grad_output.reshape((-1, 1) + tuple(grad_output.shape[leading:]))

    def terms(d: int, n_in: int, n_out: int):
        positions = torch.arange(n_out, dtype=torch.int64, device=grad_output.device)
        return [((positions - before[d]).clamp(0, n_in - 1), None)]

    return _fold_spatial(grad, [grad.shape[0], 1] + input_size[2:], terms).reshape(self.shape)


def _roll(self, shifts, dims=()):
    """``roll`` as one ``index_select`` per rolled dim (no dims: over the flattened tensor).

    PyTorch's own decomposition rolls a second dim (or the flattened tensor) by calling
    ``roll`` again, which the runtime sends to the CPU as a re-entered decomposition."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        if len(shifts) != 1:
            raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims: 0")
        return _roll(self.flatten(), shifts, [0]).view(self.shape)
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    result = self
    for shift, dim in zip(shifts, dims):
        size = self.shape[dim]
        if size == 0 or shift % size == 0:
            continue
        index = torch.remainder(torch.arange(size, device=self.device) - shift, size)
        result = result.index_select(dim, index)
    return result.clone() if result is self else result


def _native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    """``native_group_norm`` as the CPU computes it: each (sample, group) row's mean and
    population variance in float32 (the reduced floats' math type), ``rstd = rsqrt(var + eps)``,
    then ``(x - mean) * rstd``, scaled and shifted per channel, rounded once to the input's dtype.
    ``mean`` and ``rstd`` have the parameters' dtype where it differs from the input's (bf16
    activations, float32 parameters), else the input's. Within float rounding of the CPU: its
    moments are summed in another order.

    The runtime hands it a channels-last input contiguous and lays the output out as the
    input (``decomp_guards``). An empty group, or arguments the CPU refuses, run there (its
    result, or its error)."""
    if (HxW == 0 or N == 0 or group <= 0 or C % group or input.numel() != N * C * HxW
            or any(p is not None and p.numel() != C for p in (weight, bias))):
        return NotImplemented
    math_dtype = torch.float32 if input.dtype in (torch.bfloat16, torch.float16) else input.dtype
    rows = input.reshape(N, group, -1).to(math_dtype)
    mean = rows.mean(dim=-1)
    centred = rows - mean.unsqueeze(-1)
    rstd = torch.rsqrt((centred * centred).mean(dim=-1) + eps)
    normal = (centred * rstd.unsqueeze(-1)).reshape(N, C, HxW)
    if weight is not None:
        normal = normal * weight.to(math_dtype).reshape(1, C, 1)
    if bias is not None:
        normal = normal + bias.to(math_dtype).reshape(1, C, 1)
    parameters = weight if weight is not None else bias
    stats_dtype = parameters.dtype if parameters is not None and parameters.dtype != input.dtype else input.dtype
    return normal.reshape(input.shape).to(input.dtype), mean.to(stats_dtype), rstd.to(stats_dtype)


#: PyTorch decompositions outside the core-ATen table that neuron runs natively and that give the
#: CPU's results: exactly (where/clamp/exp forms, a copy, a search), or bicubic upsampling within
#: a few float32 ulps (its taps are summed in another order). Tested in test_neuron_vetted_decompositions;
#: _addmm_activation and grid_sampler_2d (within float rounding: their sums are grouped otherwise)
#: in test_neuron_arith_decompositions.
VETTED = (
    aten.leaky_relu.default,
    aten.hardtanh.default,
    aten.elu.default,
    aten.narrow_copy.default,
    aten.bucketize.Tensor,
    aten.bucketize.Scalar,
    aten.upsample_bicubic2d.default,
    aten._addmm_activation.default,
    aten.grid_sampler_2d.default,
)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, ``VETTED``, and each family's own module's in this package:
    pooling, the small exact arithmetic, counting and selection families, embedding bags,
    sorting, convolution's slow paths, mixed precision's loss scaling, activations, normalisation,
    distances, antialiased resampling, margin losses, random sampling, special functions,
    ``logspace``, segment reductions, the CTC loss, and linear algebra (triangular, Cholesky and LU
    in ``linalg``; QR, eigh and SVD in ``orthogonal``), keyed by aten overload (their ``out=``
    forms follow)."""
    from accelkit_backends.neuron.decompositions import (
        activation, amp, antialias, arith, conv, count, ctc, distance, embedding, linalg, logspace, margin_loss,
        norm, orthogonal, pool, random, segment, select, sort, special,
    )

    from torch._decomp import decomposition_table

    table: dict[OpOverload, Callable] = {op: decomposition_table[op] for op in VETTED}
    for family in (pool, arith, count, select, embedding, sort, conv, amp, activation, norm, distance, antialias,
                   margin_loss, random, special, segment, ctc, linalg, orthogonal, logspace):
        table.update(family.decompositions())
    for rank in (1, 2, 3):
        table[getattr(aten, f"upsample_nearest{rank}d_backward").default] = _upsample_nearest_backward(False)
        table[getattr(aten, f"_upsample_nearest_exact{rank}d_backward").default] = _upsample_nearest_backward(True)
        table[getattr(aten, f"replication_pad{rank}d_backward").default] = _replication_pad_backward
    table[aten.roll.default] = _roll
    table[aten.native_group_norm.default] = _native_group_norm
    table[aten.upsample_bicubic2d_backward.default] = _upsample_bicubic2d_backward
    for name in ("upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_trilinear3d_backward"):
        table[getattr(aten, name).default] = _upsample_linear_backward
    return table
