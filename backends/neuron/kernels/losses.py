"""Loss tile programs: nll_loss_forward and nll_loss_backward (cross_entropy's second half).

Samples sit on partitions, classes along the free axis. Each sample's target class is picked
without a gather: GpSimd ``iota`` numbers the classes, comparing them with the target gives a
one-hot mask, and a masked reduction reads the log-probability (and the class weight) at the
target. Ignored samples get target -1, which matches no class. The batch total (``sum`` and
``mean`` reductions) is a cross-partition sum: a matmul with a ones vector into fp32 PSUM,
accumulated over sample tiles.
"""

from __future__ import annotations

import numpy as np
import torch

from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.tiling import FMAX
from accelkit_backends.neuron.kernels.normalization import load_broadcast
from accelkit_backends.neuron.kernels.reductions import store_rows
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten

REDUCTION_NONE, REDUCTION_MEAN, REDUCTION_SUM = 0, 1, 2


def check_targets(target: np.ndarray, classes: int, ignore_index: int) -> None:
    """Raise as PyTorch does for a target outside ``[0, classes)`` that is not ignored (the
    simulator can check what the hardware would silently read out of bounds)."""
    values = target.reshape(-1)
    bad = values[(values != ignore_index) & ((values < 0) | (values >= classes))]
    if bad.size:
        raise IndexError(f"Target {int(bad[0])} is out of bounds.")


