"""vLLM on accelkit devices against vLLM's own CPU platform (accelkit/integrations/vllm).

Each configuration runs `tests/vllm/generate.py` in its own process (vLLM starts its engine with
spawn; one PrivateUse1 backend per process): a tiny random Llama or Qwen3 written here (GQA: 4
query heads, 2 key/value heads; Qwen3's per-head q/k norms), five prompts, 16 greedy tokens each,
with a token budget of 16 per step so that the longest prompt is prefilled in chunks beside the
other requests' decodes; then three prompts of other lengths, which must compile no new program
for the model or attention (bucketed shapes).

The smoke (float32 Llama on tpu and neuron) runs in `make test`; `ACCELKIT_VLLM=full` (`make
vllm`) adds Qwen3 and bfloat16.
Needs the `vllm` extra: `make vllm-env` builds `.venv-vllm` with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run these in .venv-vllm (make vllm-env)")

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


# Ops of the model's layers and of accelkit's attention (not vLLM's input preparation or
# sampler, which run on the exact number of requests): with bucketed shapes, a generate after
# another compiles none of them anew.
# (Names without the "aten." prefix, as neuron reports them.)
MODEL_OPS = {
    "bmm.default",  # attention scores and weighted values
    "_softmax.default",
    "masked_fill.Scalar",  # the attention mask
    "rsqrt.default",  # RMS norms (Qwen3's q/k norms too)
    "silu.default",
    "embedding.default",
}

def _compare(ref: dict, got: dict, dtype: str) -> None:
    for i, (want, have) in enumerate(zip(ref["token_ids"], got["token_ids"], strict=True)):
        for step, (a, b) in enumerate(zip(want, have, strict=True)):
            if a != b:
                assert ref["margins"][i][step] < TIE_MARGIN[dtype], (
                    f"prompt {i} step {step}: CPU chose {a} by {ref['margins'][i][step]:.4f}, the device {b}"
                )
                break  # a near-tie flipped: the rest of this sequence follows another prefix
            assert abs(ref["logprobs"][i][step] - got["logprobs"][i][step]) <= LOGPROB_TOL[dtype], (i, step)


_full = pytest.mark.skipif(not FULL, reason="ACCELKIT_VLLM=full")
CASES = [
    ("llama", "tpu", "float32"),
    ("llama", "neuron", "float32"),
    pytest.param("qwen3", "tpu", "float32", marks=_full),
    pytest.param("qwen3", "neuron", "float32", marks=_full),
    pytest.param("llama", "tpu", "bfloat16", marks=_full),
    pytest.param("llama", "neuron", "bfloat16", marks=_full),
    pytest.param("qwen3", "tpu", "bfloat16", marks=_full),
    pytest.param("qwen3", "neuron", "bfloat16", marks=_full),
]


@pytest.mark.parametrize(("model", "device", "dtype"), CASES)
def test_greedy_matches_vllm_cpu(tiny_model, generate_run, model, device, dtype):
    model_dir = tiny_model(model)
    ref = generate_run(model_dir, None, dtype)
    got = generate_run(model_dir, device, dtype)
    assert got["platform"] == "AccelkitPlatform"
    stats = got["accelkit"]
    assert stats["backend"] == device
    assert stats["totals"]["native"] > 0
    if dtype == "float32":
        assert got["token_ids"] == ref["token_ids"]
        assert got["other_token_ids"] == ref["other_token_ids"]
    _compare(ref, got, dtype)
    fallbacks = set(stats["fallback_ops"])
    if device == "tpu":
        assert not fallbacks, fallbacks
    else:
        assert fallbacks <= NEURON_KNOWN_FALLBACKS, fallbacks - NEURON_KNOWN_FALLBACKS
    # Bucketed shapes: prompts of other lengths (and another count) after the first set compile
    # nothing new for the model and attention.
    compiled = {op.removeprefix("aten.") for op in stats["programs_by_op"]}
    assert MODEL_OPS <= compiled, MODEL_OPS - compiled  # the check below looks at ops that ran
    new = {op.removeprefix("aten."): n for op, n in got["new_programs_other"].items()}
    assert not (MODEL_OPS & set(new)), {op: new[op] for op in MODEL_OPS & set(new)}


# Compiled serving (enforce_eager=False): the model's forward under torch.compile(backend=<name>,
# dynamic=False), one graph and one program per bucket of step shapes.
COMPILED_CASES = [("llama", "tpu", "float32")] + [
    pytest.param(model, device, dtype, marks=_full)
    for model in ("llama", "qwen3") for device in ("tpu", "neuron") for dtype in ("float32", "bfloat16")
    if (model, device, dtype) != ("llama", "tpu", "float32")
]


@pytest.mark.parametrize(("model", "device", "dtype"), COMPILED_CASES)
def test_compiled_greedy_matches_vllm_cpu_and_other_prompts_compile_no_model_graph(tiny_model, generate_run, model, device, dtype):
    model_dir = tiny_model(model)
    ref = generate_run(model_dir, None, dtype)
    got = generate_run(model_dir, device, dtype, "--compiled")
    if dtype == "float32":
        assert got["token_ids"] == ref["token_ids"]
        assert got["other_token_ids"] == ref["other_token_ids"]
    _compare(ref, got, dtype)
    c = got["accelkit"]["compile"]
    assert c["graph_breaks"] == 0, c["graph_break_reasons"]
    # The model was compiled (the profiling run's graph and at least one step's), whole: no node
    # of its graphs runs eagerly (tpu: vLLM's sampler helper, compiled with dynamic=True, keeps
    # its two shape checks eagerly; on neuron that helper runs through Dynamo's eager backend).
    assert c["graphs_captured"] >= 2 and c["programs_compiled"] >= 2, c
    assert set(c["eager_nodes"]) <= {"aten._assert_scalar.default"}, c["eager_nodes"]
    # Recompiles are new buckets (an attention metadata size), never a per-step value.
    model_recompiles = [r["reason"] for r in c["recompiles"] if "forward" in r["function"]]
    assert model_recompiles and all("size mismatch" in r or "slot_mapping" in r for r in model_recompiles), model_recompiles
    # Steady state: the repeat of the prompts and prompts of other lengths capture no new graph.
    assert got["new_compiled_again"]["graphs_captured"] == 0, got["new_compiled_again"]
    assert got["new_compiled_other"]["graphs_captured"] == 0, got["new_compiled_other"]
    if device == "neuron":  # every compiled program is the model's: none new either
        assert got["new_compiled_again"]["programs_compiled"] == 0
        assert got["new_compiled_other"]["programs_compiled"] == 0


@pytest.mark.parametrize("device", [pytest.param("tpu", marks=_full), pytest.param("neuron", marks=_full)])
def test_tensor_parallel_2_matches_one_rank(tiny_model, generate_run, device):
    """``tensor_parallel_size=2`` through vLLM's multiprocess executor: each worker on its own
    device (tpu:0, tpu:1; the platform sets ACCELKIT_<NAME>_DEVICES=2), the layers' all-reduces
    and the logits' all-gather on accelkit's process group; greedy ids equal one rank's and the
    CPU platform's."""
    model_dir = tiny_model("llama")
    one = generate_run(model_dir, device, "float32")
    two = generate_run(model_dir, device, "float32", "--tensor-parallel-size", "2")
    assert two["token_ids"] == one["token_ids"]
    assert two["other_token_ids"] == one["other_token_ids"]
    assert two["token_ids"] == generate_run(model_dir, None, "float32")["token_ids"]
    _compare(one, two, "float32")
    assert [r["device"] for r in two["ranks"]] == [f"{device}:0", f"{device}:1"]
    for r in two["ranks"]:
        assert f"rank {r['rank']} of 2" in r["groups"], r["groups"]
        assert r["collectives"]["all_reduce"]["calls"] > 0, r["collectives"]
    counts = [{k: (v["calls"], v["bytes"]) for k, v in r["collectives"].items()} for r in two["ranks"]]
    assert counts[0] == counts[1], counts  # the ranks ran the same collectives


