"""Trainium generations as data, the target choice, and the probe.

The simulator models **one NeuronCore** (the unit a PyTorch device maps to) of the chosen
generation. Every figure carries its source key from ``shared/research/hardware-facts.md`` §0:
AWS's architecture pages (``N-arch2/3/4``), chip pages (``N-trn1/2/3``), the DMA guide
(``N-dma``), the performance guide (``N-perf``) and the NKI API (``N-mm``, ``N-tile``). Figures
marked *derived* are arithmetic on sourced ones, with the formula in the source string.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from accelkit.sdk import DeviceModel, DeviceProbe, Interconnect, device_count_from_env, hookimpl

TARGET_ENV = "ACCELKIT_NEURON_TARGET"
#: trn2 (NeuronCore-v3): the generation TorchNeuron launched on and the one AWS sells for
#: training today; trn1 remains the most studied, trn3 the newest.
DEFAULT_TARGET = "trn2"

GiB, KiB, GB, TB = 1 << 30, 1 << 10, 10**9, 10**12


@dataclass(frozen=True)
class CoreSpec:
    """The figures of one NeuronCore that the simulator's rules and cost model read.

    Clocks are in Hz; ``*_elements_per_cycle`` count elements across all 128 partitions;
    DMA rates are bytes per second per DMA queue.
    """

    version: str
    partitions: int
    sbuf_partition_bytes: int
    psum_partition_bytes: int
    psum_banks: int
    gemm_stationary_fmax: int
    gemm_moving_fmax: int
    tensor_clock: float
    vector_clock: float
    scalar_clock: float
    gpsimd_clock: float
    vector_elements_per_cycle: int
    vector_elements_per_cycle_16bit: int
    scalar_elements_per_cycle: int
    gpsimd_elements_per_cycle: int
    dma_queues: int
    dma_queue_rate: float
    dma_fixed_latency_s: float
    hbm_bandwidth: float
    #: TensorE cycles per moving column relative to bf16, per input dtype (fp32 is 4x, N-arch2).
    tensor_cycle_factor: tuple[tuple[torch.dtype, float], ...]
    transpose_in_dma: bool
    #: How long the Tensor engine takes to reach full speed from half after idling (0: no warm-up).
    tensor_warmup_s: float = 0.0
    #: Fixed latency of a DMA whose descriptors the hardware DGE generates (an indirect gather or
    #: scatter), None where descriptors are generated in software (``dma_fixed_latency_s``).
    hardware_dge_latency_s: float | None = None

    def cycle_factor(self, dtype: torch.dtype) -> float:
        for candidate, factor in self.tensor_cycle_factor:
            if candidate == dtype:
                return factor
        return 1.0


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

_GENERATIONS = {
    "trn1": dict(
        core=CoreSpec(
            version="NeuronCore-v2", partitions=128,
            sbuf_partition_bytes=192 * KiB, psum_partition_bytes=16 * KiB, psum_banks=8,
            gemm_stationary_fmax=128, gemm_moving_fmax=512,
            tensor_clock=2.8e9, vector_clock=1.12e9, scalar_clock=1.4e9, gpsimd_clock=1.4e9,
            vector_elements_per_cycle=128, vector_elements_per_cycle_16bit=128,
            scalar_elements_per_cycle=128, gpsimd_elements_per_cycle=128,
            dma_queues=16, dma_queue_rate=27 * GiB, dma_fixed_latency_s=1.3e-6,
            hbm_bandwidth=410 * GiB,
            tensor_cycle_factor=((torch.float32, 4.0),),
            transpose_in_dma=False,
        ),
        memory_bytes=16 * GiB, cores_per_chip=2, chip_memory_bytes=32 * GiB,
        peak_flops={torch.bfloat16: 92 * TB, torch.float16: 92 * TB, torch.float32: 23 * TB,
                    torch.float8_e4m3fn: 92 * TB, torch.float8_e5m2: 92 * TB},
        sources=dict(
            memory_bytes="N-trn1: 32 GiB HBM per chip, 2 NeuronCores -> 16 GiB per core (derived)",
            memory_bandwidth="N-trn1: 820 GiB/s per chip, halved per core (derived)",
            peak_flops="N-arch2: TensorE 92 TFLOPS bf16/fp16/cfp8, 23 TFLOPS fp32",
            sbuf="N-arch2: 24 MiB = 128 partitions x 192 KiB",
            psum="N-arch2: 2 MiB = 128 x 16 KiB, 8 banks of 2 KiB (512 fp32)",
            clocks="N-arch2: TensorE 2.8 GHz, VectorE 1.12 GHz, ScalarE 1.4 GHz, GpSimd 1.4 GHz",
            dma="N-arch2: 16 DMA engines per core at 27 GiB/s each (N-dma: 17 B/ns; the chip's "
                "1 TB/s DMA figure matches 27 GiB/s x 32 engines); N-dma: ~1300 ns fixed cost",
            tiles="N-tile, N-mm: pmax 128, gemm_stationary_fmax 128, gemm_moving_fmax 512",
            transpose="N-mm: on v2 a transpose is a TensorE matmul with the identity",
        ),
    ),
    "trn2": dict(
        core=CoreSpec(
            version="NeuronCore-v3", partitions=128,
            sbuf_partition_bytes=224 * KiB, psum_partition_bytes=16 * KiB, psum_banks=8,
            gemm_stationary_fmax=128, gemm_moving_fmax=512,
            tensor_clock=2.4e9, vector_clock=0.96e9, scalar_clock=1.2e9, gpsimd_clock=1.2e9,
            vector_elements_per_cycle=256, vector_elements_per_cycle_16bit=512,
            scalar_elements_per_cycle=128, gpsimd_elements_per_cycle=128,
            dma_queues=16, dma_queue_rate=23 * GB, dma_fixed_latency_s=1.3e-6,
            hbm_bandwidth=362.5 * GB,
            tensor_cycle_factor=((torch.float32, 4.0), *((d, 0.5) for d in _FP8)),
            transpose_in_dma=True,
            tensor_warmup_s=3e-6, hardware_dge_latency_s=600e-9,
        ),
        memory_bytes=12 * GiB, cores_per_chip=8, chip_memory_bytes=96 * GiB,
        peak_flops={torch.bfloat16: 79 * TB, torch.float16: 79 * TB, torch.float32: 20 * TB,
                    torch.float8_e4m3fn: 158 * TB, torch.float8_e5m2: 158 * TB},
        sources=dict(
            memory_bytes="N-trn2, N-lnc: 96 GiB = 4 banks of 24 GiB, each shared by 2 physical "
                         "cores -> 12 GiB per physical core (derived)",
            memory_bandwidth="N-trn2: 2.9 TB/s per chip / 8 physical cores (derived)",
            peak_flops="N-arch3: TensorE 79 TFLOPS bf16/fp16/tf32, 158 fp8, 20 fp32",
            sbuf="N-arch3: 28 MiB = 128 x 224 KiB", psum="N-arch3: 2 MiB",
            clocks="N-arch3: TensorE 2.4 GHz, VectorE 0.96 GHz, ScalarE/GpSimd 1.2 GHz",
            vector="N-arch3: 512 elem/cycle bf16/fp16 (perf mode), 256 other",
            dma="N-dma: 16 engines per core, 23 B/ns each; ~1300 ns fixed cost",
            tiles="N-tile, N-mm: pmax 128, gemm_stationary_fmax 128, gemm_moving_fmax 512",
            transpose="N-arch3: DMA transpose HBM->SBUF at up to 90% of copy throughput",
            tensor_warmup="overview-summary-page.rst (via research/workloads-and-estimates.md): TensorE "
                          "warms up from about 50% of its speed over about 3 us on trn2/trn3",
            dge="N-arch3: 2 hardware DGEs, about 600 ns per DGE-issued DMA (nki-dge.rst: the compiler "
                "uses them for runtime-computed addresses)",
        ),
    ),
    "trn3": dict(
        core=CoreSpec(
            version="NeuronCore-v4", partitions=128,
            sbuf_partition_bytes=256 * KiB, psum_partition_bytes=16 * KiB, psum_banks=8,
            gemm_stationary_fmax=128, gemm_moving_fmax=512,
            tensor_clock=2.4e9, vector_clock=1.2e9, scalar_clock=1.2e9, gpsimd_clock=1.2e9,
            vector_elements_per_cycle=256, vector_elements_per_cycle_16bit=512,
            scalar_elements_per_cycle=128, gpsimd_elements_per_cycle=128,
            dma_queues=16, dma_queue_rate=33 * GB, dma_fixed_latency_s=1.3e-6,
            hbm_bandwidth=612.5 * GB,
            tensor_cycle_factor=((torch.float32, 4.0), *((d, 0.25) for d in _FP8)),
            transpose_in_dma=True,
            tensor_warmup_s=3e-6, hardware_dge_latency_s=600e-9,
        ),
        memory_bytes=18 * GiB, cores_per_chip=8, chip_memory_bytes=144 * GiB,
        peak_flops={torch.bfloat16: 79 * TB, torch.float16: 79 * TB, torch.float32: 20 * TB,
                    torch.float8_e4m3fn: 315 * TB, torch.float8_e5m2: 315 * TB},
        sources=dict(
            memory_bytes="N-trn3: 144 GiB per chip / 8 cores -> 18 GiB (derived)",
            memory_bandwidth="N-trn3: 4.9 TB/s per chip / 8 cores (derived; N-arch4 says 4.7 TB/s)",
            peak_flops="N-arch4: TensorE 79 TFLOPS bf16/fp16/tf32, 315 MXFP8, 20 fp32",
            sbuf="N-arch4: 32 MiB = 128 x 256 KiB (derived)", psum="N-arch4: 2 MiB",
            clocks="N-arch4: TensorE 2.4 GHz, Vector/Scalar/GpSimd 1.2 GHz",
            vector="N-arch4: 512 elem/cycle bf16/fp16/fp8, 256 other",
            dma="N-dma: 16 engines per core, 33 B/ns each; ~1300 ns fixed cost",
            tiles="N-tile, N-mm: pmax 128, gemm_stationary_fmax 128, gemm_moving_fmax 512 "
                  "(v4 allows more; the simulator keeps the v2/v3 limit)",
            transpose="N-arch4: DMA transpose as on v3",
            tensor_warmup="as trn2 (overview-summary-page.rst)", dge="as trn2 (N-arch4: same DGEs)",
        ),
    ),
}

TARGETS = tuple(_GENERATIONS)

#: Chip-to-chip NeuronLink per generation: (bytes/s per chip, links, source). AWS does not say
#: whether the figure is per direction; it is taken as bidirectional, like Google's ICI figures,
#: and halved per direction. Cores of one chip share it.
_NEURONLINK = {
    "trn1": ("NeuronLink-v2", 384 * GB, 4, "N-arch2, N-trn2 table: NeuronLink-v2, 4 links, 384 GB/s per chip"),
    "trn2": ("NeuronLink-v3", 1280 * GB, 4, "N-trn2: NeuronLink-v3, 4 links, 1.28 TB/s per chip"),
    "trn3": ("NeuronLink-v4", 2560 * GB, None, "N-trn3: NeuronLink-v4, 2.56 TB/s per device"),
}


#: Host time per NEFF execution (the runtime handing a NEFF to a NeuronCore and learning it
#: finished), as launch time (accelkit.sdk.LaunchLedger). Only trn2 has a published figure;
#: trn1 and trn3 take trn2's (the same Neuron runtime on the host), flagged so.
_LAUNCH_TRN2 = 437e-6
_LAUNCH = {
    "trn2": (_LAUNCH_TRN2, "vllm-neuron docs/design/framework/async_execution.md: a trn2 NeuronCore is idle "
                           "437 µs between two synchronous NEFF executions (research/workloads-and-estimates.md)"),
}
_LAUNCH_UNPUBLISHED = ("no published figure: trn2's (437 µs idle between synchronous NEFF executions, "
                       "vllm-neuron's async-execution note) is used, as the host side (the Neuron runtime) "
                       "is the same software")


#: Between instances, EFA: (bits/s per instance, chips per instance, source). The figure is taken
#: as per direction (network link rates are) and shared evenly by the instance's chips.
_EFA = {
    "trn1": (800e9, 16, "aws-neuron-sdk about-neuron/arch/neuron-hardware/trn1-arch.rst: trn1.32xlarge, "
                        "16 chips, EFA 800 Gbps (trn1n.32xlarge: 1600)"),
    "trn2": (3200e9, 16, "aws-neuron-sdk about-neuron/arch/neuron-hardware/trn2-arch.rst: trn2.48xlarge, "
                         "16 chips, EFAv3 3200 Gbps"),
}


def _interconnect(generation: str) -> Interconnect:
    name, per_chip, links, source = _NEURONLINK[generation]
    scale_out, chips, sources = None, None, {}
    if generation in _EFA:
        bits, chips, efa_source = _EFA[generation]
        scale_out = Interconnect(name="EFA", bandwidth=bits / 8 / chips, topology="between instances",
                                 sources=dict(bandwidth=f"{efa_source}; per direction, shared by the chips"))
        sources = dict(domain_chips=efa_source, scale_out=efa_source)
    return Interconnect(
        name=name, bandwidth=per_chip / 2, links=links, topology="ring / 2D torus within an instance",
        domain_chips=chips, scale_out=scale_out,
        sources=dict(bandwidth=f"{source}; taken as bidirectional, half per direction",
                     latency="not published: left out", **sources),
    )

#: What NeuronCore memory and engines hold (N-ndt: no 64-bit types; int64 is stored in HBM and
#: computed as int32, see ``runtime.py``).
NATIVE_DTYPES = frozenset({
    torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.bool,
})


def target_name() -> str:
    """The generation to model: ``ACCELKIT_NEURON_TARGET``, else :data:`DEFAULT_TARGET`."""
    raw = os.environ.get(TARGET_ENV, "").strip().lower()
    name = raw.replace("trainium", "trn").replace("-", "") or DEFAULT_TARGET
    if name == "trn":
        name = "trn1"
    if name not in _GENERATIONS:
        raise ValueError(f"{TARGET_ENV}={raw!r} is not a Trainium generation; use one of {', '.join(TARGETS)}")
    return name


def core_spec(name: str | None = None) -> CoreSpec:
    return _GENERATIONS[name or target_name()]["core"]


@hookimpl(specname="accelkit_device_model")
def device_model(generation: str | None = None) -> DeviceModel:
    """The :class:`DeviceModel` of one NeuronCore of a generation (default: :func:`target_name`)."""
    name = generation or target_name()
    spec = dict(_GENERATIONS[name])
    core: CoreSpec = spec.pop("core")
    launch_seconds, launch_source = _LAUNCH.get(name, (_LAUNCH_TRN2, _LAUNCH_UNPUBLISHED))
    return DeviceModel(
        name=name,
        vendor="AWS Trainium",
        # The instance family, as Neuron's PyTorch backend names a device (what TorchTitan's
        # peak-FLOPs table looks up); one device here is one physical NeuronCore of it.
        product=name,
        memory_bytes=spec["memory_bytes"],
        memory_bandwidth=core.hbm_bandwidth,
        peak_flops=spec["peak_flops"],
        dtypes=NATIVE_DTYPES,
        simulated=True,
        sources={**spec["sources"], "product": "instance family (trn1/trn2/trn3), the name TorchTitan's "
                 "get_peak_flops expects from torch.neuron.get_device_properties().name",
                 "launch_seconds": launch_source},
        launch_seconds=launch_seconds,
        extra=dict(
            core=core, neuroncore=core.version, cores_per_chip=spec["cores_per_chip"],
            chip_memory_bytes=spec["chip_memory_bytes"], partitions=core.partitions,
            sbuf_bytes=core.partitions * core.sbuf_partition_bytes,
            psum_bytes=core.partitions * core.psum_partition_bytes,
        ),
        interconnect=_interconnect(name),
    )


@hookimpl
def accelkit_target_model(target: str) -> DeviceModel | None:
    """One NeuronCore of a generation by name (``"trn2"``; None: not a Trainium generation)."""
    name = target.strip().lower()
    return device_model(name) if name in _GENERATIONS else None


@hookimpl(specname="accelkit_probe")
def probe() -> DeviceProbe:
    """Always the simulator: AWS's Neuron runtime is not installable from public registries.

    A real-hardware path would check for ``/dev/neuron*`` and the Neuron runtime here and report
    ``simulated=False``; user code would not change.
    """
    import importlib.util

    try:
        target = target_name()
    except ValueError as exc:
        return DeviceProbe(False, False, reason=str(exc))
    if importlib.util.find_spec("ml_dtypes") is None:
        return DeviceProbe(False, False, reason="ml_dtypes is not installed: pip install 'accelkit[neuron]'")
    try:
        count = device_count_from_env("neuron")
    except ValueError as exc:
        return DeviceProbe(False, True, reason=str(exc))
    return DeviceProbe(
        True, True, device_count=count, target=target,
        reason=f"simulated NeuronCore ({core_spec(target).version}, {target}); "
               "every time figure is an estimate from public specifications",
    )
