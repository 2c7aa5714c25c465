"""The simulated NeuronCore: memories (``memory``), an NKI-like instruction set (``isa``), the core
that runs kernels and programs on its clock (``core``, ``timeline``), numerics and a cost model.

Nothing here knows about PyTorch's dispatcher: tile programs (``kernels/``) drive it with numpy
arrays, and it can be used on its own to write and time a kernel.
"""

from accelkit_backends.neuron.sim.alu import ACTIVATIONS, BINARY_OPS
from accelkit_backends.neuron.sim.core import NeuronCore
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.timeline import KernelRecord
from accelkit_backends.neuron.sim.errors import (
    NeuronDtypeError,
    NeuronKernelError,
    PsumOverflowError,
    SbufOverflowError,
    TileShapeError,
)
from accelkit_backends.neuron.sim.memory import Tile

__all__ = [
    "ACTIVATIONS", "BINARY_OPS", "Kernel", "KernelRecord", "NeuronCore", "NeuronDtypeError",
    "NeuronKernelError", "PsumOverflowError", "SbufOverflowError", "Tile", "TileShapeError",
]