@pytest.mark.parametrize("device", [pytest.param("tpu", marks=_full), pytest.param("neuron", marks=_full)])
def test_compiled_tensor_parallel_2_matches_vllm_cpu(tiny_model, generate_run, device):
    """Compiled serving with ``tensor_parallel_size=2``: the all-reduces on accelkit's process
    group (host-staged) are cut out of the programs and run between them; greedy ids equal the
    CPU platform's and prompts of other lengths capture no graph."""
    model_dir = tiny_model("llama")
    ref = generate_run(model_dir, None, "float32")
    got = generate_run(model_dir, device, "float32", "--compiled", "--tensor-parallel-size", "2")
    assert got["token_ids"] == ref["token_ids"]
    assert got["other_token_ids"] == ref["other_token_ids"]
    c = got["accelkit"]["compile"]
    assert c["graph_breaks"] == 0 and c["graphs_captured"] >= 2, c
    assert c["eager_nodes"].get("_c10d_functional.all_reduce.default", 0) > 0, c["eager_nodes"]
    assert got["new_compiled_other"]["graphs_captured"] == 0, got["new_compiled_other"]


@pytest.mark.xfail(
    reason="vLLM's input preparation and sampler (and the lm_head on the sampled rows) run on the "
    "exact number of requests and tokens, so a new count still compiles a few small programs",
    strict=True,
)
def test_second_generate_compiles_nothing_on_tpu(tiny_model, generate_run):
    got = generate_run(tiny_model("llama"), "tpu", "float32")
    assert got["new_programs_other"] == {}


