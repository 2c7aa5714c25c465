"""Greedy generation with vLLM's offline `LLM`, printed as JSON (one run per process).

    python tests/vllm/generate.py MODEL_DIR [--max-tokens 16] [--dtype float32] [--tensor-parallel-size 2]

The platform is whatever vLLM picks: with ACCELKIT_DEVICE=tpu|neuron|ref accelkit's plugin,
else vLLM's own CPU platform. vLLM's engine starts its worker with spawn, hence the
`__main__` guard.
"""

import argparse
import json
import os
import time

PROMPTS = [
    "Hello world, the quick brown fox",
    "A paged key value cache",
    "bo ka te",
    "The",
    # longer than two 16-token blocks: with a small token budget it is prefilled in chunks,
    # next to the other requests' decodes
    " ".join(["serving large language models needs continuous batching"] * 5),
]


# Other lengths and another count, for the compile check: after PROMPTS ran, these should
# find every program already compiled (bucketed shapes).
OTHER_PROMPTS = [
    "Tensor processing units run XLA programs",
    "numbers 0 1 2 3 4 5 6 7 8 9",
    " ".join(["the word was tokenized into bytes and merges"] * 4),
]


def _rpc_stats(llm):
    """Rank 0's accelkit stats (None on vLLM's own platforms)."""
    return llm.collective_rpc("accelkit_stats")[0] if os.environ.get("ACCELKIT_DEVICE") else None


def _margin(step) -> float:
    top = sorted((lp.logprob for lp in step.values()), reverse=True)
    return top[0] - top[1] if len(top) > 1 else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--compiled", action="store_true", help="enforce_eager=False (vLLM's default)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    extra = {}
    if args.max_num_batched_tokens:
        extra["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.tensor_parallel_size > 1:
        extra["tensor_parallel_size"] = args.tensor_parallel_size
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=128, enforce_eager=not args.compiled, seed=0, **extra)
    t1 = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=2)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    t2 = time.perf_counter()
    stats_first = _rpc_stats(llm)
    t2b = time.perf_counter()
    again = llm.generate(PROMPTS, params, use_tqdm=False)
    t3 = time.perf_counter()
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs]
    stats = _rpc_stats(llm)
    t4 = time.perf_counter()
    other = llm.generate(OTHER_PROMPTS, params, use_tqdm=False)
    t5 = time.perf_counter()
    stats_other = _rpc_stats(llm)
    new_programs = new_graphs = new_graphs_again = None
    if stats is not None:
        before, after = stats["programs_by_op"], stats_other["programs_by_op"]
        new_programs = {op: n - before.get(op, 0) for op, n in after.items() if n != before.get(op, 0)}
        # compiled serving: model graphs Dynamo captured, and backend programs compiled for
        # them, by the generate of OTHER_PROMPTS
        counted = ("graphs_captured", "programs_compiled")
        new_graphs = {k: stats_other["compile"][k] - stats["compile"][k] for k in counted}
        new_graphs_again = {k: stats["compile"][k] - stats_first["compile"][k] for k in counted}
    ranks = None
    if stats is not None and args.tensor_parallel_size > 1:
        ranks = [{"rank": r["rank"], "device": r["device"], "collectives": (r["distributed"] or {}).get("collectives"),
                  "groups": (r["distributed"] or {}).get("groups")} for r in llm.collective_rpc("accelkit_stats")]
    result = {
        "ranks": ranks,  # tensor parallel: each worker's device and collectives on accelkit's group
        "platform": type(__import__("vllm.platforms", fromlist=["current_platform"]).current_platform).__name__,
        "load_s": round(t1 - t0, 2),
        "generate_s": round(t2 - t1, 3),
        "generate_again_s": round(t3 - t2b, 3),
        "generate_other_s": round(t5 - t4, 3),
        "accelkit": stats,
        # programs compiled by the generate of OTHER_PROMPTS, per op (None on vLLM's CPU)
        "new_programs_other": new_programs,
        "new_compiled_other": new_graphs,
        # the same, by the repeat of PROMPTS (steady state: the steps' buckets were all seen)
        "new_compiled_again": new_graphs_again,
        "other_token_ids": [list(o.outputs[0].token_ids) for o in other],
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
        # the chosen token's logprob and its lead over the runner-up, per step
        "logprobs": [[step[t].logprob for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs],
        "margins": [[_margin(step) for step in o.outputs[0].logprobs] for o in outs],
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
