"""Convolution tile programs: implicit im2col, one Tensor-engine matmul per kernel tap.

``F.conv1d``/``conv2d`` and ``conv_transpose1d/2d`` reach a PrivateUse1 device as
``convolution_overrideable`` (``convolution_backward_overrideable`` under autograd). The
im2col matrix is never written to HBM: a band of input rows is loaded once into SBUF,
zero-padded ``[channels, rows, Wp]`` with channels on partitions, and for each kernel tap
``(i, j)`` the strided window of that tile *is* the im2col block of that tap: ``out[o, pos] += w[o, c, i, j] * window[c,
pos]`` is a matmul contracting the channels, accumulated over taps and channel tiles in one PSUM
bank. The three programs:

- forward: stationary ``w[:, :, i, j]ᵀ [C, O]``, moving the window ``[C, positions]``;
- input gradient (also the transposed convolution's forward): stationary ``w[:, :, i, j]
  [O, C]``, moving the output gradient ``[O, positions]``; each tap's product is added into a
  zero-padded fp32 SBUF image at the tap's window (col2im on the Vector engine);
- weight gradient: positions contract, so windows are transposed on the Tensor engine
  (``[positions ≤ 128, C]``) and the output gradient is loaded transposed by DMA.

Accumulation is fp32 (PSUM, and SBUF for col2im and the weight gradient), rounded once into the
result's dtype. Supported: 1-d and 2-d, stride, padding, dilation, groups, transposed with
output_padding. A 3-d convolution is declined (``KernelDeclined``) and runs as sums of these 2-d
programs over its depth taps (``decompositions/conv.py``). Images are processed in bands
of rows of at most :data:`BAND_BYTES` per partition (output rows for the forward and the weight
gradient, input rows for col2im), so a 224×224 image fits even trn1's SBUF.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from accelkit.sdk import KernelDeclined
from accelkit_backends.neuron.decompositions.conv import convolution_3d, convolution_backward_3d
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, kernels, tile_kernel
from accelkit_backends.neuron.kernels.convert import fill
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten

#: Free elements per partition when streaming an output gradient for the bias sum.
FMAX = 2048
#: SBUF bytes per partition of one input (or col2im) row band: large images are processed in
#: bands of rows, so a plane never has to fit SBUF whole.
BAND_BYTES = 24 * 1024

Block = tuple[int, int, int, int]  # output rows oh0:oh1, columns ow0:ow1


@dataclass(frozen=True)
class Geometry:
    """A 2-d convolution's static parameters (1-d ones gain a leading unit dimension)."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    kernel: tuple[int, int]
    groups: int

    def padded_width(self, w: int, wo: int) -> int:
        """Columns of an input tile: the padding, widened to what the last window reaches."""
        sw, kw, dw = self.stride[1], self.kernel[1], self.dilation[1]
        return max(w + 2 * self.padding[1], (wo - 1) * sw + (kw - 1) * dw + 1)

    def reach(self, r0: int, r1: int) -> tuple[int, int]:
        """The padded input rows output rows ``r0:r1`` read."""
        sh, kh, dh = self.stride[0], self.kernel[0], self.dilation[0]
        return r0 * sh, (r1 - 1) * sh + (kh - 1) * dh + 1

    def output_rows_per_band(self, wp: int, itemsize: int) -> int:
        """Output rows whose input band fits :data:`BAND_BYTES` per partition (at least one)."""
        sh, kh, dh = self.stride[0], self.kernel[0], self.dilation[0]
        rows = BAND_BYTES // (wp * itemsize)
        return max(1, (rows - (kh - 1) * dh - 1) // sh + 1)

    def tap_rows(self, i: int, q0: int, q1: int, ho: int) -> tuple[int, int]:
        """Output rows whose tap-``i`` row lands in padded input rows ``q0:q1``."""
        sh, dh = self.stride[0], self.dilation[0]
        first, stop = -(-(q0 - i * dh) // sh), -(-(q1 - i * dh) // sh)
        return max(0, first), min(ho, stop)

    def taps(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]

    def window(self, tile: Tile, i: int, j: int, block: Block, origin: int = 0) -> Tile:
        """The input positions tap ``(i, j)`` reads for the outputs of ``block``, in a tile whose
        first row is padded input row ``origin``."""
        oh0, oh1, ow0, ow1 = block
        (sh, sw), (dh, dw) = self.stride, self.dilation
        r0, c0 = i * dh + oh0 * sh - origin, j * dw + ow0 * sw
        return tile[:, r0 : r0 + (oh1 - oh0 - 1) * sh + 1 : sh, c0 : c0 + (ow1 - ow0 - 1) * sw + 1 : sw]


def _ranges(n: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(n, a + size)) for a in range(0, n, size)]


def _blocks(ho: int, wo: int, limit: int) -> list[Block]:
    """Output blocks of at most ``limit`` positions: whole rows, or pieces of one row."""
    if wo <= limit:
        rows = limit // wo
        return [(r, min(ho, r + rows), 0, wo) for r in range(0, ho, rows)]
    return [(r, r + 1, c, min(wo, c + limit)) for r in range(ho) for c in range(0, wo, limit)]


def _blocks_in(r0: int, r1: int, wo: int, limit: int) -> list[Block]:
    """:func:`_blocks` of output rows ``r0:r1``."""
    return [(a + r0, b + r0, c, d) for a, b, c, d in _blocks(r1 - r0, wo, limit)] if r1 > r0 else []


def _positions(block: Block) -> int:
    return (block[1] - block[0]) * (block[3] - block[2])


def _reshaped(tile: Tile, shape: tuple[int, ...]) -> Tile:
    """The same (contiguous) tile seen with another free shape."""
    return Tile(tile.memory, tile.data.reshape(shape), tile.offset, tile.nbytes, tile.name, base=tile.base)


def _flat_view(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` as ``shape`` without a copy (a block of whole rows always allows it)."""
    view = array.view()
    view.shape = shape
    return view


def _load_band(k: Kernel, plane: np.ndarray, q0: int, q1: int, wp: int, pad: tuple[int, int],
               name: str) -> Tile:
    """Padded input rows ``q0:q1`` of ``plane [C, H, W]`` in a zeroed ``[C, q1 - q0, wp]`` tile."""
    c, h, w = plane.shape
    tile = k.sbuf((c, q1 - q0, wp), chip_dtype(plane.dtype), name)
    k.memset(tile, 0)
    h0, h1 = max(0, q0 - pad[0]), min(h, q1 - pad[0])
    if h1 > h0:
        k.dma(tile[:, h0 + pad[0] - q0 : h1 + pad[0] - q0, pad[1] : pad[1] + w], plane[:, h0:h1])
    return tile


def _load(k: Kernel, view: np.ndarray, name: str) -> Tile:
    tile = k.sbuf(view.shape, chip_dtype(view.dtype), name)
    k.dma(tile, view)
    return tile


# ---------------------------------------------------------------------------------------------
# The three programs (4-d NCHW arrays, weight [O, C/groups, kh, kw])
# ---------------------------------------------------------------------------------------------


def forward(k: Kernel, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, out: np.ndarray,
            geo: Geometry) -> None:
    """``out = conv(x, w) + bias``, in bands of output rows."""
    batch, _, _, wd = x.shape
    o_all, cg = w.shape[:2]
    og = o_all // geo.groups
    ho, wo = out.shape[2:]
    wp = geo.padded_width(wd, wo)
    p = k.spec.partitions
    band = geo.output_rows_per_band(wp, chip_dtype(x.dtype).itemsize)
    for g in range(geo.groups):
        c_tiles, o_tiles = _ranges(cg, p), _ranges(og, p)
        with k.scope():
            weights = {(o0, c0): _load(k, np.moveaxis(w[g * og + o0 : g * og + o1, c0:c1], 0, 3), "wT")
                       for o0, o1 in o_tiles for c0, c1 in c_tiles}
            biases = {o0: _load(k, bias[g * og + o0 : g * og + o1].reshape(-1, 1), "bias")
                      for o0, o1 in o_tiles} if bias is not None else {}
            steps = [(c0, i, j) for c0, _ in c_tiles for i, j in geo.taps()]
            for n in range(batch):
                for r0, r1 in _ranges(ho, band):
                    with k.scope():
                        q0, q1 = geo.reach(r0, r1)
                        planes = {c0: _load_band(k, x[n, g * cg + c0 : g * cg + c1], q0, q1, wp, geo.padding, "x")
                                  for c0, c1 in c_tiles}
                        for o0, o1 in o_tiles:
                            for block in _blocks_in(r0, r1, wo, k.spec.gemm_moving_fmax):
                                with k.scope():
                                    acc = k.psum((o1 - o0, _positions(block)), np.float32, "acc")
                                    for step, (c0, i, j) in enumerate(steps):
                                        k.matmul(acc, weights[o0, c0][:, i : i + 1, j : j + 1, :],
                                                 geo.window(planes[c0], i, j, block, q0), accumulate=step > 0)
                                    oh0, oh1, ow0, ow1 = block
                                    target = out[n, g * og + o0 : g * og + o1, oh0:oh1, ow0:ow1]
                                    _store(k, acc, _flat_view(target, acc.shape), biases.get(o0))


def _store(k: Kernel, acc: Tile, target: np.ndarray, bias: Tile | None) -> None:
    """PSUM -> SBUF in the result's dtype (adding a per-partition bias on the way) -> HBM.

    The Scalar engine adds the bias to the fp32 accumulator as it evacuates PSUM and rounds once
    into the result's dtype. Rounding the convolution to bfloat16 before adding the bias (as
    CPU's transposed-convolution kernel does) loses up to half an ulp of the convolution, which
    the bias can cancel down to a small result (0.3125 for 0.285)."""
    result = k.sbuf(acc.shape, chip_dtype(target.dtype), "result")
    if bias is None:
        k.tensor_copy(result, acc)
    else:
        k.activation(result, acc, "identity", bias=bias)
    k.dma(target, result)


def input_grad(k: Kernel, grad: np.ndarray, w: np.ndarray, out: np.ndarray, geo: Geometry,
               bias: np.ndarray | None = None) -> None:
    """``out = conv_input_gradient(grad, w) (+ bias)``: ``out`` has the input's shape. Works in
    bands of input rows; each tap adds the outputs whose window row falls in the band."""
    batch, _, ho, wo = grad.shape
    _, _, h, wd = out.shape
    o_all, cg = w.shape[:2]
    og = o_all // geo.groups
    wp = geo.padded_width(wd, wo)
    ph, pw = geo.padding
    kh, dh, sh = geo.kernel[0], geo.dilation[0], geo.stride[0]
    p = k.spec.partitions
    band = max(1, BAND_BYTES // (wp * 4))
    for g in range(geo.groups):
        c_tiles, o_tiles = _ranges(cg, p), _ranges(og, p)
        with k.scope():
            weights = {(o0, c0): _load(k, np.moveaxis(w[g * og + o0 : g * og + o1, c0:c1], 1, 3), "w")
                       for o0, o1 in o_tiles for c0, c1 in c_tiles}
            biases = {c0: _load(k, bias[g * cg + c0 : g * cg + c1].reshape(-1, 1), "bias")
                      for c0, c1 in c_tiles} if bias is not None else {}
            for n in range(batch):
                for q0, q1 in ((a + ph, b + ph) for a, b in _ranges(h, band)):
                    with k.scope():
                        g0 = max(0, -(-(q0 - (kh - 1) * dh) // sh))
                        g1 = max(g0, min(ho, -(-q1 // sh)))
                        grads = {o0: _load(k, grad[n, g * og + o0 : g * og + o1, g0:g1], "grad")
                                 for o0, o1 in o_tiles} if g1 > g0 else {}
                        for c0, c1 in c_tiles:
                            with k.scope():
                                image = k.sbuf((c1 - c0, q1 - q0, wp), np.float32, "image")
                                k.memset(image, 0)
                                for i, j in geo.taps():
                                    a, b = geo.tap_rows(i, q0, q1, ho)
                                    for block in _blocks_in(a, b, wo, k.spec.gemm_moving_fmax):
                                        with k.scope():
                                            _add_tap(k, image, weights, grads, c0, o_tiles, geo, i, j, block, q0, g0)
                                interior = _reshaped_copy(k, image[:, :, pw : pw + wd])
                                target = out[n, g * cg + c0 : g * cg + c1, q0 - ph : q1 - ph]
                                _store(k, interior, _flat_view(target, interior.shape), biases.get(c0))


def _add_tap(k: Kernel, image: Tile, weights: dict, grads: dict, c0: int, o_tiles: list, geo: Geometry,
             i: int, j: int, block: Block, origin: int, first_grad_row: int) -> None:
    """``image[window of tap (i, j)] += w[:, c, i, j]ᵀ @ grad[:, block]`` (col2im of one tap)."""
    oh0, oh1, ow0, ow1 = block
    r0, r1 = oh0 - first_grad_row, oh1 - first_grad_row
    acc = k.psum((image.partitions, _positions(block)), np.float32, "acc")
    for step, (o0, _) in enumerate(o_tiles):
        k.matmul(acc, weights[o0, c0][:, i : i + 1, j : j + 1, :], grads[o0][:, r0:r1, ow0:ow1],
                 accumulate=step > 0)
    window = geo.window(image, i, j, block, origin)
    k.tensor_tensor(window, window, _reshaped(acc, window.shape), "add")


def _reshaped_copy(k: Kernel, tile: Tile) -> Tile:
    """A strided sub-tile copied into a dense ``[P, free]`` tile (Vector engine)."""
    dense = k.sbuf(tile.shape, np.float32, "dense")
    k.tensor_copy(dense, tile)
    return _reshaped(dense, (tile.partitions, tile.free_size))


def weight_grad(k: Kernel, x: np.ndarray, grad: np.ndarray, out: np.ndarray, geo: Geometry) -> None:
    """``out[o, c, i, j] = sum over images and positions of grad[o] * window_ij(x)[c]``, in bands
    of output rows."""
    batch, _, _, wd = x.shape
    _, _, ho, wo = grad.shape
    o_all, cg = out.shape[:2]
    og = o_all // geo.groups
    wp = geo.padded_width(wd, wo)
    p = k.spec.partitions
    band = geo.output_rows_per_band(wp, chip_dtype(x.dtype).itemsize)
    for g in range(geo.groups):
        for c0, c1 in _ranges(cg, p):
            for o0, o1 in _ranges(og, k.spec.gemm_moving_fmax):
                with k.scope():
                    total = k.sbuf((c1 - c0, *geo.kernel, o1 - o0), np.float32, "total")
                    k.memset(total, 0)
                    for n in range(batch):
                        for r0, r1 in _ranges(ho, band):
                            with k.scope():
                                q0, q1 = geo.reach(r0, r1)
                                plane = _load_band(k, x[n, g * cg + c0 : g * cg + c1], q0, q1, wp, geo.padding, "x")
                                blocks = _blocks_in(r0, r1, wo, p)
                                grads = [_grad_transposed(k, grad[n, g * og + o0 : g * og + o1], b) for b in blocks]
                                for i, j in geo.taps():
                                    with k.scope():
                                        _accumulate_tap(k, total, plane, grads, blocks, geo, i, j, q0)
                    result = k.sbuf(total.shape, chip_dtype(out.dtype), "result")
                    k.tensor_copy(result, total)
                    k.dma(np.moveaxis(out[g * og + o0 : g * og + o1, c0:c1], 0, 3), result)


def _grad_transposed(k: Kernel, grad: np.ndarray, block: Block) -> Tile:
    """``grad[:, block]`` as ``[positions, O]`` (a transposing DMA access pattern)."""
    oh0, oh1, ow0, ow1 = block
    part = grad[:, oh0:oh1, ow0:ow1]
    try:
        flat = _flat_view(part, (part.shape[0], _positions(block)))
    except AttributeError:  # rows not evenly strided (an unusual gradient layout): values only
        flat = np.ascontiguousarray(part).reshape(part.shape[0], -1)
    return _load(k, flat.T, "gradT")


def _accumulate_tap(k: Kernel, total: Tile, plane: Tile, grads: list[Tile], blocks: list[Block],
                    geo: Geometry, i: int, j: int, origin: int) -> None:
    channels, outputs = plane.partitions, grads[0].free_size
    acc = k.psum((channels, outputs), np.float32, "acc")
    for step, (block, grad_t) in enumerate(zip(blocks, grads)):
        with k.scope():
            flipped = k.psum((_positions(block), channels), np.float32, "flipped")
            k.transpose(flipped, geo.window(plane, i, j, block, origin))
            window_t = k.sbuf(flipped.shape, plane.dtype, "windowT")
            k.tensor_copy(window_t, flipped)
            k.matmul(acc, window_t, grad_t, accumulate=step > 0)
    tap = total[:, i : i + 1, j : j + 1, :]
    k.tensor_tensor(tap, tap, _reshaped(acc, tap.shape), "add")


def bias_grad(k: Kernel, grad: np.ndarray, out: np.ndarray) -> None:
    """``out[o] = sum of grad[:, o]`` (Vector-engine reductions, accumulated in fp32)."""
    batch, channels, ho, wo = grad.shape
    for o0, o1 in _ranges(channels, k.spec.partitions):
        with k.scope():
            total = k.sbuf((o1 - o0, 1), np.float32, "total")
            k.memset(total, 0)
            for n in range(batch):
                for block in _blocks(ho, wo, FMAX):
                    with k.scope():
                        oh0, oh1, ow0, ow1 = block
                        part = _load(k, grad[n, o0:o1, oh0:oh1, ow0:ow1], "grad")
                        partial = k.sbuf((o1 - o0, 1), np.float32, "partial")
                        k.tensor_reduce(partial, part, "add")
                        k.tensor_tensor(total, total, partial, "add")
            result = k.sbuf(total.shape, chip_dtype(out.dtype), "result")
            k.tensor_copy(result, total)
            k.dma(out[o0:o1].reshape(-1, 1), result)


# ---------------------------------------------------------------------------------------------
# The aten hooks
# ---------------------------------------------------------------------------------------------


def _as_2d(spatial: int, *arrays: np.ndarray | None) -> list[np.ndarray | None]:
    if spatial == 2:
        return list(arrays)
    if spatial == 1:
        return [None if a is None else a[:, :, None, :] for a in arrays]
    raise KernelDeclined(f"neuron convolution supports 1-d and 2-d, not {spatial}-d")


def _geometry(w: np.ndarray, stride: Any, padding: Any, dilation: Any, groups: int) -> Geometry:
    def pair(values: Any, fill_value: int) -> tuple[int, int]:
        values = tuple(values)
        return values if len(values) == 2 else (fill_value, *values)

    return Geometry(pair(stride, 1), pair(padding, 0), pair(dilation, 1), tuple(w.shape[2:4]), groups)


@tile_kernel(aten.convolution_overrideable.default, static=True)
def convolution(k: Kernel, out: list[OutSpec], x: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
                stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                groups: int) -> np.ndarray:
    result = hbm_empty(out[0])
    spatial = x.ndim - 2
    if result.size == 0:
        return result
    x4, w4, r4 = _as_2d(spatial, x, w, result)
    geo = _geometry(w4, stride, padding, dilation, groups)
    if x4.size == 0 or w4.shape[1] == 0:
        return fill(k, out[0], 0) if bias is None else _bias_only(k, result, bias)
    if transposed:
        input_grad(k, x4, w4, r4, geo, bias)
    else:
        forward(k, x4, w4, bias, r4, geo)
    return result


def _bias_only(k: Kernel, result: np.ndarray, bias: np.ndarray) -> np.ndarray:
    from accelkit_backends.neuron.kernels.shape import copy_view

    copy_view(k, result, np.broadcast_to(bias.reshape((1, -1) + (1,) * (result.ndim - 2)), result.shape))
    return result


@tile_kernel(aten.convolution_backward_overrideable.default, static=True)
def convolution_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, x: np.ndarray, w: np.ndarray,
                         stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                         groups: int, output_mask: list[bool]) -> tuple:
    """(grad_input, grad_weight, grad_bias), None where ``output_mask`` asks for none. A
    transposed convolution's gradients are the direct programs with input and gradient swapped."""
    spatial = x.ndim - 2
    results = [hbm_empty(spec) if wanted and spec is not None else None for spec, wanted in zip(out, output_mask)]
    grad_input, grad_weight, grad_bias = results
    g4, x4, w4, gi4, gw4 = _as_2d(spatial, grad, x, w, grad_input, grad_weight)
    geo = _geometry(w4, stride, padding, dilation, groups)
    empty = grad.size == 0 or x.size == 0
    if grad_input is not None and grad_input.size:
        if empty or w.size == 0:
            results[0] = fill(k, out[0], 0)
        elif transposed:
            forward(k, g4, w4, None, gi4, geo)
        else:
            input_grad(k, g4, w4, gi4, geo)
    if grad_weight is not None and grad_weight.size:
        if empty:
            results[1] = fill(k, out[1], 0)
        elif transposed:
            weight_grad(k, g4, x4, gw4, geo)
        else:
            weight_grad(k, x4, g4, gw4, geo)
    if grad_bias is not None and grad_bias.size:
        if grad.size == 0:
            results[2] = fill(k, out[2], 0)
        else:
            bias_grad(k, g4, grad_bias)
    return tuple(results)


kernels.decompose_declined(aten.convolution_overrideable.default, convolution_3d)
kernels.decompose_declined(aten.convolution_backward_overrideable.default, convolution_backward_3d)
