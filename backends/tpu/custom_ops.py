"""Giving a ``torch.library`` custom op a JAX implementation on tpu (the path for Pallas kernels).

    @torch.library.custom_op("mylib::gelu_tanh", mutates_args=())
    def gelu_tanh(x: torch.Tensor) -> torch.Tensor: ...

    accelkit_backends.tpu.register_jax_kernel(gelu_tanh, lambda x: jax.nn.gelu(x, approximate=True))

The JAX function receives ``jax.numpy`` arrays and returns one array (or a tuple); it runs as
one compiled XLA program per input signature, like every tpu lowering, so it may call
``jax.experimental.pallas`` kernels on a real TPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accelkit_backends.tpu.lowering import Lowering


def _overload(op: Any) -> torch._ops.OpOverload:
    if isinstance(op, torch._ops.OpOverload):
        return op
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op.default
    opoverload = getattr(op, "_opoverload", None)  # a torch.library.custom_op object
    if opoverload is not None:
        return opoverload
    raise TypeError(f"expected a torch.library custom op, got {op!r}")


def register_jax_kernel(op: Any, fn: Callable[..., Any]) -> None:
    """Run ``op`` on tpu tensors with the JAX function ``fn`` (eager mode).

    :raises accelkit.AccelkitError: when the tpu backend is not active in this process.
    """
    from accelkit import _runtime
    from accelkit._errors import AccelkitError
    from accelkit._runtime._dispatch import Pipeline

    ctx = _runtime.active()
    if ctx is None or ctx.name != "tpu":
        raise AccelkitError("register_jax_kernel needs the tpu backend active: accelkit.select_device('tpu') first")
    overload = _overload(op)
    namespace, name = overload._schema.name.split("::")
    library = torch.library.Library(namespace, "IMPL")
    library.impl(overload, Pipeline(ctx).native(overload, Lowering(overload, fn)), "PrivateUse1")
    _LIBRARIES.append(library)


_LIBRARIES: list[torch.library.Library] = []  # kept alive: a dropped Library deregisters its kernels
