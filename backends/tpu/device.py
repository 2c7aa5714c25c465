"""TPU generations as data, the target choice, and the probe for real TPUs.

Every figure carries its source key from ``shared/research/hardware-facts.md`` §0 (Google's
TPU pages ``G-*``, JAX's ``tpu_info.py`` ``J-info``, the scaling book ``SB-*``). Per-chip figures
are used, as JAX sees one device per chip (megacore) on v4/v5p; TPU7x exposes two devices per
chip, so its per-device memory is half the chip's.
"""

from __future__ import annotations

import glob
import importlib.util
import os

import torch

from accelkit.sdk import DeviceModel, DeviceProbe, Interconnect, device_count_from_env, hookimpl

TARGET_ENV = "ACCELKIT_TPU_TARGET"
#: v5e: the most widely available Cloud TPU generation and the one JAX's docs use as the example.
DEFAULT_TARGET = "v5e"

GiB, GB, TB = 1 << 30, 10**9, 10**12

_NATIVE = frozenset({
    torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16,
    torch.int32, torch.int64, torch.bool, torch.complex64,
})

_GENERATIONS = {
    "v4": dict(
        memory_bytes=32 * GiB, memory_bandwidth=1200 * GB,
        peak_flops={torch.bfloat16: 275 * TB, torch.int8: 275 * TB},
        extra=dict(tensorcores=2, mxu_per_core=4, mxu_shape=(128, 128), vmem_bytes=16 << 20),
        sources=dict(memory_bytes="G-v4: 32 GiB HBM2", memory_bandwidth="G-v4: 1200 GBps",
                     peak_flops="G-v4: 275 TFLOPS bf16/int8", extra="G-v4 (TensorCores, MXUs); J-info (VMEM)"),
    ),
    "v5e": dict(
        memory_bytes=16 * GB, memory_bandwidth=819 * GB,
        peak_flops={torch.bfloat16: 197 * TB, torch.int8: 393 * TB},
        extra=dict(tensorcores=1, mxu_per_core=4, mxu_shape=(128, 128), vmem_bytes=128 << 20),
        sources=dict(memory_bytes="G-v5e: 16 GB HBM2", memory_bandwidth="G-v5e: 819 GBps",
                     peak_flops="G-v5e: 197 TFLOPS bf16, 393 TOPS int8", extra="G-v5e; J-info (VMEM)"),
    ),
    "v5p": dict(
        memory_bytes=95 * GiB, memory_bandwidth=2765 * GB,
        peak_flops={torch.bfloat16: 459 * TB, torch.int8: 918 * TB},
        extra=dict(tensorcores=2, mxu_per_core=4, mxu_shape=(128, 128), vmem_bytes=64 << 20),
        sources=dict(memory_bytes="G-7x comparison table: 95 GiB", memory_bandwidth="G-v5p: 2765 GBps",
                     peak_flops="G-v5p: 459 TFLOPS bf16; J-info: 918 TOPS int8", extra="G-v5p; J-info (VMEM)"),
    ),
    "v6e": dict(
        memory_bytes=32 * GiB, memory_bandwidth=1640 * GB,
        peak_flops={torch.bfloat16: 918 * TB, torch.int8: 1836 * TB},
        extra=dict(tensorcores=1, mxu_shape=(256, 256), vmem_bytes=128 << 20),
        sources=dict(memory_bytes="G-v6e: 32 GB (J-info 34.4e9 B = 32 GiB)", memory_bandwidth="G-v6e: 1640 GBps",
                     peak_flops="G-v6e: 918 TFLOPS bf16, 1836 TOPS int8", extra="G-v6e (256x256 MXU); J-info (VMEM)"),
    ),
    "7x": dict(
        memory_bytes=96 * GiB, memory_bandwidth=3690 * GB,
        peak_flops={torch.bfloat16: 1153.5 * TB, torch.float8_e4m3fn: 2307 * TB},
        extra=dict(devices_per_chip=2, mxu_shape=(256, 256), vmem_bytes=64 << 20,
                   chip_memory_bytes=192 * GiB, chip_peak_bf16_flops=2307 * TB),
        sources=dict(memory_bytes="G-7x: 192 GiB HBM per chip, two JAX devices per chip (J-info) -> 96 GiB each",
                     memory_bandwidth="G-7x: 7380 GBps per chip, halved per device",
                     peak_flops="G-7x: 2307 TFLOPS bf16, 4614 TFLOPS fp8 per chip, halved per device",
                     extra="G-7x; J-info (two devices per chip, VMEM)"),
    ),
}

