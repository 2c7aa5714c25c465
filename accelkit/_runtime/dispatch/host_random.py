"""Random ops on the host that draw from the device's stream: the CPU fallback's random ops.

A random op that reaches the CPU fallback (every one on ``ref``; the few a backend has no kernel
for) runs PyTorch's CPU kernel for its checks, its result's geometry and dtype, and any ``out=``
resizing, exactly as any fallback op; the values that kernel drew from a throwaway CPU generator
are then replaced by the device stream's (:mod:`accelkit.sdk.random_stream`), computed with numpy from
the op's draw. So a random op gives the same values whichever path runs it, and the generator's
offset advances only when the op succeeded.

Ops whose distributions accelkit does not define (``poisson``, ``_standard_gamma``, ``binomial``,
``_sample_dirichlet``, ``rrelu_with_noise``) keep the CPU kernel's values, drawn from a CPU
generator seeded from their draw (:func:`~._random.host_generator`): they follow the seed and the
offset, but an element's value is not a function of its counter, so a sharded draw of them does
not equal the whole one. Their values are therefore not the same across paths: a backend that
samples them on the device from the stream (neuron does) gives other values than this fallback,
equally distributed and as reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch._ops import OpOverload

from accelkit._runtime.device.random import host_generator, reserve
from accelkit.sdk import random_stream as stream

_Tensor = torch.Tensor


def _bound(op: OpOverload, args: list, kwargs: dict) -> dict[str, Any]:
    """Every argument of ``op`` by name, defaults filled in."""
    bound = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _double(*tensors: Any) -> bool:
    return any(isinstance(t, _Tensor) and t.dtype == torch.float64 for t in tensors)


def _host(value: Any, double: bool) -> Any:
    """A tensor argument as a numpy array of the compute dtype; a number as it is."""
    if isinstance(value, _Tensor):
        return value.detach().to(torch.float64 if double else torch.float32).numpy()
    return value


# ---------------------------------------------------------------------------------------------
# Each op family's values: (bound arguments, draw, result tensor) -> numpy values of its shape
# ---------------------------------------------------------------------------------------------


def _uniform(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    return stream.uniform(draw, tuple(out.shape), a["from"], a["to"], _double(out), np)


def _normal(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    double = _double(out, a["mean"], a["std"])
    return stream.normal(draw, tuple(out.shape), _host(a["mean"], double), _host(a["std"], double), double, np)


def _log_normal(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    return stream.log_normal(draw, tuple(out.shape), a["mean"], a["std"], _double(out), np)


def _cauchy(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    return stream.cauchy(draw, tuple(out.shape), a["median"], a["sigma"], _double(out), np)


def _exponential(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    return stream.exponential(draw, tuple(out.shape), a["lambd"], _double(out), np)


def _geometric(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    return stream.geometric(draw, tuple(out.shape), a["p"], _double(out), np)


def _bernoulli(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    p = a.get("p", a["self"])  # bernoulli.default: self holds the probabilities
    double = _double(p)
    return stream.bernoulli(draw, tuple(out.shape), _host(p, double), double, np)


def _random(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    low, high = stream.random_bounds(out.dtype, a.get("from", 0), a.get("to"))
    return stream.integers(draw, tuple(out.shape), low, high, np)


def _multinomial(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    weights = a["self"]
    double = _double(weights)
    rows = _host(weights, double).reshape(-1, weights.shape[-1])
    drawn = stream.multinomial(draw, rows, int(a["num_samples"]), bool(a["replacement"]), double, np)
    return drawn.reshape(tuple(out.shape))


def _randperm(a: dict, draw: stream.RandomDraw, out: _Tensor) -> Any:
    return stream.permutation(draw, int(a["n"]), np)


_VALUES: dict[str, Callable[[dict, stream.RandomDraw, _Tensor], Any]] = {
    "uniform": _uniform, "normal": _normal, "normal_functional": _normal, "log_normal": _log_normal,
    "cauchy": _cauchy, "exponential": _exponential, "geometric": _geometric, "bernoulli": _bernoulli,
    "random": _random, "multinomial": _multinomial, "randperm": _randperm,
}


def _family(op: OpOverload) -> str:
    return op._schema.name.removeprefix("aten::").removesuffix("_")


#: Ops tagged random that draw nothing themselves (they choose a kernel, or call random ops).
_NOT_DRAWING = frozenset({"_fused_sdp_choice", "dropout", "feature_dropout", "alpha_dropout",
                          "feature_alpha_dropout", "scaled_dot_product_attention"})


def draws(op: OpOverload) -> bool:
    """Whether ``op`` draws random numbers (its values come from the device stream here)."""
    family = _family(op)
    if family in _VALUES:
        return True
    return torch.Tag.nondeterministic_seeded in op.tags and family not in _NOT_DRAWING


def run(ctx: Any, op: OpOverload, kernel: Callable, args: list, kwargs: dict, generator: tuple | None) -> Any:
    """Run the random op ``op`` on host arguments through the CPU ``kernel``, its values drawn
    from the device's stream (see the module docstring). ``generator`` is the op's generator slot
    (None: its schema has none; it draws from the device generator)."""
    bound = _bound(op, args, kwargs)
    device_generator = bound.get(generator[1]) if generator is not None else None
    count = stream.counters_drawn(op, args, kwargs)
    family = _family(op)
    values = _VALUES.get(family)
    if values is None and family != "native_dropout":
        # No distribution of accelkit's: the CPU kernel's values, seeded from the draw.
        draw = reserve(ctx, device_generator, count)
        return _on_cpu_generator(kernel, args, kwargs, generator, host_generator(draw))
    result = _on_cpu_generator(kernel, args, kwargs, generator, torch.Generator())
    draw = reserve(ctx, device_generator, count)
    if family == "native_dropout":
        return _dropout(bound, draw, result)
    target = _random_result(op, bound, result)
    # A 0-dim target's values come as one element: shaped as the target, as any other's are.
    drawn = np.ascontiguousarray(values(bound, draw, target)).reshape(tuple(target.shape))
    target.copy_(torch.from_numpy(drawn))
    return result


def _random_result(op: OpOverload, bound: dict, result: Any) -> _Tensor:
    """The tensor holding the op's random values: ``self`` in place, ``out``, or the result."""
    outs = [a.name for a in op._schema.arguments if a.is_out]
    if outs:
        return bound[outs[0]]
    if op._schema.name.endswith("_"):
        return bound["self"]
    return result


