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


def _conv2d(self, weight, bias, stride, padding, dilation, transposed=False, output_padding=(0, 0)):
    return aten.convolution.default(self, weight, bias, list(stride), list(padding), list(dilation), transposed,
                                    list(output_padding), 1)


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


def _conv3d(self, weight, bias, stride, padding, dilation) -> torch.Tensor:
    """A direct 3-d convolution as a float32 sum of 2-d ones over the depth taps."""
    stride, padding, dilation = _triple(stride, 3), _triple(padding, 3), _triple(dilation, 3)
    batched = self.dim() == 5
    x = (self if batched else self.unsqueeze(0)).to(_math_dtype(self.dtype))
    w = weight.to(x.dtype)
    n, channels, depth = x.shape[:3]
    taps = w.shape[2]
    out_depth = (depth + 2 * padding[0] - dilation[0] * (taps - 1) - 1) // stride[0] + 1
    if padding[0]:
        pad = x.new_zeros((n, channels, padding[0]) + tuple(x.shape[3:]))
        x = torch.cat([pad, x, pad], dim=2)
    total = None
    for t in range(taps):
        start = t * dilation[0]
        slab = x[:, :, start:start + stride[0] * (out_depth - 1) + 1:stride[0]]
        folded = slab.transpose(1, 2).reshape((n * out_depth, channels) + tuple(x.shape[3:]))
        part = _conv2d(folded, w[:, :, t].contiguous(), None, stride[1:], padding[1:], dilation[1:])
        total = part if total is None else total + part
    result = total.reshape((n, out_depth) + tuple(total.shape[1:])).transpose(1, 2)
    result = _with_bias(result, None if bias is None else bias.to(result.dtype)).to(self.dtype).contiguous()
    return result if batched else result.squeeze(0)


def _conv_transpose3d(self, weight, bias, stride, padding, output_padding, dilation) -> torch.Tensor:
    """A transposed 3-d convolution: each depth tap's transposed 2-d convolution added (float32)
    at the output depths its input depths reach."""
    stride, padding = _triple(stride, 3), _triple(padding, 3)
    output_padding, dilation = _triple(output_padding, 3), _triple(dilation, 3)
    batched = self.dim() == 5
    x = (self if batched else self.unsqueeze(0)).to(_math_dtype(self.dtype))
    w = weight.to(x.dtype)
    n, channels, depth = x.shape[:3]
    taps = w.shape[2]
    full_depth = (depth - 1) * stride[0] + dilation[0] * (taps - 1) + 1 + output_padding[0]
    folded = x.transpose(1, 2).reshape((n * depth, channels) + tuple(x.shape[3:]))
    total = None
    for t in range(taps):
        part = _conv2d(folded, w[:, :, t].contiguous(), None, stride[1:], padding[1:], dilation[1:], True,
                       output_padding[1:])
        part = part.reshape((n, depth) + tuple(part.shape[1:])).transpose(1, 2)
        if total is None:
            total = part.new_zeros(part.shape[:2] + (full_depth,) + part.shape[3:])
        reached = torch.arange(depth, device=x.device) * stride[0] + t * dilation[0]
        total = total.index_add(2, reached, part)
    out_depth = full_depth - 2 * padding[0]
    result = _with_bias(total[:, :, padding[0]:padding[0] + out_depth], bias).to(self.dtype).contiguous()
    return result if batched else result.squeeze(0)


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
