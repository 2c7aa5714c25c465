"""Fused optimizer steps: ``_fused_adam_``, ``_fused_adamw_``, ``_fused_adagrad_``, ``_fused_sgd_``.

Each parameter is one elementwise program over its flat elements: the parameter, its gradient
and its state stream through SBUF together, the update is computed in fp32 on the Vector engine
(the square root on the Scalar engine), and every written tensor is rounded once to its dtype
on the way out, so a bfloat16 parameter keeps fp32 moments in flight as PyTorch's CPU kernel
does. The step's order of operations is the CPU kernel's, so float32 results agree to the last
bit or two (the CPU fuses the moment's multiply-add where its vector path runs).

What is per call rather than per element — the step counts, a tensor ``lr``, ``found_inf`` —
is read by the host before the program is built, as the CPU kernel reads them: the bias
corrections are computed in double from the step count, and a step whose ``found_inf`` is set
writes nothing. ``grad_scale`` stays on the device, a per-partition scalar each gradient chunk
is divided by. These kernels are therefore not static (not replayed).

A kernel returns, per tensor list the op writes, the new value of each tensor (None for a list
the call leaves as it is); the runtime checks them all, then writes them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from accelkit_backends.neuron.launch import OutSpec, hbm_empty, tile_kernel
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile
from accelkit_backends.neuron.tiling import map_flat_outputs

aten = torch.ops.aten
_F32 = np.float32


def _host_value(value: Any) -> float:
    """A 0-dim tensor argument (a step count, a tensor ``lr``) as the host reads it."""
    if isinstance(value, np.ndarray):
        return float(value.reshape(-1)[0])
    return float(value)


def _skipped(found_inf: np.ndarray | None) -> bool:
    """The step was found to overflow (AMP): the CPU kernel then writes nothing."""
    return found_inf is not None and _host_value(found_inf) == 1.0


def _like(array: np.ndarray) -> np.ndarray:
    """A fresh HBM array for the new value of ``array``."""
    return hbm_empty(array.shape, nx.torch_dtype(array.dtype))


def _constants_in(dtype: np.dtype):
    """``value -> fp32 immediate``, first rounded to ``dtype`` when it is a 16-bit float."""
    torch_dtype = nx.torch_dtype(dtype)
    if torch_dtype not in (torch.bfloat16, torch.float16):
        return _F32
    return lambda value: _F32(torch.tensor(value, dtype=torch_dtype).item())


class _Step:
    """The fp32 arithmetic of one chunk, on tiles of the chunk's shape."""

    def __init__(self, k: Kernel, like: Tile):
        self.k, self.shape = k, like.shape

    def new(self, name: str) -> Tile:
        return self.k.sbuf(self.shape, _F32, name)

    def scalar(self, src: Tile, op: str, value: Any, name: str) -> Tile:
        dst = self.new(name)
        self.k.tensor_scalar(dst, src, op, value)
        return dst

    def tensor(self, a: Tile, op: str, b: Tile, name: str) -> Tile:
        dst = self.new(name)
        self.k.tensor_tensor(dst, a, b, op)
        return dst

    def fp32(self, src: Tile, name: str) -> Tile:
        if src.dtype == _F32:
            return src
        dst = self.new(name)
        self.k.tensor_copy(dst, src)
        return dst


def _gradient(s: _Step, grad: Tile, scale: Tile | None, maximize: bool) -> tuple[Tile, Tile]:
    """(the gradient as stored back: unscaled by ``grad_scale``; the gradient the update uses)."""
    g = s.fp32(grad, "g")
    if scale is not None:
        g = s.scalar(g, "divide", scale, "g_unscaled")
    used = s.scalar(g, "multiply", _F32(-1.0), "g_max") if maximize else g
    return g, used


# ---------------------------------------------------------------------------------------------
# Adam and AdamW
# ---------------------------------------------------------------------------------------------


def _adam(decoupled: bool):
    def body(k: Kernel, out: list[OutSpec], params: list, grads: list, exp_avgs: list,
             exp_avg_sqs: list, max_exp_avg_sqs: list, state_steps: list, *, lr: Any, beta1: float,
             beta2: float, weight_decay: float, eps: float, amsgrad: bool, maximize: bool,
             grad_scale: np.ndarray | None = None, found_inf: np.ndarray | None = None) -> tuple:
        if _skipped(found_inf):
            return None, None, None, None, None
        lr = _host_value(lr)
        new = ([], [], [], [], [])
        for i, param in enumerate(params):
            results = (_like(param), _like(grads[i]) if grad_scale is not None else None,
                       _like(exp_avgs[i]), _like(exp_avg_sqs[i]),
                       _like(max_exp_avg_sqs[i]) if amsgrad else None)
            step = float(_F32(_host_value(state_steps[i])))
            _adam_tensor(k, results, param, grads[i], exp_avgs[i], exp_avg_sqs[i],
                         max_exp_avg_sqs[i] if amsgrad else None, grad_scale, step, lr, beta1,
                         beta2, weight_decay, eps, maximize, decoupled)
            for collected, result in zip(new, results):
                collected.append(result)
        return (new[0], new[1] if grad_scale is not None else None, new[2], new[3],
                new[4] if amsgrad else None)

    body.__name__ = "fused_adamw" if decoupled else "fused_adam"
    return body


