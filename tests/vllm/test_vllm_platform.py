"""vLLM on accelkit devices against vLLM's own CPU platform (accelkit/integrations/vllm).

Each configuration runs `tests/vllm/generate.py` in its own process (vLLM starts its engine with
spawn; one PrivateUse1 backend per process): a tiny random Llama written here (GQA: 4 query heads,
2 key/value heads), five prompts, 16 greedy tokens each, with a token budget of 16 per step so that
the longest prompt is prefilled in chunks beside the other requests' decodes.

The smoke (float32 on tpu and neuron) runs in `make test`; `ACCELKIT_VLLM=full` adds bfloat16.
Needs the `vllm` extra (`make vllm`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: make vllm")

HERE = Path(__file__).parent
FULL = os.environ.get("ACCELKIT_VLLM") == "full"
# Logprob agreement: float32 attention and matmuls differ only in summation order.
LOGPROB_TOL = {"float32": 1e-4, "bfloat16": 0.1}
# A greedy choice whose lead over the runner-up is below this may flip between platforms
# (bfloat16 rounds logits to about 0.03 at these magnitudes); the sequences may part there.
TIE_MARGIN = {"float32": 1e-4, "bfloat16": 0.1}
# Ops that neuron runs on the CPU fallback today, all in vLLM's sampler: topk (logprobs),
# sort and exponential_ (the random-sampling path of the profiling run).
NEURON_KNOWN_FALLBACKS = {"aten.topk.values", "aten.sort.values_stable", "aten.exponential_.default"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    sys.path.insert(0, str(HERE))
    from tiny_models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def _generate(model_dir: Path, device: str | None, dtype: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"}
    env["HF_HUB_OFFLINE"] = "1"
    if device:
        env["ACCELKIT_DEVICE"] = device
    cmd = [sys.executable, str(HERE / "generate.py"), str(model_dir), "--dtype", dtype, "--max-num-batched-tokens", "16"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{device or 'cpu'} {dtype} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


_cpu_cache: dict[str, dict] = {}


def _cpu(model_dir: Path, dtype: str) -> dict:
    if dtype not in _cpu_cache:
        _cpu_cache[dtype] = _generate(model_dir, None, dtype)
        assert _cpu_cache[dtype]["platform"] == "CpuPlatform"
    return _cpu_cache[dtype]


def _compare(ref: dict, got: dict, dtype: str) -> None:
    for i, (want, have) in enumerate(zip(ref["token_ids"], got["token_ids"], strict=True)):
        for step, (a, b) in enumerate(zip(want, have, strict=True)):
            if a != b:
                assert ref["margins"][i][step] < TIE_MARGIN[dtype], (
                    f"prompt {i} step {step}: CPU chose {a} by {ref['margins'][i][step]:.4f}, the device {b}"
                )
                break  # a near-tie flipped: the rest of this sequence follows another prefix
            assert abs(ref["logprobs"][i][step] - got["logprobs"][i][step]) <= LOGPROB_TOL[dtype], (i, step)


@pytest.mark.parametrize(
    "dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(not FULL, reason="ACCELKIT_VLLM=full"))]
)
@pytest.mark.parametrize("device", ["tpu", "neuron"])
def test_greedy_matches_vllm_cpu(model_dir, device, dtype):
    ref = _cpu(model_dir, dtype)
    got = _generate(model_dir, device, dtype)
    assert got["platform"] == "AccelkitPlatform"
    stats = got["accelkit"]
    assert stats["backend"] == device
    assert stats["totals"]["native"] > 0
    if dtype == "float32":
        assert got["token_ids"] == ref["token_ids"]
    _compare(ref, got, dtype)
    fallbacks = set(stats["fallback_ops"])
    if device == "tpu":
        assert not fallbacks, fallbacks
    else:
        assert fallbacks <= NEURON_KNOWN_FALLBACKS, fallbacks - NEURON_KNOWN_FALLBACKS


def test_plugin_is_inert_without_an_accelkit_device(monkeypatch):
    from accelkit.integrations.vllm import register

    monkeypatch.delenv("ACCELKIT_DEVICE", raising=False)
    assert register() is None
    monkeypatch.setenv("ACCELKIT_DEVICE", "cpu")
    assert register() is None
