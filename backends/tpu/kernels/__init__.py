"""tpu lowerings by op family; importing this package registers them all in ``kernels``."""

from accelkit_backends.tpu.kernels import elementwise, linalg, reductions  # noqa: F401
from accelkit_backends.tpu.kernels import softmax, sorting  # noqa: F401
from accelkit_backends.tpu.kernels import data_dependent, indexing, shape  # noqa: F401
from accelkit_backends.tpu.kernels import activations, random  # noqa: F401
from accelkit_backends.tpu.kernels import attention, conv, embedding, losses, normalization, pooling  # noqa: F401
from accelkit_backends.tpu.kernels import comparison, complex, factorizations, fft, histograms, special  # noqa: F401
from accelkit_backends.tpu.kernels import bessel, distances, hashing, polynomials, sampling, segments  # noqa: F401
from accelkit_backends.tpu.kernels import upsampling  # noqa: F401
from accelkit_backends.tpu.kernels import foreach  # noqa: F401  (after the single-tensor lowerings it applies)
from accelkit_backends.tpu.lowering import kernels

__all__ = ["kernels"]