def _adam_tensor(k: Kernel, results: tuple, param: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray,
                 exp_avg_sq: np.ndarray, max_exp_avg_sq: np.ndarray | None, grad_scale: np.ndarray | None,
                 step: float, lr: float, beta1: float, beta2: float, weight_decay: float, eps: float,
                 maximize: bool, decoupled: bool) -> None:
    # The per-step constants in double, as the CPU kernel computes them, then fp32 immediates.
    step_size = lr / (1 - math.pow(beta1, step))
    bias_correction2_sqrt = math.sqrt(1 - math.pow(beta2, step))
    lerp_weight = _F32(1 - beta1)
    inputs = [param, grad, exp_avg, exp_avg_sq] + [a for a in (max_exp_avg_sq, grad_scale) if a is not None]
    outs = [r for r in results if r is not None]

    def compute(srcs: list[Tile]) -> list[Tile]:
        it = iter(srcs)
        p_in, g_in, m_in, v_in = next(it), next(it), next(it), next(it)
        vmax_in = next(it) if max_exp_avg_sq is not None else None
        scale = next(it) if grad_scale is not None else None
        s = _Step(k, p_in)
        p = s.fp32(p_in, "p")
        g_stored, g = _gradient(s, g_in, scale, maximize)
        if weight_decay != 0:
            if decoupled:
                p = s.scalar(p, "multiply", _F32(1 - lr * weight_decay), "p_decayed")
            else:
                g = s.tensor(g, "add", s.scalar(p, "multiply", _F32(weight_decay), "decay"), "g_decayed")
        # exp_avg.lerp_(g, 1 - beta1), in the form that is exact at either end of the weight.
        m = s.fp32(m_in, "m")
        if abs(lerp_weight) < 0.5:
            m = s.tensor(m, "add", s.scalar(s.tensor(g, "subtract", m, "gm"), "multiply", lerp_weight, "w_gm"), "m_new")
        else:
            towards = s.scalar(s.tensor(g, "subtract", m, "gm"), "multiply", _F32(1) - lerp_weight, "w_gm")
            m = s.tensor(g, "subtract", towards, "m_new")
        v = s.scalar(s.fp32(v_in, "v"), "multiply", _F32(beta2), "v_decayed")
        g_squared = s.tensor(s.scalar(g, "multiply", _F32(1 - beta2), "cg"), "multiply", g, "cgg")
        v = s.tensor(v, "add", g_squared, "v_new")
        second = v
        vmax = None
        if vmax_in is not None:
            vmax = s.tensor(s.fp32(vmax_in, "vmax"), "maximum", v, "vmax_new")
            second = vmax
        denom = s.new("denom")
        k.activation(denom, second, "sqrt")
        denom = s.scalar(s.scalar(denom, "divide", _F32(bias_correction2_sqrt), "denom_bc"), "add", _F32(eps), "denom_eps")
        update = s.tensor(s.scalar(m, "multiply", _F32(-step_size), "sm"), "divide", denom, "update")
        p = s.tensor(p, "add", update, "p_new")
        tiles = [p, g_stored if grad_scale is not None else None, m, v, vmax]
        return [t for t in tiles if t is not None]

    map_flat_outputs(k, outs, inputs, compute)


tile_kernel(aten._fused_adam_.default, aten._fused_adam_.tensor_lr, derive_variants=False)(_adam(False))
tile_kernel(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr, derive_variants=False)(_adam(True))