_MASKED_WRITE = """
import torch
from accelkit.integrations.vllm.attention import AccelkitAttentionImpl
dev = "{device}"
impl = AccelkitAttentionImpl(num_heads=4, head_size=8, scale=0.5, num_kv_heads=2, alibi_slopes=None,
                             sliding_window=None, kv_cache_dtype="auto")
cache = torch.randn(6, 2, 4, 16)  # [blocks, kv heads, block size, 2 * head size]
key, value = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
slots = torch.tensor([5, 9, -1, 23, -1])  # tokens 2 and 4 are padding
dcache = cache.to(dev)
impl.do_kv_cache_update(None, key.to(dev), value.to(dev), dcache, slots.to(dev))
want = cache.clone()
for t, s in enumerate(slots.tolist()):
    if s >= 0:
        want[s // 4, :, s % 4] = torch.cat([key[t], value[t]], -1)
assert torch.equal(dcache.cpu(), want), (dcache.cpu() - want).abs().amax()
print("OK")
"""


@pytest.mark.parametrize("device", ["tpu", "neuron"])
def test_padding_tokens_do_not_write_the_cache(device):
    """Slot -1 (a padding token of the bucket) leaves every cache entry as it was, block 0 too."""
    env = dict(os.environ, ACCELKIT_DEVICE=device)
    proc = subprocess.run([sys.executable, "-c", _MASKED_WRITE.format(device=device)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_buckets():
    from accelkit.integrations.vllm.buckets import bucket, buckets

    assert [bucket(n, 16, 2048) for n in (1, 16, 17, 100, 2048)] == [16, 16, 32, 128, 2048]
    assert bucket(17, 16, 24) == 24  # the limit is a bucket
    assert buckets(8, 24) == [8, 16, 24]
    with pytest.raises(ValueError):
        bucket(25, 16, 24)


def test_plugin_is_inert_without_an_accelkit_device(monkeypatch):
    from accelkit.integrations.vllm import register

    monkeypatch.delenv("ACCELKIT_DEVICE", raising=False)
    assert register() is None
    monkeypatch.setenv("ACCELKIT_DEVICE", "cpu")
    assert register() is None
