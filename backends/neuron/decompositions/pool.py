"""Pooling the native 2-d programs do not cover (3-d, fractional), as decompositions into
neuron's native ops (2-d pooling, gather, index_select, where, index_add, scatter_add), each
following the CPU kernel's arithmetic.

* Max pooling (``max_pool3d_with_indices``, ``adaptive_max_pool3d``): the native 2-d program
  pools every depth slice over height and width; the depth taps are then merged in increasing
  depth with the CPU's rule (a later value wins when it is greater or NaN; an output's first
  in-bounds tap seeds it), which gives the CPU's value and flat index exactly: the CPU scans the
  window depth-first with the same rule, and a scan over one slice ends where the 2-d program's
  does.
* Fractional max pooling (``fractional_max_pool2d``/``3d``): each plane's windows start where
  the CPU's ``generate_intervals`` puts them for that plane's random samples (computed in the
  samples' type); the window values are gathered and merged tap by tap with the same rule.
* The max poolings' backwards add each output gradient at its saved flat index (``scatter_add``).
* Average pooling (``avg_pool3d``, ``_adaptive_avg_pool3d`` and their backwards): the window sum
  is separable, so it is taken one spatial dim at a time (a sum over that dim's taps), and
  divided by the CPU's divisor; the backward spreads ``grad / divisor`` over the taps with
  ``index_add``. Reduced floats are summed in float32 and rounded once, as the CPU accumulates;
  float32 results may differ from the CPU's in the last bits (the additions' grouping differs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _triple(value: int | Sequence[int] | None, default: Sequence[int] | None = None) -> tuple[int, int, int]:
    if value is None or (not isinstance(value, int) and len(value) == 0):
        value = default
    if isinstance(value, int):
        return value, value, value
    value = tuple(value)
    return value if len(value) == 3 else (value[0],) * 3


def _batched(x: torch.Tensor) -> torch.Tensor:
    """``[C, D, H, W]`` as ``[1, C, D, H, W]`` (5-d inputs as they are)."""
    return x if x.dim() == 5 else x.unsqueeze(0)


def _like_input(result: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return result if x.dim() == 5 else result.squeeze(0)


def _output_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """``pooling_output_shape``: windows that start inside the (left-)padded input."""
    span = n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _on(device: torch.device, values: Sequence, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(list(values), dtype=dtype, device=device)


# -- max pooling -------------------------------------------------------------------------------

def _merge_depth(values: torch.Tensor, indices: torch.Tensor, depth: int, plane: int,
                 taps: Sequence[Sequence[int | None]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge per-slice 2-d results ``[N, C, depth, Ho, Wo]`` over depth taps.

    ``taps[k][od]`` is the input depth of output ``od``'s ``k``-th tap, or None when out of bounds.
    """
    device = values.device
    best = best_index = seeded = None
    for tap in taps:
        valid = _on(device, [d is not None for d in tap], torch.bool).view(-1, 1, 1)
        rows = [0 if d is None else d for d in tap]
        tap_values = values.index_select(2, _on(device, rows))
        tap_indices = indices.index_select(2, _on(device, rows)) + _on(device, rows).view(-1, 1, 1) * plane
        if best is None:
            best, best_index, seeded = tap_values, tap_indices, valid
            continue
        take = valid & (~seeded | (tap_values > best) | torch.isnan(tap_values))
        best = torch.where(take, tap_values, best)
        best_index = torch.where(take, tap_indices, best_index)
        seeded = seeded | valid
    return best, best_index


def _max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    x = _batched(self)
    n, c, depth, h, w = x.shape
    (kd, kh, kw), (sd, sh, sw) = _triple(kernel_size), _triple(stride, kernel_size)
    (pd, ph, pw), (dd, dh, dw) = _triple(padding), _triple(dilation)
    values, indices = aten.max_pool2d_with_indices(
        x.reshape(n, c * depth, h, w), [kh, kw], [sh, sw], [ph, pw], [dh, dw], ceil_mode)
    values = values.reshape(n, c, depth, *values.shape[-2:])
    indices = indices.reshape(n, c, depth, *indices.shape[-2:])
    out_depth = _output_size(depth, kd, sd, pd, dd, ceil_mode)
    taps = [[d if 0 <= d < depth else None for d in (od * sd - pd + k * dd for od in range(out_depth))]
            for k in range(kd)]
    best, best_index = _merge_depth(values, indices, depth, h * w, taps)
    return _like_input(best, self), _like_input(best_index, self)