TARGETS = tuple(_GENERATIONS)

#: Each generation's name as JAX reports a device of it (``device_kind``; v5e and v6e also go by
#: "TPU v5 lite" / "TPU v6 lite"), used as ``get_device_properties().name``. TorchTitan's
#: peak-FLOPs table recognises the first four; it looks for "v7" and so misses "TPU7x".
_PRODUCTS = {"v4": "TPU v4", "v5e": "TPU v5e", "v5p": "TPU v5p", "v6e": "TPU v6e", "7x": "TPU7x"}

#: Inter-chip interconnect per generation: (bidirectional bytes/s per chip, links, topology,
#: source). Collective estimates use half the bidirectional figure per direction.
_ICI = {
    "v4": (540 * GB, 6, "3D torus", "hardware-facts §1: SB 4.5e10 B/s one-way per link x 6 links (derived, [X])"),
    "v5e": (400 * GB, 4, "2D torus", "G-v5e: ICI 400 GBps bidirectional, 4 ports"),
    "v5p": (1200 * GB, None, "3D torus", "G-v5p: ICI 1200 GBps bidirectional"),
    "v6e": (800 * GB, 4, "2D torus", "G-v6e: ICI 800 GBps bidirectional, 4 ports"),
    "7x": (1200 * GB, None, "3D torus", "G-7x: ICI 1200 GBps bidirectional per chip"),
}


#: Host time per program execution (dispatching an XLA executable from Python and learning it
#: finished), as launch time (accelkit.sdk.LaunchLedger). Only v5e has a published figure; the
#: other generations take v5e's (the same host software, PJRT driven from Python), flagged so.
_LAUNCH_V5E = 100e-6
_LAUNCH = {
    "v5e": (_LAUNCH_V5E, "JAX Pallas TPU matmul guide (docs/pallas/tpu/matmul.ipynb, 'XLA matmul', v5e): "
                         "a bf16 1024³ jnp.matmul timed with block_until_ready takes 119.4 µs against a "
                         "device roofline of 10.9 µs (research/workloads-and-estimates.md): ~100 µs per "
                         "synchronous call, rounded"),
}
_LAUNCH_UNPUBLISHED = ("no published figure: v5e's (~100 µs per synchronous call, Pallas matmul guide) is "
                       "used, as the host side (PJRT from Python) is the same software")


def _launch(name: str) -> tuple[float, str]:
    return _LAUNCH.get(name, (_LAUNCH_V5E, _LAUNCH_UNPUBLISHED))


#: Chips one ICI domain joins (the largest slice, a pod). Beyond it slices talk over the data-centre
#: network (DCN), which is not modelled: a scaling projection past a pod says so.
_POD_CHIPS = {
    "v4": (4096, "G-v4: 4096 chips per pod"),
    "v5e": (256, "G-v5e: up to 256 chips per slice (v5e-256)"),
    "v5p": (8960, "G-v5p: 8960 chips per pod"),
    "v6e": (256, "G-v6e: up to 256 chips per slice (v6e-256)"),
    "7x": (9216, "G-7x: 9216 chips per pod"),
}