def _as_rows(x: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities as ``[N, C]`` and targets as ``[N, 1]`` (a 1-d input is one sample)."""
    if x.ndim == 1:
        return x.reshape(1, -1), target.reshape(1, 1)
    return x, target.reshape(-1, 1)


def effective_targets(k: Kernel, target: np.ndarray, r0: int, r1: int, ignore_index: int) -> Tile:
    """Targets of samples ``r0:r1`` as an int32 [rows, 1] tile; ignored ones become -1."""
    loaded = k.sbuf((r1 - r0, 1), chip_dtype(target.dtype), "target")
    k.dma(loaded, target[r0:r1])
    kept = k.sbuf(loaded.shape, np.bool_, "not_ignored")
    k.tensor_scalar(kept, loaded, "not_equal", ignore_index)
    effective = k.sbuf(loaded.shape, np.int32, "effective_target")
    k.select(effective, kept, loaded, -1)
    return effective


def target_mask(k: Kernel, targets: Tile, c0: int, c1: int) -> Tile:
    """fp32 one-hot ``[rows, c1 - c0]``: 1 where the class index equals the sample's target."""
    classes = k.sbuf((targets.partitions, c1 - c0), np.int32, "classes")
    k.iota(classes, base=c0)
    mask = k.sbuf(classes.shape, np.float32, "one_hot")
    k.tensor_scalar(mask, classes, "equal", targets)
    return mask


def _picked(k: Kernel, values: Tile, mask: Tile) -> Tile:
    """Per row, the value where ``mask`` is set (a select, so -inf elsewhere stays harmless)."""
    chosen = k.sbuf(values.shape, np.float32, "chosen")
    k.select(chosen, mask, values, 0.0)
    total = k.sbuf((values.partitions, 1), np.float32, "picked")
    k.tensor_reduce(total, chosen, "add")
    return total


@tile_kernel(aten.nll_loss_forward.default, static=True)
def nll_loss_forward(k: Kernel, out: list[OutSpec], x: np.ndarray, target: np.ndarray,
                     weight: np.ndarray | None, reduction: int, ignore_index: int) -> tuple:
    output, total_weight = hbm_empty(out[0]), hbm_empty(out[1])
    rows_view, targets = _as_rows(x, target)
    samples, classes = rows_view.shape
    k.check(lambda t: check_targets(t, classes, ignore_index), targets)
    p = k.spec.partitions
    # As on CPU, a single 1-d sample with reduction "none" is summed (and reports its weight).
    per_sample = reduction == REDUCTION_NONE and x.ndim == 2
    with k.scope():
        totals = k.psum((1, 2), np.float32, "totals")  # (Σ loss, Σ weight) over samples
        ones = k.sbuf((p, 1), np.float32, "ones")
        k.memset(ones, 1.0)
        for r0 in range(0, samples, p):
            r1 = min(samples, r0 + p)
            with k.scope():
                effective = effective_targets(k, targets, r0, r1, ignore_index)
                pair = k.sbuf((r1 - r0, 2), np.float32, "loss_and_weight")
                k.memset(pair, 0.0)
                for c0 in range(0, classes, FMAX):
                    c1 = min(classes, c0 + FMAX)
                    with k.scope():
                        _accumulate_picks(k, rows_view, weight, effective, r0, r1, c0, c1, pair)
                k.tensor_scalar(pair[:, 0:1], pair[:, 0:1], "multiply", -1.0)
                if per_sample:
                    store_rows(k, output.reshape(-1), r0, pair[:, 0:1])
                else:
                    k.matmul(totals, ones[: r1 - r0], pair, accumulate=r0 > 0)
        summary = k.sbuf((1, 2), np.float32, "summary")
        if per_sample or samples == 0:
            k.memset(summary, 0.0)
        else:
            k.tensor_copy(summary, totals)
        if reduction == REDUCTION_MEAN:
            k.tensor_tensor(summary[:, 0:1], summary[:, 0:1], summary[:, 1:2], "divide")
        if not per_sample:
            store_rows(k, output.reshape(-1), 0, summary[:, 0:1])
        store_rows(k, total_weight.reshape(-1), 0, summary[:, 1:2])
    return output, total_weight


def _accumulate_picks(k: Kernel, rows_view: np.ndarray, weight: np.ndarray | None, targets: Tile,
                      r0: int, r1: int, c0: int, c1: int, pair: Tile) -> None:
    """Add each sample's weighted log-probability and weight at its target among classes
    ``c0:c1`` to ``pair[:, 0]`` and ``pair[:, 1]``."""
    values = k.sbuf((r1 - r0, c1 - c0), chip_dtype(rows_view.dtype), "log_probs")
    k.dma(values, rows_view[r0:r1, c0:c1])
    mask = target_mask(k, targets, c0, c1)
    class_weight = load_broadcast(k, weight, r1 - r0, c0, c1, "weight")
    if class_weight is None:
        picked_weight = k.sbuf((r1 - r0, 1), np.float32, "picked_weight")
        k.tensor_reduce(picked_weight, mask, "add")
    else:
        picked_weight = _picked(k, class_weight, mask)
    picked = _picked(k, values, mask)
    k.tensor_tensor(picked, picked, picked_weight, "multiply")
    k.tensor_tensor(pair[:, 0:1], pair[:, 0:1], picked, "add")
    k.tensor_tensor(pair[:, 1:2], pair[:, 1:2], picked_weight, "add")


@tile_kernel(aten.nll_loss_backward.default, static=True)
def nll_loss_backward(k: Kernel, out: list[OutSpec], grad_output: np.ndarray, x: np.ndarray,
                      target: np.ndarray, weight: np.ndarray | None, reduction: int,
                      ignore_index: int, total_weight: np.ndarray) -> np.ndarray:
    """``grad_input[n, c] = -w[c] * g_n / (total weight if mean)`` at ``c = target[n]``, else 0."""
    grad_input = hbm_empty(out[0])
    rows_view, targets = _as_rows(x, target)
    grad_rows = grad_input.reshape(rows_view.shape)
    samples, classes = rows_view.shape
    k.check(lambda t: check_targets(t, classes, ignore_index), targets)
    p = k.spec.partitions
    for r0 in range(0, samples, p):
        r1 = min(samples, r0 + p)
        with k.scope():
            effective = effective_targets(k, targets, r0, r1, ignore_index)
            coefficient = _row_coefficient(k, grad_output, total_weight, reduction, r0, r1)
            for c0 in range(0, classes, FMAX):
                c1 = min(classes, c0 + FMAX)
                with k.scope():
                    mask = target_mask(k, effective, c0, c1)
                    class_weight = load_broadcast(k, weight, r1 - r0, c0, c1, "weight")
                    if class_weight is not None:
                        k.tensor_tensor(mask, mask, class_weight, "multiply")
                    k.tensor_scalar(mask, mask, "multiply", coefficient)
                    rounded = k.sbuf(mask.shape, chip_dtype(grad_rows.dtype), "grad")
                    k.tensor_copy(rounded, mask)
                    k.dma(grad_rows[r0:r1, c0:c1], rounded)
    return grad_input


def _row_coefficient(k: Kernel, grad_output: np.ndarray, total_weight: np.ndarray, reduction: int,
                     r0: int, r1: int) -> Tile:
    """``-g_n`` per sample (``-g / total_weight`` for mean) as an fp32 [rows, 1] tile."""
    rows = r1 - r0
    per_sample = grad_output.reshape(-1)[r0:r1].reshape(rows, 1) if reduction == REDUCTION_NONE \
        else np.broadcast_to(grad_output.reshape(1, 1), (rows, 1))
    grad = k.sbuf((rows, 1), chip_dtype(grad_output.dtype), "grad_output")
    k.dma(grad, per_sample)
    coefficient = k.sbuf((rows, 1), np.float32, "coefficient")
    k.tensor_scalar(coefficient, grad, "multiply", -1.0)
    if reduction == REDUCTION_MEAN:
        divisor = k.sbuf((rows, 1), chip_dtype(total_weight.dtype), "total_weight")
        k.dma(divisor, np.broadcast_to(total_weight.reshape(1, 1), (rows, 1)))
        k.tensor_tensor(coefficient, coefficient, divisor, "divide")
    return coefficient