def _dropout(bound: dict, draw: stream.RandomDraw, result: tuple) -> tuple:
    """``native_dropout``'s (output, mask) with the stream's mask, computed as the CPU kernel
    computes its output from its mask."""
    x, p, train = bound["input"], float(bound["p"]), bound["train"]
    output, mask = result
    if (train is None or train) and x.numel():
        keep = 1.0 - p
        mask.copy_(torch.from_numpy(np.ascontiguousarray(stream.dropout_mask(draw, tuple(x.shape), keep, np))))
        output.copy_(x.mul(mask).mul_(0.0 if keep == 0 else 1.0 / keep))
    return result


def _on_cpu_generator(kernel: Callable, args: list, kwargs: dict, slot: tuple | None,
                      generator: torch.Generator) -> Any:
    """``kernel(*args, **kwargs)`` drawing from the CPU ``generator``: passed in the generator
    ``slot``, or, for an op whose schema has none, lent as the CPU default generator's state."""
    if slot is not None:
        index, name = slot
        if index < len(args):
            args = list(args)
            args[index] = generator
        else:
            kwargs = {**kwargs, name: generator}
        return kernel(*args, **kwargs)
    cpu = torch.default_generator
    saved = cpu.get_state()
    cpu.set_state(generator.get_state())
    try:
        return kernel(*args, **kwargs)
    finally:
        cpu.set_state(saved)
