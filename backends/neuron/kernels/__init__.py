"""neuron tile programs by op family; importing this package registers them all in ``kernels``."""

from accelkit_backends.neuron.kernels import convert, elementwise, matmul  # noqa: F401
from accelkit_backends.neuron.kernels import reductions, softmax, normalization, losses, attention  # noqa: F401
from accelkit_backends.neuron.kernels import indexing, shape, conv, pooling, random, batchnorm  # noqa: F401
from accelkit_backends.neuron.kernels import complex, optimizers  # noqa: F401
from accelkit_backends.neuron.kernels import special  # noqa: F401
from accelkit_backends.neuron.launch import kernels
from accelkit_backends.neuron.kernels import cpu_by_design  # noqa: F401,E402 - declarations, not programs

__all__ = ["kernels"]
