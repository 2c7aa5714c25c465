"""tpu lowerings by op family; importing this package registers them all in ``kernels``."""

from accelkit_backends.tpu.kernels import elementwise, linalg, reductions  # noqa: F401
from accelkit_backends.tpu.lowering import kernels

__all__ = ["kernels"]