def _adaptive_start(o: int, out: int, n: int) -> int:
    return (o * n) // out


def _adaptive_end(o: int, out: int, n: int) -> int:
    return -((-(o + 1) * n) // out)


def _adaptive_windows(out: int, n: int) -> list[range]:
    return [range(_adaptive_start(o, out, n), _adaptive_end(o, out, n)) for o in range(out)]


def _adaptive_max_pool3d(self, output_size):
    x = _batched(self)
    n, c, depth, h, w = x.shape
    od_size, oh_size, ow_size = _triple(output_size)
    values, indices = aten.adaptive_max_pool2d(x.reshape(n, c * depth, h, w), [oh_size, ow_size])
    values = values.reshape(n, c, depth, oh_size, ow_size)
    indices = indices.reshape(n, c, depth, oh_size, ow_size)
    taps = _tap_lists(_adaptive_windows(od_size, depth))
    best, best_index = _merge_depth(values, indices, depth, h * w, taps)
    return _like_input(best, self), _like_input(best_index, self)


def _max_pool_backward(grad_output: torch.Tensor, self: torch.Tensor, indices: torch.Tensor,
                       spatial: int = 3) -> torch.Tensor:
    """Each output gradient added at its saved flat index; a reduced float's sums are taken in
    float32 and rounded once (the CPU rounds after every addition, so where windows overlap its
    bfloat16 sum can be a step or two off the correctly rounded one given here)."""
    planes = math.prod(self.shape[:-spatial])
    grad = grad_output.reshape(planes, -1).to(_accumulation_dtype(grad_output.dtype))
    folded = grad.new_zeros((planes, math.prod(self.shape[-spatial:])))
    folded = folded.scatter_add(1, indices.reshape(planes, -1), grad)
    return folded.to(grad_output.dtype).reshape(self.shape)


def _max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                      indices):
    return _max_pool_backward(grad_output, self, indices)


def _adaptive_max_pool3d_backward(grad_output, self, indices):
    return _max_pool_backward(grad_output, self, indices)


def _fractional_starts(samples: torch.Tensor, in_size: int, out_size: int, pool: int) -> torch.Tensor:
    """``generate_intervals``: each window's first input position, ``[planes, out_size]``; the
    arithmetic in the samples' type, as the CPU's (so bfloat16 rounds at every step)."""
    planes = samples.shape[0]
    last = torch.full((planes, 1), in_size - pool, dtype=torch.int64, device=samples.device)
    if out_size == 1:
        return last
    dtype = samples.dtype
    alpha = torch.tensor(in_size - pool, dtype=dtype, device=samples.device) / (out_size - 1)
    steps = torch.arange(out_size - 1, device=samples.device).to(dtype)
    sample = samples.view(planes, 1)
    starts = ((steps + sample) * alpha).trunc().to(torch.int64) - (sample * alpha).trunc().to(torch.int64)
    return torch.cat([starts, last], dim=1)


def _fractional_max_pool(self, kernel_size, output_size, random_samples):
    """Fractional max pooling over the last 2 or 3 dims: the windows of each plane are gathered
    from its own random intervals and merged tap by tap in the CPU's scan order and rule."""
    spatial = len(output_size)
    batched = self.dim() == spatial + 2
    x = self if batched else self.unsqueeze(0)
    n, c, *sizes = x.shape
    planes = n * c
    samples = random_samples[:n].reshape(planes, spatial)  # the CPU reads the first n (one if unbatched)
    # per dim: [planes, out, k] input positions, reshaped to broadcast over the other dims
    positions = []
    # the CPU reads a plane's samples as (width, height) in 2-d and (time, height, width) in 3-d
    sample_of_dim = (1, 0) if spatial == 2 else (0, 1, 2)
    for d, (size, out, k) in enumerate(zip(sizes, output_size, kernel_size)):
        starts = _fractional_starts(samples[:, sample_of_dim[d]].contiguous(), size, out, k)
        positions.append(starts.unsqueeze(-1) + torch.arange(k, device=self.device))
    flat = torch.zeros((), dtype=torch.int64, device=self.device)
    for d in range(spatial):
        # axes: planes, outs (spatial), taps (spatial)
        shape = [planes] + [1] * (2 * spatial)
        shape[1 + d], shape[1 + spatial + d] = output_size[d], kernel_size[d]
        stride = math.prod(sizes[d + 1:])
        flat = flat + positions[d].view(shape) * stride
    taps = math.prod(kernel_size)
    flat = flat.reshape(planes, math.prod(output_size), taps)
    values = x.reshape(planes, -1).gather(1, flat.reshape(planes, -1)).reshape(flat.shape)
    best, best_index = values[..., 0], flat[..., 0]
    for tap in range(1, taps):
        value = values[..., tap]
        take = (value > best) | torch.isnan(value)
        best = torch.where(take, value, best)
        best_index = torch.where(take, flat[..., tap], best_index)
    shape = (n, c, *output_size) if batched else (c, *output_size)
    return best.reshape(shape), best_index.reshape(shape)


