"""Convolution's slow paths (the CPU's own im2col kernels, called by name) as decompositions into
neuron's native convolution programs (``kernels/conv.py``):

* ``_slow_conv2d_forward``, ``slow_conv_dilated2d`` and ``slow_conv_transpose2d`` are
  ``convolution`` with their geometry (dilation 1 for the first, transposed for the last);
* ``_slow_conv2d_backward`` (both forms) is ``convolution_backward_overrideable`` (the native
  gradient programs), the bias gradient the output gradient's sum per channel;
* the 3-d forms (``slow_conv3d_forward``, ``slow_conv_dilated3d``, ``slow_conv_transpose3d``),
  which the native programs do not take, are sums over the kernel's depth taps of 2-d
  convolutions: tap ``t`` of a direct convolution reads input depth ``o * stride + t * dilation
  - padding`` for output depth ``o`` (a strided slice of the zero-padded input, its depths folded
  into the batch); a transposed one writes input depth ``i`` to output depth ``i * stride + t *
  dilation - padding`` (one ``index_add`` per tap).

The same depth-tap sums make the 3-d calls native ``convolution_overrideable`` and its backward
decline (their programs are 2-d) run on the device: the kernels in ``kernels/conv.py`` name
:func:`convolution_3d` and :func:`convolution_backward_3d` for their declined calls. A tap's
gradients are the native 2-d gradient programs on the tap's folded slab; the input gradient adds
each tap's back at the depths it read (``index_add``).

The CPU's slow kernels accumulate in float32 for reduced floats; here the 2-d programs
accumulate in float32 too (PSUM), and a 3-d sum over taps is added in float32 and rounded once.
Equal to the CPU's within float rounding (the products are summed in another order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _triple(value: int | Sequence[int], rank: int) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    return values * rank if len(values) == 1 else values


def _with_bias(result: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None:
        return result
    return result + bias.to(result.dtype).reshape((1, -1) + (1,) * (result.dim() - 2))


def _conv2d(self, weight, bias, stride, padding, dilation, transposed=False, output_padding=(0, 0), groups=1):
    return aten.convolution.default(self, weight, bias, list(stride), list(padding), list(dilation), transposed,
                                    list(output_padding), groups)


def _slow_conv2d_forward(self, weight, kernel_size, bias, stride, padding):
    return _conv2d(self, weight.reshape(weight.shape[0], -1, *kernel_size), bias, _triple(stride, 2),
                   _triple(padding, 2), [1, 1])


def _slow_conv2d_backward(grad_output, self, weight, kernel_size, stride, padding, output_mask):
    weight = weight.reshape(weight.shape[0], -1, *kernel_size)
    grad_input, grad_weight, grad_bias = aten.convolution_backward_overrideable.default(
        grad_output, self, weight, _triple(stride, 2), _triple(padding, 2), [1, 1], False, [0, 0], 1,
        [output_mask[0], output_mask[1], False])
    if output_mask[2]:
        grad_bias = grad_output.sum(dim=(0, 2, 3))
    return grad_input, grad_weight, grad_bias


def _slow_conv2d_backward_into(grad_output, self, weight, kernel_size, stride, padding, *, grad_input, grad_weight,
                               grad_bias):
    """The ``grad_input=`` form: all three gradients, written into the given tensors."""
    results = _slow_conv2d_backward(grad_output, self, weight, kernel_size, stride, padding, [True, True, True])
    for out, result in zip((grad_input, grad_weight, grad_bias), results):
        if out.shape != result.shape:
            out.resize_(result.shape)
        out.copy_(result)
    return grad_input, grad_weight, grad_bias


def _slow_conv_dilated2d(self, weight, kernel_size, bias=None, stride=1, padding=0, dilation=1):
    return _conv2d(self, weight, bias, _triple(stride, 2), _triple(padding, 2), _triple(dilation, 2))


def _slow_conv_transpose2d(self, weight, kernel_size, bias=None, stride=1, padding=0, output_padding=0, dilation=1):
    return _conv2d(self, weight, bias, _triple(stride, 2), _triple(padding, 2), _triple(dilation, 2), True,
                   _triple(output_padding, 2))


def _math_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _fold(x: torch.Tensor) -> torch.Tensor:
    """(n, C, D, H, W) as (n * D, C, H, W): each depth a batch item of 2-d programs."""
    return x.transpose(1, 2).reshape((x.shape[0] * x.shape[2], x.shape[1]) + tuple(x.shape[3:]))


def _unfold(y: torch.Tensor, n: int) -> torch.Tensor:
    """:func:`_fold`'s inverse: (n * D, C, H, W) as (n, C, D, H, W)."""
    return y.reshape((n, y.shape[0] // n) + tuple(y.shape[1:])).transpose(1, 2)


def _pad_depth(x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    if not before and not after:
        return x
    zeros = [x.new_zeros(x.shape[:2] + (size,) + x.shape[3:]) for size in (before, after)]
    return torch.cat([zeros[0], x, zeros[1]], dim=2)


class _Taps:
    """A direct 3-d convolution's depth taps: tap ``t`` reads the zero-padded input's depths
    ``t * dilation + o * stride`` for output depths ``o``."""

    def __init__(self, depth: int, taps: int, stride: int, padding: int, dilation: int):
        self.padding, self.stride, self.dilation = padding, stride, dilation
        self.taps = range(taps)
        self.out_depth = (depth + 2 * padding - dilation * (taps - 1) - 1) // stride + 1

    def slab(self, padded: torch.Tensor, t: int) -> torch.Tensor:
        start = t * self.dilation
        return padded[:, :, start:start + self.stride * (self.out_depth - 1) + 1:self.stride]

    def depths(self, t: int, device: torch.device) -> torch.Tensor:
        return torch.arange(self.out_depth, device=device) * self.stride + t * self.dilation


def _conv3d(self, weight, bias, stride, padding, dilation, groups=1) -> torch.Tensor:
    """A direct 3-d convolution as a float32 sum of 2-d ones over the depth taps."""
    stride, padding, dilation = _triple(stride, 3), _triple(padding, 3), _triple(dilation, 3)
    batched = self.dim() == 5
    x = (self if batched else self.unsqueeze(0)).to(_math_dtype(self.dtype))
    w = weight.to(x.dtype)
    geometry = _Taps(x.shape[2], w.shape[2], stride[0], padding[0], dilation[0])
    padded = _pad_depth(x, padding[0], padding[0])
    total = None
    for t in geometry.taps:
        part = _conv2d(_fold(geometry.slab(padded, t)), w[:, :, t].contiguous(), None, stride[1:], padding[1:],
                       dilation[1:], groups=groups)
        total = part if total is None else total + part
    result = _unfold(total, x.shape[0])
    result = _with_bias(result, None if bias is None else bias.to(result.dtype)).to(self.dtype).contiguous()
    return result if batched else result.squeeze(0)


def _transposed_depth(depth: int, taps: int, stride: int, dilation: int, output_padding: int) -> int:
    """The uncropped output depth of a transposed 3-d convolution (before removing padding)."""
    return (depth - 1) * stride + dilation * (taps - 1) + 1 + output_padding


def _conv_transpose3d(self, weight, bias, stride, padding, output_padding, dilation, groups=1) -> torch.Tensor:
    """A transposed 3-d convolution: each depth tap's transposed 2-d convolution added (float32)
    at the output depths its input depths reach."""
    stride, padding = _triple(stride, 3), _triple(padding, 3)
    output_padding, dilation = _triple(output_padding, 3), _triple(dilation, 3)
    batched = self.dim() == 5
    x = (self if batched else self.unsqueeze(0)).to(_math_dtype(self.dtype))
    w = weight.to(x.dtype)
    n, depth, taps = x.shape[0], x.shape[2], w.shape[2]
    full_depth = _transposed_depth(depth, taps, stride[0], dilation[0], output_padding[0])
    folded = _fold(x)
    total = None
    for t in range(taps):
        part = _unfold(_conv2d(folded, w[:, :, t].contiguous(), None, stride[1:], padding[1:], dilation[1:], True,
                               output_padding[1:], groups), n)
        if total is None:
            total = part.new_zeros(part.shape[:2] + (full_depth,) + part.shape[3:])
        reached = torch.arange(depth, device=x.device) * stride[0] + t * dilation[0]
        total = total.index_add(2, reached, part)
    out_depth = full_depth - 2 * padding[0]
    result = _with_bias(total[:, :, padding[0]:padding[0] + out_depth], bias).to(self.dtype).contiguous()
    return result if batched else result.squeeze(0)


def _on_device_3d(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a declined convolution call is one the depth-tap sums take: 3-d, real floats."""
    return x.dim() == 5 and x.is_floating_point() and weight.is_floating_point()


def convolution_3d(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """``convolution_overrideable``'s 3-d calls (its kernel's are 2-d): the depth-tap sums."""
    if not _on_device_3d(input, weight):
        return NotImplemented
    if transposed:
        return _conv_transpose3d(input, weight, bias, stride, padding, output_padding, dilation, groups)
    return _conv3d(input, weight, bias, stride, padding, dilation, groups)


def convolution_backward_3d(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                            groups, output_mask):
    """``convolution_backward_overrideable``'s 3-d calls: per depth tap, the native 2-d gradient
    programs on the tap's folded slab; the weight gradient's tap ``t`` is that tap's, the input
    gradient the float32 sum of every tap's at the depths it read."""
    if not _on_device_3d(input, weight):
        return NotImplemented
    stride, padding = _triple(stride, 3), _triple(padding, 3)
    dilation, output_padding = _triple(dilation, 3), _triple(output_padding, 3)
    math = _math_dtype(input.dtype)
    x, w, g = input.to(math), weight.to(math), grad_output.to(math)
    n, taps = x.shape[0], w.shape[2]
    mask = [bool(output_mask[0]), bool(output_mask[1]), False]
    grad_input = None
    grad_weight = []
    if transposed:
        # forward: tap t's transposed 2-d result lands at depths i * stride + t * dilation of
        # the uncropped output, so its gradient is read back from there
        full_depth = _transposed_depth(x.shape[2], taps, stride[0], dilation[0], output_padding[0])
        g = _pad_depth(g, padding[0], full_depth - padding[0] - g.shape[2])
        folded = _fold(x)
        for t in range(taps):
            reached = torch.arange(x.shape[2], device=x.device) * stride[0] + t * dilation[0]
            gi, gw, _ = aten.convolution_backward_overrideable.default(
                _fold(g.index_select(2, reached)), folded, w[:, :, t].contiguous(), stride[1:], padding[1:],
                dilation[1:], True, output_padding[1:], groups, mask)
            if mask[0]:
                grad_input = gi if grad_input is None else grad_input + gi
            grad_weight.append(gw)
        if mask[0]:
            grad_input = _unfold(grad_input, n)
    else:
        geometry = _Taps(x.shape[2], taps, stride[0], padding[0], dilation[0])
        padded = _pad_depth(x, padding[0], padding[0])
        folded_grad = _fold(g)
        if mask[0]:
            grad_input = torch.zeros_like(padded)
        for t in geometry.taps:
            gi, gw, _ = aten.convolution_backward_overrideable.default(
                folded_grad, _fold(geometry.slab(padded, t)), w[:, :, t].contiguous(), stride[1:], padding[1:],
                dilation[1:], False, [0, 0], groups, mask)
            if mask[0]:
                grad_input = grad_input.index_add(2, geometry.depths(t, x.device), _unfold(gi, n))
            grad_weight.append(gw)
        if mask[0]:
            grad_input = grad_input[:, :, padding[0]:padding[0] + x.shape[2]]
    results = (
        grad_input.to(input.dtype).contiguous() if mask[0] else None,
        torch.stack(grad_weight, dim=2).to(weight.dtype) if mask[1] else None,
        grad_output.to(math).sum(dim=(0, 2, 3, 4)).to(grad_output.dtype) if output_mask[2] else None,
    )
    return results


def _slow_conv3d_forward(self, weight, kernel_size, bias, stride, padding):
    return _conv3d(self, weight.reshape(weight.shape[0], -1, *kernel_size), bias, stride, padding, 1)


def _slow_conv_dilated3d(self, weight, kernel_size, bias=None, stride=1, padding=0, dilation=1):
    return _conv3d(self, weight, bias, stride, padding, dilation)


def _slow_conv_transpose3d(self, weight, kernel_size, bias=None, stride=1, padding=0, output_padding=0, dilation=1):
    return _conv_transpose3d(self, weight, bias, stride, padding, output_padding, dilation)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten._slow_conv2d_forward.default: _slow_conv2d_forward,
        aten._slow_conv2d_backward.output_mask: _slow_conv2d_backward,
        aten._slow_conv2d_backward.grad_input: _slow_conv2d_backward_into,
        aten.slow_conv_dilated2d.default: _slow_conv_dilated2d,
        aten.slow_conv_transpose2d.default: _slow_conv_transpose2d,
        aten.slow_conv3d_forward.default: _slow_conv3d_forward,
        aten.slow_conv_dilated3d.default: _slow_conv_dilated3d,
        aten.slow_conv_transpose3d.default: _slow_conv_transpose3d,
    }
