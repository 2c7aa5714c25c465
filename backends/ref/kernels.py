"""ref's native kernels: a small set computed with CPU torch on the device buffers.

Each kernel is functional — it gets CPU tensors (views of device memory, which it must not
modify) and returns new ones. The runtime derives the in-place and ``out=`` overloads.
Everything else reaches ref through decompositions and the CPU fallback, which is the point:
ref exercises every path of the pipeline.
"""

from __future__ import annotations

import torch

from accelkit.sdk import KernelTable, hookimpl

aten = torch.ops.aten
kernels = KernelTable("ref")


# -- elementwise ------------------------------------------------------------------------------


@kernels.kernel(aten.add.Tensor, aten.add.Scalar)
def add(x, y, *, alpha=1):
    return torch.add(x, y, alpha=alpha)


@kernels.kernel(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, *, alpha=1):
    return torch.sub(x, y, alpha=alpha)


@kernels.kernel(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    return torch.mul(x, y)


@kernels.kernel(aten.div.Tensor, aten.div.Scalar)
def div(x, y):
    return torch.div(x, y)


@kernels.kernel(aten.neg.default)
def neg(x):
    return torch.neg(x)


@kernels.kernel(aten.exp.default)
def exp(x):
    return torch.exp(x)


@kernels.kernel(aten.tanh.default)
def tanh(x):
    return torch.tanh(x)


@kernels.kernel(aten.relu.default)
def relu(x):
    return torch.relu(x)


@kernels.kernel(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    return aten.threshold_backward.default(grad, x, threshold)


@kernels.kernel(aten.where.self)
def where(condition, x, y):
    return torch.where(condition, x, y)


@kernels.kernel(aten.fill.Scalar)
def fill(x, value):
    return torch.full_like(x, value)


@kernels.kernel(aten.zero.default)
def zero(x):
    return torch.zeros_like(x)


# -- matmul family ----------------------------------------------------------------------------


@kernels.kernel(aten.mm.default)
def mm(a, b):
    return torch.mm(a, b)


@kernels.kernel(aten.bmm.default)
def bmm(a, b):
    return torch.bmm(a, b)


@kernels.kernel(aten.addmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    return torch.addmm(bias, a, b, beta=beta, alpha=alpha)


# -- reductions -------------------------------------------------------------------------------


@kernels.kernel(aten.sum.default)
def sum_all(x, *, dtype=None):
    return torch.sum(x, dtype=dtype)


@kernels.kernel(aten.sum.dim_IntList)
def sum_dims(x, dim, keepdim=False, *, dtype=None):
    return torch.sum(x, dim, keepdim=keepdim, dtype=dtype)


@kernels.kernel(aten.mean.dim)
def mean_dims(x, dim, keepdim=False, *, dtype=None):
    return torch.mean(x, dim, keepdim=keepdim, dtype=dtype)


@hookimpl
def accelkit_kernels() -> KernelTable:
    return kernels