def _fractional_max_pool_backward(grad_output, self, kernel_size, output_size, indices):
    return _max_pool_backward(grad_output, self, indices, len(output_size))


def _adaptive_avg_pool3d_backward_out(grad_output, self, *, grad_input):
    result = _adaptive_avg_pool3d_backward(grad_output, self)
    grad_input.resize_(result.shape)
    return grad_input.copy_(result)


# -- average pooling ---------------------------------------------------------------------------

def _tap_lists(windows: Sequence[range]) -> list[list[int | None]]:
    longest = max((len(window) for window in windows), default=0)
    return [[window[k] if k < len(window) else None for window in windows] for k in range(longest)]


def _sum_taps(x: torch.Tensor, dim: int, taps: list[list[int | None]]) -> torch.Tensor:
    """``out[.., o, ..] = Σ_k x[.., taps[k][o], ..]`` over the valid taps."""
    total = None
    shape = [-1] + [1] * (x.dim() - dim - 1)
    for tap in taps:
        valid = _on(x.device, [d is not None for d in tap], torch.bool).view(shape)
        picked = x.index_select(dim, _on(x.device, [0 if d is None else d for d in tap]))
        picked = torch.where(valid, picked, torch.zeros((), dtype=x.dtype, device=x.device))
        total = picked if total is None else total + picked
    return total