def _interconnect(name: str) -> Interconnect:
    bidirectional, links, topology, source = _ICI[name]
    pod, pod_source = _POD_CHIPS[name]
    return Interconnect(
        name="ICI", bandwidth=bidirectional / 2, links=links, topology=topology, domain_chips=pod,
        sources=dict(bandwidth=f"{source}; half per direction", latency="not published: left out",
                     domain_chips=pod_source, scale_out="DCN between slices: not modelled"),
    )


def generation(name: str) -> str | None:
    """The generation ``name`` spells (``"v5e"``, ``"tpu-v6e"``, ``"ironwood"``), or None."""
    name = name.strip().lower().removeprefix("tpu").removeprefix("-")
    if name in ("7", "ironwood"):
        name = "7x"
    return name if name in _GENERATIONS else None


def target_name() -> str:
    """The generation to model: ``ACCELKIT_TPU_TARGET``, else :data:`DEFAULT_TARGET`."""
    name = generation(os.environ.get(TARGET_ENV, "").strip() or DEFAULT_TARGET)
    if name is None:
        raise ValueError(f"{TARGET_ENV}={os.environ.get(TARGET_ENV)!r} is not a TPU generation; use one of {', '.join(TARGETS)}")
    return name


def device_model(name: str | None = None, simulated: bool = True) -> DeviceModel:
    """The :class:`DeviceModel` of a generation (default: :func:`target_name`)."""
    name = name or target_name()
    spec = dict(_GENERATIONS[name])
    peak = dict(spec.pop("peak_flops"))
    # f32 matmuls run as bf16 passes on the MXU (G-bf16); f32 elementwise work is VPU-bound.
    peak.setdefault(torch.float32, peak[torch.bfloat16] / 3)
    sources = dict(spec.pop("sources"))
    sources["float32 peak"] = "derived: XLA's default f32 matmul uses 3 bf16 passes (G-bf16, precision=HIGH)"
    sources["dtypes"] = "hardware-facts §1.3: no f64/c128 hardware; f16 converted"
    sources["product"] = "JAX's device_kind names (jax/_src/pallas/mosaic/tpu_info.py)"
    launch_seconds, sources["launch_seconds"] = _launch(name)
    return DeviceModel(
        name=name, vendor="Google TPU", peak_flops=peak, dtypes=_NATIVE, simulated=simulated,
        sources=sources, interconnect=_interconnect(name), product=_PRODUCTS[name],
        launch_seconds=launch_seconds, **spec,
    )


@hookimpl
def accelkit_device_model() -> DeviceModel:
    """The selected generation, real or simulated as :func:`probe` finds."""
    return device_model(simulated=probe().simulated)


@hookimpl
def accelkit_target_model(target: str) -> DeviceModel | None:
    """A generation by name, as a simulation models it (None: not a TPU generation)."""
    name = generation(target)
    return None if name is None else device_model(name)


def _chips_present() -> int:
    """TPU chips attached to this host (one device node each)."""
    return max(1, len(glob.glob("/dev/accel*")) or len(glob.glob("/dev/vfio/[0-9]*")))


def _real_tpu_present() -> bool:
    """Cheap check: libtpu installed and TPU device nodes present (no jax import)."""
    if importlib.util.find_spec("libtpu") is None:
        return False
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


@hookimpl(specname="accelkit_probe")
def probe() -> DeviceProbe:
    """Real when a TPU and libtpu are present, else simulated on XLA's CPU platform."""
    if importlib.util.find_spec("jax") is None:
        return DeviceProbe(False, False, reason="jax is not installed: pip install 'accelkit[tpu]'")
    try:
        target = target_name()
    except ValueError as exc:
        return DeviceProbe(False, False, reason=str(exc))
    if _real_tpu_present():
        return DeviceProbe(True, False, device_count=_chips_present(), target=target)
    try:
        count = device_count_from_env("tpu")
    except ValueError as exc:
        return DeviceProbe(False, True, reason=str(exc))
    return DeviceProbe(
        True, True, device_count=count, target=target,
        reason=f"no TPU here: XLA's CPU platform runs as a simulated TPU {target}",
    )
