"""vLLM's worker and model runner on the active accelkit device.

The worker puts the model runner, its weights and the KV cache on ``torch.device(<backend>,
index)``; vLLM's GPU model runner does the rest (input preparation on the host, copies to the
device, sampling on the device) with :mod:`.attention` for attention.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import threading

import torch
from vllm.utils.mem_utils import format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment

import accelkit
from accelkit._run.children import annotate_report, reporting
from accelkit._run.children import write_report_at_most_every as write_run_report

from .buckets import MIN_REQS, MIN_TOKENS, bucket, buckets
from .platform import device_module

_log = logging.getLogger("vllm.accelkit." + __name__.rsplit(".", 1)[-1])  # under vLLM's logging

# On a simulated device every in-place write into the KV cache costs a copy of the whole cache
# (measured: about 0.6-0.8 ms per MiB on tpu and neuron), so without an explicit size the cache
# holds this many max-length requests rather than filling the simulated memory.
SIMULATED_KV_REQUESTS = 8

# Under `accelkit run` (see execute_model): seconds between rewrites of the process's report
# while steps run, and of idleness after a step before it is written again.
RUN_REPORT_SECONDS = 2.0
RUN_REPORT_IDLE_SECONDS = 0.5


class AccelkitModelRunner(GPUModelRunner):
    """vLLM's GPU model runner with bucketed step shapes (:mod:`.buckets`): the token count the
    model runs on is padded to a bucket (the padding tokens' slots are -1, so attention writes
    nothing for them), and the attention metadata to a bucket of requests."""

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's loading; in compiled serving (``STOCK_TORCH_COMPILE``, see
        :meth:`.platform.AccelkitPlatform.check_and_update_config`) the model's forward is then
        ``torch.compile(backend=<name>, fullgraph=True, dynamic=False)``: Dynamo keeps its
        guards (the step's shapes, attention metadata's included), so each bucket of step
        shapes is one graph and one backend program, compiled the first time it runs, and
        a later step of the same bucket reuses it. vLLM's own call compiles without
        ``dynamic=False``, which would make a dimension symbolic after its second size."""
        super().load_model(*args, **kwargs)
        from vllm.config import CompilationMode

        if self.compilation_config.mode != CompilationMode.STOCK_TORCH_COMPILE:
            return
        limit = self._bucket_combinations()
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, limit)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, limit)
        self.model.compile(fullgraph=True, dynamic=False, backend=self.compilation_config.backend)

    def _bucket_combinations(self) -> int:
        """An upper bound on the model graphs compiled serving can compile: token buckets x
        request buckets x block-table buckets x two query lengths, plus the profiling run."""
        block_size = self.cache_config.block_size
        max_blocks = max(-(-self.model_config.max_model_len // block_size), 1)
        count = (len(buckets(MIN_TOKENS, self.max_num_tokens)) * len(buckets(MIN_REQS, self.max_num_reqs))
                 * len(buckets(1, max_blocks)) * 2)
        return count + 8

    def _determine_batch_execution_and_padding(self, num_tokens: int, num_reqs: int, *args, **kwargs):
        mode, desc, *rest = super()._determine_batch_execution_and_padding(num_tokens, num_reqs, *args, **kwargs)
        padded = bucket(desc.num_tokens, MIN_TOKENS, self.max_num_tokens)
        if padded != desc.num_tokens:
            desc = dataclasses.replace(desc, num_tokens=padded)
        return (mode, desc, *rest)

    def _get_slot_mappings(self, num_tokens_padded, num_reqs_padded, num_tokens_unpadded, ubatch_slices=None):
        # The slot-mapping kernel (.kernels) already wrote PAD_ID over the whole token bucket;
        # vLLM's fill of the padding rows would be one more program per padding length.
        return super()._get_slot_mappings(num_tokens_padded, num_reqs_padded, num_tokens_padded, ubatch_slices)

    def _build_attention_metadata(self, num_tokens: int, num_reqs: int, max_query_len: int, **kwargs):
        if not kwargs.get("num_reqs_padded") and not kwargs.get("for_cudagraph_capture"):
            # vLLM fills the padding rows: query_start_loc repeats the last offset (no
            # queries), seq_lens are 0, block-table rows point at the null block.
            kwargs["num_reqs_padded"] = bucket(num_reqs, MIN_REQS, self.max_num_reqs)
        return super()._build_attention_metadata(num_tokens, num_reqs, max_query_len, **kwargs)

    def _sync_device(self) -> None:
        device_module().synchronize()

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        if not block_ids:
            return
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        seen: set[int] = set()
        for kv in self.kv_caches if isinstance(self.kv_caches, list) else []:
            if isinstance(kv, torch.Tensor) and kv.data_ptr() not in seen:
                seen.add(kv.data_ptr())
                kv.index_fill_(0, ids, 0)


def _estimated_seconds() -> tuple[float, str] | None:
    """The backend's estimated device time so far and its target (None: it makes none)."""
    estimate = accelkit.stats().get("estimate")
    return (float(estimate["seconds"]), str(estimate["target"])) if estimate else None


class _StepEstimates:
    """Estimated device time per engine step on the target, by kind: ``decode`` (every scheduled
    request gets one token) and ``prefill`` (a prompt's tokens, alone or beside decodes).
    Measured as the difference of the backend's estimate across the step, so it covers exactly
    the device work of the step, sampling included."""

    def __init__(self) -> None:
        self.count = {"decode": 0, "prefill": 0}
        self.seconds = {"decode": 0.0, "prefill": 0.0}
        self.target: str | None = None
        self._open: tuple[str, float] | None = None

    def begin(self, scheduler_output) -> None:
        self._open = None
        if scheduler_output.total_num_scheduled_tokens == 0:
            return
        start = _estimated_seconds()
        if start is None:
            return
        decode = scheduler_output.total_num_scheduled_tokens == len(scheduler_output.num_scheduled_tokens)
        self._open = ("decode" if decode else "prefill", start[0])
        self.target = start[1]

    def end(self) -> None:
        if self._open is None:
            return
        kind, start = self._open
        self._open = None
        end = _estimated_seconds()
        if end is not None:
            self.count[kind] += 1
            self.seconds[kind] += end[0] - start

    def _mean(self, kind: str) -> float | None:
        return self.seconds[kind] / self.count[kind] if self.count[kind] else None

    def figures(self) -> dict:
        return {"target": self.target, "decode_steps": self.count["decode"], "prefill_steps": self.count["prefill"],
                "decode_step_seconds": self._mean("decode"), "prefill_step_seconds": self._mean("prefill")}

    def summary(self) -> str:
        from accelkit._run.report import format_seconds

        def part(kind: str, label: str) -> str:
            mean = self._mean(kind)
            each = f", {format_seconds(mean)} each on {self.target} (estimated)" if mean is not None else ""
            return f"{self.count[kind]} {label}{each}"

        return f"{part('decode', 'decode steps')}; {part('prefill', 'prefill or mixed steps')}"


class AccelkitWorker(Worker):
    def init_device(self) -> None:
        self._steps = _StepEstimates()  # under `accelkit run` (see execute_model)
        self._report_lock = threading.Lock()
        self._in_step = False
        self._step_ended = threading.Event()
        if reporting():
            threading.Thread(target=self._write_when_idle, name="accelkit-run-report", daemon=True).start()
        name = accelkit.active_backend()
        count = torch.accelerator.device_count()
        if self.local_rank >= count:
            raise RuntimeError(
                f"accelkit ({name}): worker of local rank {self.local_rank} needs device {name}:{self.local_rank} "
                f"and this process has {count}; set ACCELKIT_{name.upper()}_DEVICES to the number of "
                f"workers per node (tensor x pipeline parallel size) or leave it unset"
            )
        self.device = torch.device(name, self.local_rank)
        torch.accelerator.set_device_index(self.device)
        from vllm.platforms import current_platform

        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank, current_platform.dist_backend
        )
        set_random_seed(self.model_config.seed)
        gc.collect()
        self._init_workspace_and_model_runner()

    def _make_model_runner(self) -> GPUModelRunner:
        return AccelkitModelRunner(self.vllm_config, self.device)

    def compile_or_warm_up_model(self):
        """Nothing is compiled ahead: in compiled serving each bucket's graph compiles the first
        time a step of that bucket runs (the profiling run has compiled its own already), and
        there are no CUDA graphs to capture. (vLLM's GPU warm-up tunes CUDA kernels and
        imports modules that need torchvision.)"""
        from vllm.v1.worker.worker_base import CompilationTimes

        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=self.compilation_config.encoder_compilation_time,
        )

    def _maybe_get_memory_pool_context(self, tag: str):
        return contextlib.nullcontext()  # no sleep-mode memory pools: the accelkit allocator serves all

    def accelkit_stats(self) -> dict:
        """``accelkit.stats()`` of this worker's process (``LLM.collective_rpc("accelkit_stats")``),
        without the per-op table: totals, the ops that ran on the CPU fallback, memory peaks."""
        s = accelkit.stats()
        backend = s.get(s["backend"], {})
        # Compiled programs (tpu: XLA executables) or kernel instances (neuron) per op.
        per_op = backend.get("compiled_programs", backend.get("instances", {}))
        return {
            "backend": s["backend"],
            "device": str(self.device),
            "rank": self.rank,
            # torch.compile on the backend (compiled serving): graphs Dynamo captured, backend
            # programs compiled and reused, graph breaks, recompiles and their reasons
            "compile": s.get("compile"),
            "programs_by_op": dict(per_op),
            "data_movement_programs": backend.get("data_movement_programs"),
            "totals": s["totals"],
            "fallback_ops": {op: c for op, c in s["ops"].items() if c.get("fallback")},
            "peak_bytes": s["memory"].get("allocated_bytes.all.peak"),
            "estimate": s.get("estimate"),
            # collectives on accelkit's process group (tensor parallel), with their estimates
            "distributed": s.get("distributed"),
        }

    def accelkit_reset_stats(self) -> None:
        """``accelkit.reset_stats()`` in this worker's process (``LLM.collective_rpc("accelkit_reset_stats")``):
        the next ``accelkit_stats`` counts, and estimates, only the work after it."""
        accelkit.reset_stats()

    def execute_model(self, scheduler_output, *args, **kwargs):
        if not reporting():
            return super().execute_model(scheduler_output, *args, **kwargs)
        with self._report_lock:  # an idle write in progress ends first
            self._in_step = True
        self._steps.begin(scheduler_output)
        output = super().execute_model(scheduler_output, *args, **kwargs)
        if output is not None:  # else the step ends in sample_tokens
            self._end_step()
        return output

    def sample_tokens(self, *args, **kwargs):
        output = super().sample_tokens(*args, **kwargs)
        if reporting():
            self._end_step()
        return output

    def _end_step(self) -> None:
        """Under `accelkit run`: the step's estimate into the report's ``vllm`` section, and the
        report rewritten (at most every RUN_REPORT_SECONDS), since vLLM's shutdown can end the
        engine process before its exit handlers run."""
        self._steps.end()
        annotate_report("vllm", self._steps.summary(), **self._steps.figures())
        write_run_report(RUN_REPORT_SECONDS)
        with self._report_lock:
            self._in_step = False
        self._step_ended.set()

    def _write_when_idle(self) -> None:
        """The report writer's thread: once RUN_REPORT_IDLE_SECONDS pass with no step ending
        after one did, the report is written again, so that it ends with the last step."""
        while True:
            self._step_ended.wait()
            self._step_ended.clear()
            while self._step_ended.wait(RUN_REPORT_IDLE_SECONDS):
                self._step_ended.clear()
            with self._report_lock:
                if not self._in_step:
                    write_run_report(0.0)

    def shutdown(self) -> None:
        write_run_report(0.0)
        super().shutdown()

    def sleep(self, level: int = 1) -> None:
        _log.warning("accelkit: sleep mode is not supported; ignored")

    def wake_up(self, tags=None) -> None:
        _log.warning("accelkit: sleep mode is not supported; ignored")

    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: ``kv_cache_memory_bytes`` when given, else the device's
        capacity times ``gpu_memory_utilization`` less the peak the profiling run reached
        (capped on a simulated device, see ``SIMULATED_KV_REQUESTS``).

        :raises torch.OutOfMemoryError: the requested size does not fit in the free memory.
        """
        self.model_runner.profile_run()
        free, total = torch.accelerator.get_memory_info(self.device.index)
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit:
            if explicit > free:
                raise torch.OutOfMemoryError(
                    f"{self.device}: the KV cache needs {format_gib(explicit)} GiB and "
                    f"{format_gib(free)} GiB of {format_gib(total)} GiB are free"
                )
            return int(explicit)
        peak = int(accelkit.stats()["memory"].get("allocated_bytes.all.peak", total - free))
        budget = int(total * self.cache_config.gpu_memory_utilization) - peak
        if budget <= 0:
            raise torch.OutOfMemoryError(
                f"{self.device}: no memory left for the KV cache: the model's peak is "
                f"{format_gib(peak)} GiB of {format_gib(total)} GiB at gpu_memory_utilization="
                f"{self.cache_config.gpu_memory_utilization}"
            )
        if getattr(device_module().get_device_properties(self.device.index), "simulated", False):
            per_token = sum(
                spec.page_size_bytes // spec.block_size for spec in self.model_runner.get_kv_cache_spec().values()
            )
            cap = per_token * self.model_config.max_model_len * SIMULATED_KV_REQUESTS
            if cap < budget:
                _log.info(
                    "accelkit: simulated %s: KV cache of %s MiB (%d requests of %d tokens); set "
                    "kv_cache_memory_bytes for another size",
                    self.device, cap >> 20, SIMULATED_KV_REQUESTS, self.model_config.max_model_len,
                )
                budget = cap
        return budget
