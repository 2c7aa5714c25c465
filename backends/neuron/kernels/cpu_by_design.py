"""The ops neuron runs on the CPU by design: the NeuronCore has no way to compute them, each
declared with what it lacks (``KernelTable.on_cpu``). They take the CPU fallback as any op
without a kernel, counted as fallbacks, and the coverage audit lists them apart with the reason.

Only ops the hardware (or the op's own contract) rules out belong here; an op that could be
built from the engines' instructions but is not yet stays an undeclared fallback.
"""

from __future__ import annotations

import torch

from accelkit_backends.neuron.launch import kernels

aten = torch.ops.aten

kernels.on_cpu(
    aten._fft_r2c.default, aten._fft_c2r.default, aten._fft_c2c.default,
    reason="the NeuronCore's engines have no complex type (complex64 is float32 pairs there) and no FFT "
           "(butterfly) primitive: a transform could only be an O(n^2) DFT of real matmuls per axis, not an "
           "FFT's O(n log n)",
)
kernels.on_cpu(
    aten.from_file.default,
    reason="reads a file of the host's file system: host I/O, which the device has no access to",
)
kernels.on_cpu(
    aten._convert_weight_to_int4pack_for_cpu.default, aten._weight_int4pack_mm_for_cpu.default,
    aten._dyn_quant_pack_4bit_weight.default, aten._dyn_quant_matmul_4bit.default,
    reason="the packed int4 weight layout is the CPU kernels' own (its bytes mean something only to "
           "them), so the op is defined for the CPU alone",
)
