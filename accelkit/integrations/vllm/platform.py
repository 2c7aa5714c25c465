"""vLLM's ``Platform`` for the active accelkit backend.

The class attributes that vLLM reads without an instance (``device_type``, ``device_name``,
``dispatch_key``, ``dist_backend``, ``simple_compile_backend``) are the active backend's, set
when this module is imported (vLLM imports it only after :func:`accelkit.integrations.vllm.register`
said the backend is active). Models run vLLM's ``forward_native`` layers (plain torch), attention
is :mod:`.attention` (no CPU-only custom ops), the worker is :class:`.worker.AccelkitWorker`.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch
from vllm.platforms.interface import Platform, PlatformEnum

import accelkit

if TYPE_CHECKING:
    from vllm.config import VllmConfig

_log = logging.getLogger("vllm.accelkit." + __name__.rsplit(".", 1)[-1])  # under vLLM's logging

_BACKEND = accelkit.active_backend() or "privateuseone"


def device_module():
    """``torch.<backend>``, the active backend's device module."""
    return getattr(torch, _BACKEND)


class AccelkitPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = _BACKEND
    device_type: str = _BACKEND
    dispatch_key: str = "PrivateUse1"
    # accelkit registers each backend's c10d process group under the device's name.
    dist_backend: str = _BACKEND
    # torch.compile(backend="<name>") resolves through accelkit's Dynamo entry points. vLLM
    # compiles a few small helpers with it and dynamic=True (the vocab-parallel embedding's mask
    # under tensor parallelism); neuron compiles static shapes only and refuses symbolic sizes,
    # so there they run through Dynamo's "eager" backend (the traced ops, run as they are).
    simple_compile_backend: str = "eager" if _BACKEND == "neuron" else _BACKEND
    device_control_env_var: str = "ACCELKIT_VISIBLE_DEVICES"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return str(device_module().get_device_properties(device_id).name)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return int(torch.accelerator.get_memory_info(device_id)[1])

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(torch.accelerator.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.accelerator.set_device_index(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.manual_seed(seed)

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode(mode=True)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        return None

    @classmethod
    def import_kernels(cls) -> None:
        """No vLLM C++ kernels: every op runs on the device through PyTorch."""

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm.triton_utils.dispatcher import register_kernels

        from .kernels import compute_slot_mapping

        register_kernels({"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping})

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError(f"accelkit ({_BACKEND}): MLA and sparse attention are not supported yet")
        return "accelkit.integrations.vllm.attention.AccelkitAttentionBackend"

    @classmethod
    def get_punica_wrapper(cls) -> str:
        raise NotImplementedError(f"accelkit ({_BACKEND}): LoRA is not supported yet")

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = "accelkit.integrations.vllm.worker.AccelkitWorker"
        cache = vllm_config.cache_config
        if not cache.user_specified_block_size:
            cache.block_size = 16
        # No CUDA graphs. Compiled serving (any mode but NONE, vLLM's default without
        # enforce_eager) is the model's forward under torch.compile(backend=<name>,
        # fullgraph=True, dynamic=False) with Dynamo's guards kept (STOCK_TORCH_COMPILE, made
        # static by the model runner): one graph, and one backend program, per bucket of step
        # shapes (.buckets), attention included, since attention is traced (not an opaque op).
        # vLLM's other modes trace once with symbolic token counts and drop every guard, which
        # would reuse the first step's attention shapes for every bucket.
        compilation = vllm_config.compilation_config
        compilation.cudagraph_capture_sizes = []
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        if compilation.mode != CompilationMode.NONE:
            if compilation.mode != CompilationMode.STOCK_TORCH_COMPILE:
                _log.info("accelkit (%s): compilation mode %s served as STOCK_TORCH_COMPILE (one program per "
                          "bucket)", _BACKEND, compilation.mode.name)
            compilation.mode = CompilationMode.STOCK_TORCH_COMPILE
            compilation.backend = _BACKEND
        vllm_config.scheduler_config.async_scheduling = False
        # Tensor/pipeline parallel: each worker process uses device <local rank>, so each needs
        # that many devices; a simulated backend has ACCELKIT_<NAME>_DEVICES of them (default 1).
        # Set before vLLM spawns its engine and workers, which inherit the environment.
        devices_env = f"ACCELKIT_{_BACKEND.upper()}_DEVICES"
        if parallel.world_size > 1 and devices_env not in os.environ:
            os.environ[devices_env] = str(parallel.world_size)
            _log.info("accelkit (%s): %s=%d, a device per worker", _BACKEND, devices_env, parallel.world_size)
        # The device runtime (XLA's threads for tpu) is initialised at `import torch`: a forked
        # engine process would inherit it mid-flight and deadlock.
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        if parallel.enable_dbo:
            parallel.enable_dbo = False

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return False
