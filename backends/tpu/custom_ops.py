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

from accelkit.sdk import active_backend, as_overload, register_kernel
from accelkit_backends.tpu.lowering import Lowering


def register_jax_kernel(op: Any, fn: Callable[..., Any]) -> None:
    """Run ``op`` on tpu tensors with the JAX function ``fn`` (eager mode).

    :raises accelkit.AccelkitError: when the tpu backend is not active in this process, or
        ``op`` already has a tpu kernel.
    :raises TypeError: ``op`` is not a ``torch.library`` op.
    """
    from accelkit import AccelkitError

    if active_backend() != "tpu":
        raise AccelkitError("register_jax_kernel needs the tpu backend active: accelkit.select_device('tpu') first")
    overload = as_overload(op)
    register_kernel(overload, Lowering(overload, fn))
