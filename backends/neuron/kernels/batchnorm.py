"""Batch-norm tile programs: channels on partitions, statistics reduced along the free axis.

An input ``[N, C, *spatial]`` is read as ``[C, N, S]`` (a DMA access pattern, no copy) in blocks
of at most :data:`FMAX` elements per channel, so every statistic is a per-partition reduction:

- training forward, three passes: the sum (VectorE ``tensor_reduce``), the centred sum of
  squares (ScalarE ``square`` with the negated mean as bias, summed by the same instruction),
  then ``(x - mean) * (invstd * weight) + bias`` (two ScalarE activations per block);
- evaluation forward: the last pass, with the running statistics;
- backward: the sums of ``grad`` and ``grad * (x - mean)`` in one pass, the input gradient in a
  second (training), or ``grad * invstd * weight`` (evaluation).

All arithmetic is fp32 and results are rounded once into their dtype.

**Running statistics.** ``native_batch_norm`` updates ``running_mean``/``running_var`` although
its schema does not declare them written (``UNDECLARED_WRITES`` in
``accelkit/_runtime/dispatch/schema.py``): the kernel returns its three results followed by the new
running statistics — ``(1 - momentum) * old + momentum * batch`` with the unbiased batch
variance, as PyTorch does — and the runtime stores them; ``None`` leaves them unchanged
(evaluation, or no running statistics).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.kernels.shape import free_blocks
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten

#: Free elements per partition in one streamed block (8 KiB of fp32).
FMAX = 2048


def _channels_first(x: np.ndarray) -> np.ndarray:
    """``[N, C, *spatial]`` as ``[C, N, S]``."""
    n, c = x.shape[:2]
    return np.moveaxis(x.reshape(n, c, -1), 1, 0)


def _channel_tiles(c: int, partitions: int) -> list[tuple[int, int]]:
    return [(a, min(c, a + partitions)) for a in range(0, c, partitions)]


def _blocks(view: np.ndarray) -> list[tuple[slice, ...]]:
    return list(free_blocks(view.shape[1:], FMAX))


def _load(k: Kernel, view: np.ndarray, name: str) -> Tile:
    tile = k.sbuf(view.shape, chip_dtype(view.dtype), name)
    k.dma(tile, view)
    return tile


def _vector(k: Kernel, values: np.ndarray | None, c0: int, c1: int, default: float, name: str) -> Tile:
    """A per-channel vector as an fp32 ``[channels, 1]`` tile (``default`` when absent)."""
    tile = k.sbuf((c1 - c0, 1), np.float32, name)
    if values is None:
        k.memset(tile, default)
    else:
        k.tensor_copy(tile, _load(k, values[c0:c1].reshape(-1, 1), name + "_in"))
    return tile


def _store_vector(k: Kernel, tile: Tile, target: np.ndarray, c0: int, c1: int) -> None:
    stored = k.sbuf(tile.shape, chip_dtype(target.dtype), "stored")
    k.tensor_copy(stored, tile)
    k.dma(target[c0:c1].reshape(-1, 1), stored)


def _scaled(k: Kernel, tile: Tile, factor: float, name: str) -> Tile:
    result = k.sbuf(tile.shape, np.float32, name)
    k.tensor_scalar(result, tile, "multiply", factor)
    return result


def _sum(k: Kernel, xc: np.ndarray, c0: int, c1: int, square_around: Tile | None = None) -> Tile:
    """Per channel ``sum(x)``, or ``sum((x - mean)^2)`` given the negated mean."""
    total = k.sbuf((c1 - c0, 1), np.float32, "total")
    k.memset(total, 0)
    for block in _blocks(xc):
        with k.scope():
            x = _load(k, xc[(slice(c0, c1),) + block], "x")
            partial = k.sbuf(total.shape, np.float32, "partial")
            if square_around is None:
                k.tensor_reduce(partial, x, "add")
            else:
                squares = k.sbuf(x.shape, np.float32, "squares")
                k.activation(squares, x, "square", bias=square_around, reduce_into=partial)
            k.tensor_tensor(total, total, partial, "add")
    return total


def _normalize(k: Kernel, xc: np.ndarray, outc: np.ndarray, c0: int, c1: int, neg_mean: Tile,
               scale: Tile, shift: Tile) -> None:
    """``out = (x - mean) * scale + shift`` block by block (two Scalar-engine passes)."""
    for block in _blocks(xc):
        with k.scope():
            index = (slice(c0, c1),) + block
            x = _load(k, xc[index], "x")
            centred = k.sbuf(x.shape, np.float32, "centred")
            k.activation(centred, x, "identity", bias=neg_mean)
            y = k.sbuf(x.shape, chip_dtype(outc.dtype), "y")
            k.activation(y, centred, "identity", scale=scale, bias=shift)
            k.dma(outc[index], y)


def _invstd(k: Kernel, var: Tile, eps: float) -> Tile:
    invstd = k.sbuf(var.shape, np.float32, "invstd")
    k.activation(invstd, var, "rsqrt", bias=eps)
    return invstd


@tile_kernel(aten.native_batch_norm.default, static=True)
def native_batch_norm(k: Kernel, out: list[OutSpec], x: np.ndarray, weight: np.ndarray | None,
                      bias: np.ndarray | None, running_mean: np.ndarray | None,
                      running_var: np.ndarray | None, training: bool, momentum: float, eps: float) -> tuple:
    """(output, save_mean, save_invstd, new running_mean or None, new running_var or None)."""
    if not training and (running_mean is None or running_var is None):
        raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
    result, save_mean, save_invstd = (hbm_empty(spec) for spec in out)
    update = training and running_mean is not None
    new_mean = hbm_empty(running_mean.shape, _torch_dtype(running_mean)) if update else None
    new_var = hbm_empty(running_var.shape, _torch_dtype(running_var)) if update else None
    channels = x.shape[1]
    count = x.size // max(channels, 1)
    xc, outc = _channels_first(x), _channels_first(result)
    for c0, c1 in _channel_tiles(channels, k.spec.partitions):
        with k.scope():
            if training:
                mean = _scaled(k, _sum(k, xc, c0, c1), 1.0 / max(count, 1), "mean")
                neg_mean = _scaled(k, mean, -1.0, "neg_mean")
                var = _scaled(k, _sum(k, xc, c0, c1, square_around=neg_mean), 1.0 / max(count, 1), "var")
            else:
                mean = _vector(k, running_mean, c0, c1, 0.0, "mean")
                neg_mean = _scaled(k, mean, -1.0, "neg_mean")
                var = _vector(k, running_var, c0, c1, 1.0, "var")
            invstd = _invstd(k, var, eps)
            scale = _vector(k, weight, c0, c1, 1.0, "weight")
            k.tensor_tensor(scale, scale, invstd, "multiply")
            _normalize(k, xc, outc, c0, c1, neg_mean, scale, _vector(k, bias, c0, c1, 0.0, "bias"))
            if save_mean.size:
                _store_vector(k, mean, save_mean, c0, c1)
                _store_vector(k, invstd, save_invstd, c0, c1)
            if update:
                unbiased = _scaled(k, var, count / (count - 1) if count > 1 else float("inf"), "unbiased")
                _store_vector(k, _blend(k, running_mean, mean, c0, c1, momentum), new_mean, c0, c1)
                _store_vector(k, _blend(k, running_var, unbiased, c0, c1, momentum), new_var, c0, c1)
    return result, save_mean, save_invstd, new_mean, new_var


@tile_kernel(aten._native_batch_norm_legit.default, static=True)
def native_batch_norm_legit(k: Kernel, out: list[OutSpec], x: np.ndarray, weight: np.ndarray | None,
                            bias: np.ndarray | None, running_mean: np.ndarray, running_var: np.ndarray,
                            training: bool, momentum: float, eps: float) -> tuple:
    """``native_batch_norm`` under the name exported and compiled programs use (its running
    statistics declared written): the same program and results. Evaluating, the CPU returns
    empty saved statistics (PyTorch's Meta kernel says one per channel)."""
    out = _cpu_saved_specs(out, x, (weight, bias, running_mean, running_var), training)
    return native_batch_norm(k, out, x, weight, bias, running_mean, running_var, training, momentum, eps)


@tile_kernel(aten._native_batch_norm_legit.no_stats, static=True)
def native_batch_norm_legit_no_stats(k: Kernel, out: list[OutSpec], x: np.ndarray, weight: np.ndarray | None,
                                     bias: np.ndarray | None, training: bool, momentum: float,
                                     eps: float) -> tuple:
    """Batch norm without running statistics: (output, save_mean, save_invstd)."""
    out = _cpu_saved_specs(out, x, (weight, bias), True)
    return native_batch_norm(k, out, x, weight, bias, None, None, training, momentum, eps)[:3]


@tile_kernel(aten._batch_norm_with_update.default, static=True)
def batch_norm_with_update(k: Kernel, out: list[OutSpec], x: np.ndarray, weight: np.ndarray | None,
                           bias: np.ndarray | None, running_mean: np.ndarray, running_var: np.ndarray,
                           momentum: float, eps: float) -> tuple:
    """Training-mode batch norm that updates the running statistics: (output, save_mean,
    save_invstd, reserve — empty off cuDNN — then the new running statistics)."""
    saved = _cpu_saved_specs(out[:3], x, (weight, bias, running_mean, running_var), True)
    result, save_mean, save_invstd, new_mean, new_var = native_batch_norm(
        k, saved, x, weight, bias, running_mean, running_var, True, momentum, eps)
    return result, save_mean, save_invstd, hbm_empty(out[3]), new_mean, new_var


def _cpu_saved_specs(out: list[OutSpec], x: np.ndarray, params: tuple, training: bool) -> list[OutSpec]:
    """(output, save_mean, save_invstd) geometry as the CPU makes it, where PyTorch's Meta
    kernel says float32 statistics, one per channel: the CPU keeps a bfloat16/float16 input's
    statistics in its dtype unless a float32 parameter mixes types, and saves none (empty)
    evaluating."""
    dtype = nx.torch_dtype(x.dtype)
    mixed = any(p is not None and p.dtype != x.dtype for p in params)
    saved = dtype if dtype in (torch.bfloat16, torch.float16) and not mixed else out[1].dtype
    shape = out[1].shape if training else (0,)
    return [out[0], OutSpec(shape, saved), OutSpec(shape, saved)]


def _torch_dtype(array: np.ndarray) -> torch.dtype:
    return nx.torch_dtype(array.dtype)


def _blend(k: Kernel, old: np.ndarray, batch: Tile, c0: int, c1: int, momentum: float) -> Tile:
    """``(1 - momentum) * old + momentum * batch`` per channel."""
    blended = _vector(k, old, c0, c1, 0.0, "old")
    k.tensor_scalar(blended, blended, "multiply", 1.0 - momentum)
    k.tensor_tensor(blended, blended, _scaled(k, batch, momentum, "step"), "add")
    return blended


@tile_kernel(aten.native_batch_norm_backward.default, static=True)
def native_batch_norm_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, x: np.ndarray,
                               weight: np.ndarray | None, running_mean: np.ndarray | None,
                               running_var: np.ndarray | None, save_mean: np.ndarray | None,
                               save_invstd: np.ndarray | None, train: bool, eps: float,
                               output_mask: list[bool]) -> tuple:
    """(grad_input, grad_weight, grad_bias), None where ``output_mask`` asks for none."""
    wanted = [hbm_empty(spec) if want and spec is not None else None for spec, want in zip(out, output_mask)]
    grad_input, grad_weight, grad_bias = wanted
    channels = x.shape[1]
    count = x.size // max(channels, 1)
    xc, gc = _channels_first(x), _channels_first(grad)
    gic = _channels_first(grad_input) if grad_input is not None else None
    for c0, c1 in _channel_tiles(channels, k.spec.partitions):
        with k.scope():
            if train:
                mean = _vector(k, save_mean, c0, c1, 0.0, "mean")
                invstd = _vector(k, save_invstd, c0, c1, 1.0, "invstd")
            else:
                mean = _vector(k, running_mean, c0, c1, 0.0, "mean")
                invstd = _invstd(k, _vector(k, running_var, c0, c1, 1.0, "var"), eps)
            neg_mean = _scaled(k, mean, -1.0, "neg_mean")
            grad_sum, dot = _grad_sums(k, gc, xc, c0, c1, neg_mean)
            if grad_bias is not None:
                _store_vector(k, grad_sum, grad_bias, c0, c1)
            if grad_weight is not None:
                weight_sum = k.sbuf(dot.shape, np.float32, "weight_sum")  # sum(grad * xhat)
                k.tensor_tensor(weight_sum, dot, invstd, "multiply")
                _store_vector(k, weight_sum, grad_weight, c0, c1)
            if gic is not None:
                scale = _vector(k, weight, c0, c1, 1.0, "weight")
                k.tensor_tensor(scale, scale, invstd, "multiply")
                _input_grad(k, gc, xc, gic, c0, c1, neg_mean, invstd, scale, grad_sum, dot, count, train)
    return grad_input, grad_weight, grad_bias