# ---------------------------------------------------------------------------------------------
# Adagrad
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten._fused_adagrad_.tensor_lr, derive_variants=False)
def fused_adagrad(k: Kernel, out: list[OutSpec], params: list, grads: list, state_sums: list,
                  state_steps: list, *, lr: Any, lr_decay: float, weight_decay: float, eps: float,
                  maximize: bool, grad_scale: np.ndarray | None = None,
                  found_inf: np.ndarray | None = None) -> tuple:
    """``state_sum += g²``; ``param -= clr · g / (√state_sum + eps)`` with
    ``clr = lr / (1 + (step - 1) · lr_decay)``. The step counts are read, not written (the
    optimizer increments them before the call)."""
    if _skipped(found_inf):
        return None, None, None
    lr = _host_value(lr)
    new_params, new_grads, new_sums = [], [], []
    for i, param in enumerate(params):
        step = float(_F32(_host_value(state_steps[i])))
        clr = lr / (1 + (step - 1) * lr_decay)
        # CPU's vectorized bfloat16/float16 step rounds these constants to the parameter's dtype.
        constant = _constants_in(param.dtype)
        results = (_like(param), _like(grads[i]) if grad_scale is not None else None, _like(state_sums[i]))
        inputs = [param, grads[i], state_sums[i]] + ([grad_scale] if grad_scale is not None else [])

        def compute(srcs: list[Tile]) -> list[Tile]:
            s = _Step(k, srcs[0])
            p = s.fp32(srcs[0], "p")
            g_stored, g = _gradient(s, srcs[1], srcs[3] if grad_scale is not None else None, maximize)
            if weight_decay != 0:
                g = s.tensor(g, "add", s.scalar(p, "multiply", constant(weight_decay), "decay"), "g_decayed")
            total = s.tensor(s.fp32(srcs[2], "sum"), "add", s.tensor(g, "multiply", g, "gg"), "sum_new")
            std = s.new("std")
            k.activation(std, total, "sqrt")
            std = s.scalar(std, "add", constant(eps), "std_eps")
            update = s.tensor(s.scalar(g, "multiply", constant(clr), "cg"), "divide", std, "update")
            p = s.tensor(p, "subtract", update, "p_new")
            return [t for t in (p, g_stored if grad_scale is not None else None, total) if t is not None]

        map_flat_outputs(k, [r for r in results if r is not None], inputs, compute)
        new_params.append(results[0])
        new_grads.append(results[1])
        new_sums.append(results[2])
    return new_params, new_grads if grad_scale is not None else None, new_sums


@tile_kernel(aten._fused_adagrad_.default, derive_variants=False)
def fused_adagrad_default(k: Kernel, out: list[OutSpec], *args: Any, **kwargs: Any) -> tuple:
    """The float-``lr`` overload, whose schema also marks ``state_steps`` as written (the
    step leaves them as they are)."""
    return (*fused_adagrad(k, out, *args, **kwargs), None)


# ---------------------------------------------------------------------------------------------
# SGD
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr, derive_variants=False)
def fused_sgd(k: Kernel, out: list[OutSpec], params: list, grads: list, momentum_buffers: list, *,
              weight_decay: float, momentum: float, lr: Any, dampening: float, nesterov: bool,
              maximize: bool, is_first_step: bool, grad_scale: np.ndarray | None = None,
              found_inf: np.ndarray | None = None) -> tuple:
    """``buf = g`` (first step) or ``buf · momentum + (1 - dampening) · g``; the step follows
    ``g + momentum · buf`` (Nesterov) or ``buf``; ``param -= lr · step``. Without momentum
    the buffers are neither read nor written."""
    if _skipped(found_inf):
        return None, None, None
    lr = _host_value(lr)
    with_buffers = momentum != 0
    new_params, new_grads, new_buffers = [], [], []
    for i, param in enumerate(params):
        results = (_like(param), _like(grads[i]) if grad_scale is not None else None,
                   _like(momentum_buffers[i]) if with_buffers else None)
        inputs = [param, grads[i]] + ([momentum_buffers[i]] if with_buffers and not is_first_step else []) \
            + ([grad_scale] if grad_scale is not None else [])

        def compute(srcs: list[Tile]) -> list[Tile]:
            it = iter(srcs)
            p_in, g_in = next(it), next(it)
            buf_in = next(it) if with_buffers and not is_first_step else None
            scale = next(it) if grad_scale is not None else None
            s = _Step(k, p_in)
            p = s.fp32(p_in, "p")
            g_stored, g = _gradient(s, g_in, scale, maximize)
            if weight_decay != 0:
                g = s.tensor(g, "add", s.scalar(p, "multiply", _F32(weight_decay), "decay"), "g_decayed")
            buf = None
            if with_buffers:
                if is_first_step:
                    buf = g
                else:
                    kept = s.scalar(s.fp32(buf_in, "buf"), "multiply", _F32(momentum), "buf_decayed")
                    buf = s.tensor(kept, "add", s.scalar(g, "multiply", _F32(1 - dampening), "dg"), "buf_new")
                g = s.tensor(g, "add", s.scalar(buf, "multiply", _F32(momentum), "mb"), "g_nesterov") \
                    if nesterov else buf
            p = s.tensor(p, "subtract", s.scalar(g, "multiply", _F32(lr), "lg"), "p_new")
            tiles = (p, g_stored if grad_scale is not None else None, buf)
            return [t for t in tiles if t is not None]

        map_flat_outputs(k, [r for r in results if r is not None], inputs, compute)
        new_params.append(results[0])
        new_grads.append(results[1])
        new_buffers.append(results[2])
    return (new_params, new_grads if grad_scale is not None else None,
            new_buffers if with_buffers else None)