def _spread_taps(grad: torch.Tensor, dim: int, size: int, taps: list[list[int | None]]) -> torch.Tensor:
    """The transpose of :func:`_sum_taps`: each output's gradient added at each of its taps."""
    shape = list(grad.shape)
    shape[dim] = size
    folded = grad.new_zeros(shape)
    view = [-1] + [1] * (grad.dim() - dim - 1)
    for tap in taps:
        valid = _on(grad.device, [d is not None for d in tap], torch.bool).view(view)
        source = torch.where(valid, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
        folded = folded.index_add(dim, _on(grad.device, [0 if d is None else d for d in tap]), source)
    return folded


def _avg_windows(n: int, k: int, s: int, p: int, ceil_mode: bool, count_include_pad: bool
                 ) -> tuple[list[range], list[int]]:
    """Each output's in-bounds input range and its divisor share along one dim (avg_pool3d's
    CPU kernel: the window clipped to the padded input counts with padding, to the input without)."""
    windows, counts = [], []
    for o in range(_output_size(n, k, s, p, 1, ceil_mode)):
        start = o * s - p
        end = min(start + k, n + p)
        padded_length = end - start
        start, end = max(start, 0), min(end, n)
        windows.append(range(start, end))
        counts.append(padded_length if count_include_pad else end - start)
    return windows, counts


def _divisor(device: torch.device, counts: Sequence[Sequence[int]], override: int | None) -> torch.Tensor:
    if override:
        return torch.full((), float(override), dtype=torch.float32, device=device)
    cd, ch, cw = (_on(device, c, torch.float32) for c in counts)
    return cd.view(-1, 1, 1) * ch.view(-1, 1) * cw


def _avg_geometry(self, kernel_size, stride, padding, ceil_mode, count_include_pad):
    kernel, strides, pads = _triple(kernel_size), _triple(stride, kernel_size), _triple(padding)
    return [_avg_windows(n, k, s, p, ceil_mode, count_include_pad)
            for n, k, s, p in zip(self.shape[-3:], kernel, strides, pads)]


def _refuse_reduced_floats(dtype: torch.dtype) -> None:
    """avg_pool3d's CPU kernel has float32/float64 forms only: a reduced float is refused as there."""
    if dtype in (torch.bfloat16, torch.float16):
        raise NotImplementedError(f"avg_pool3d is not implemented for {dtype} (nor on the CPU)")


def _avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    _refuse_reduced_floats(self.dtype)
    geometry = _avg_geometry(self, kernel_size, stride, padding, ceil_mode, count_include_pad)
    total = self.to(_accumulation_dtype(self.dtype))
    for axis in (2, 1, 0):
        total = _sum_taps(total, total.dim() - 3 + axis, _tap_lists(geometry[axis][0]))
    divisor = _divisor(self.device, [counts for _, counts in geometry], divisor_override)
    return (total / divisor).to(self.dtype)


def _avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    _refuse_reduced_floats(grad_output.dtype)
    geometry = _avg_geometry(self, kernel_size, stride, padding, ceil_mode, count_include_pad)
    divisor = _divisor(self.device, [counts for _, counts in geometry], divisor_override)
    grad = grad_output.to(_accumulation_dtype(grad_output.dtype)) / divisor
    for axis in (0, 1, 2):
        dim = grad.dim() - 3 + axis
        grad = _spread_taps(grad, dim, self.shape[dim], _tap_lists(geometry[axis][0]))
    return grad.to(grad_output.dtype)


def _adaptive_avg_geometry(self, output_size) -> list[list[range]]:
    return [_adaptive_windows(out, n) for out, n in zip(_triple(output_size), self.shape[-3:])]


def _lengths(device: torch.device, windows: Sequence[range], axis: int) -> torch.Tensor:
    return _on(device, [len(window) for window in windows], torch.float32).view([-1] + [1] * (2 - axis))


def _adaptive_avg_pool3d(self, output_size):
    geometry = _adaptive_avg_geometry(self, output_size)
    total = self.to(_accumulation_dtype(self.dtype))
    for axis in (2, 1, 0):
        total = _sum_taps(total, total.dim() - 3 + axis, _tap_lists(geometry[axis]))
    for axis in (0, 1, 2):  # the CPU divides by each window length in turn
        total = total / _lengths(self.device, geometry[axis], axis)
    return total.to(self.dtype)


def _adaptive_avg_pool3d_backward(grad_output, self):
    geometry = _adaptive_avg_geometry(self, grad_output.shape[-3:])
    grad = grad_output.to(_accumulation_dtype(grad_output.dtype))
    for axis in (0, 1, 2):
        grad = grad / _lengths(self.device, geometry[axis], axis)
    for axis in (0, 1, 2):
        dim = grad.dim() - 3 + axis
        grad = _spread_taps(grad, dim, self.shape[dim], _tap_lists(geometry[axis]))
    return grad.to(grad_output.dtype)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The pooling decompositions, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten.max_pool3d_with_indices.default: _max_pool3d_with_indices,
        aten.max_pool3d_with_indices_backward.default: _max_pool3d_with_indices_backward,
        aten.adaptive_max_pool3d.default: _adaptive_max_pool3d,
        aten.adaptive_max_pool3d_backward.default: _adaptive_max_pool3d_backward,
        aten.avg_pool3d.default: _avg_pool3d,
        aten.avg_pool3d_backward.default: _avg_pool3d_backward,
        aten._adaptive_avg_pool3d.default: _adaptive_avg_pool3d,
        aten._adaptive_avg_pool3d_backward.default: _adaptive_avg_pool3d_backward,
        # its out= form is named without the underscore, so it is not derived from the above
        aten.adaptive_avg_pool3d_backward.grad_input: _adaptive_avg_pool3d_backward_out,
        aten.fractional_max_pool2d.default: _fractional_max_pool,
        aten.fractional_max_pool3d.default: _fractional_max_pool,
        aten.fractional_max_pool2d_backward.default: _fractional_max_pool_backward,
        aten.fractional_max_pool3d_backward.default: _fractional_max_pool_backward,
    }