def _grad_sums(k: Kernel, gc: np.ndarray, xc: np.ndarray, c0: int, c1: int, neg_mean: Tile) -> tuple[Tile, Tile]:
    """Per channel ``sum(grad)`` and ``sum(grad * (x - mean))`` in one pass."""
    grad_sum = k.sbuf((c1 - c0, 1), np.float32, "grad_sum")
    dot = k.sbuf((c1 - c0, 1), np.float32, "dot")
    k.memset(grad_sum, 0)
    k.memset(dot, 0)
    for block in _blocks(xc):
        with k.scope():
            index = (slice(c0, c1),) + block
            g, x = _load(k, gc[index], "grad"), _load(k, xc[index], "x")
            partial = k.sbuf(grad_sum.shape, np.float32, "partial")
            k.tensor_reduce(partial, g, "add")
            k.tensor_tensor(grad_sum, grad_sum, partial, "add")
            centred = k.sbuf(x.shape, np.float32, "centred")
            k.activation(centred, x, "identity", bias=neg_mean)
            k.tensor_tensor(centred, centred, g, "multiply")
            k.tensor_reduce(partial, centred, "add")
            k.tensor_tensor(dot, dot, partial, "add")
    return grad_sum, dot


def _input_grad(k: Kernel, gc: np.ndarray, xc: np.ndarray, gic: np.ndarray, c0: int, c1: int,
                neg_mean: Tile, invstd: Tile, scale: Tile, grad_sum: Tile, dot: Tile, count: int,
                train: bool) -> None:
    """Training: ``(grad - sum(grad)/M - (x - mean) * invstd² * dot/M) * invstd * weight``;
    evaluation: ``grad * invstd * weight``."""
    projection = shift = None
    if train:
        projection = k.sbuf(dot.shape, np.float32, "projection")
        k.tensor_tensor(projection, dot, invstd, "multiply")
        k.tensor_tensor(projection, projection, invstd, "multiply")
        k.tensor_scalar(projection, projection, "multiply", 1.0 / count)
        shift = k.sbuf(dot.shape, np.float32, "shift")
        k.tensor_tensor(shift, grad_sum, scale, "multiply")
        k.tensor_scalar(shift, shift, "multiply", -1.0 / count)
    for block in _blocks(xc):
        with k.scope():
            index = (slice(c0, c1),) + block
            g = _load(k, gc[index], "grad")
            result = k.sbuf(g.shape, chip_dtype(gic.dtype), "grad_input")
            if not train:
                k.activation(result, g, "identity", scale=scale)
            else:
                centred = k.sbuf(g.shape, np.float32, "centred")
                k.activation(centred, _load(k, xc[index], "x"), "identity", bias=neg_mean)
                k.tensor_scalar(centred, centred, "multiply", projection)
                k.tensor_tensor(centred, g, centred, "subtract")
                k.activation(result, centred, "identity", scale=scale, bias=shift)
            k.dma(gic[index], result)


@tile_kernel(aten.batch_norm_backward.default, static=True)
def batch_norm_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, x: np.ndarray, weight: np.ndarray,
                        running_mean: np.ndarray | None, running_var: np.ndarray | None,
                        save_mean: np.ndarray | None, save_invstd: np.ndarray | None, update: bool, eps: float,
                        output_mask: Any, reserve: np.ndarray) -> tuple:
    """``_batch_norm_with_update``'s backward: ``native_batch_norm_backward``'s program (its
    ``save_var`` holds the inverse standard deviation; ``update`` is training; no reserve)."""
    return native_batch_norm_backward(k, out, grad, x, weight, running_mean, running_var, save_mean,
                                      save_invstd, update, eps, output_mask)
