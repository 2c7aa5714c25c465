"""vLLM serving figures on tpu and neuron against vLLM's own CPU platform, in one run.

    python bench/bench_vllm.py [--quick] [--compiled] [--model DIR] [--max-tokens N] [--platforms cpu,tpu,neuron]

Needs the `vllm` extra (`make vllm-env`, then `.venv-vllm/bin/python bench/bench_vllm.py`).

The same model on every platform: a tiny random Llama written here (tests/vllm/tiny_models.py:
hidden 256, 2 layers, 4 query heads of 64, 2 key/value heads), float32, unless ``--model``
names another checkpoint. The same fixed prompts (8; 4 with ``--quick``), submitted together
to vLLM's offline ``LLM``, greedy, ``N`` output tokens each (``ignore_eos``). Each platform runs
in its own process (vLLM starts its engine with spawn; one PrivateUse1 backend per process);
``ACCELKIT_DEVICE`` unset is vLLM's CPU platform.

Prefix caching is off (each generate prefills in full). Per platform, after a warm-up generate
of the same prompts and lengths (which compiles what the device compiles; its time is
``cold_generate_s``), the median over repeats of:

- ``output_tokens_per_s``: all output tokens / wall time of the generate of ``N`` tokens;
- ``ttft_s`` (and ``ttft_max_s``): time to first token, the median (and the largest) over the
  prompts of every timed generate of vLLM's own per-request figure (arrival to first token,
  ``RequestOutput.metrics``). The prompts arrive together, so this includes waiting for the
  batch's prefill; the engine may start a step before all have arrived, and on tpu a split of
  the prompts into steps not seen before compiles a few small programs (vLLM's input
  preparation and sampler run on exact counts), which the largest shows;
- ``decode_step_s``: wall time per decode step of the whole batch, (T(N) - T(1)) / (N - 1).

On tpu and neuron also the **estimated device time per decode step on the target**
(``accelkit.stats()["estimate"]`` read in the worker through ``LLM.collective_rpc``): the
estimate of the generate of ``N`` tokens less that of 1 token, over ``N - 1`` steps, with the
five ops that take most of it — a model
of the target hardware (tpu: the ``ACCELKIT_TPU_TARGET`` generation, neuron:
``ACCELKIT_NEURON_TARGET``), never a measurement. Wall times are the simulators' on this
machine, not the hardware's.

``--compiled`` runs each accelkit platform a second time with ``enforce_eager=False``
(compiled serving: a program per bucket of step shapes), as ``<device> compiled``, with what
the warm-up compiled (``compiled_after_warmup``: Dynamo graphs, backend programs, seconds) and
what the timed generates compiled (``compiled_while_timed``, nothing in steady state). vLLM's
CPU platform stays eager (its compiled mode needs Inductor's C++ toolchain). The ratio lines
give no estimate for compiled rows: tpu's estimate counts the programs of ops run eagerly and
not those of compiled graphs (neuron's counts both).

Prints one JSON document (``{"config": ..., "results": [...]}``), then ratio lines against the
CPU platform.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS_VLLM = HERE.parent / "tests" / "vllm"

PROMPTS = [
    "Hello world, the quick brown fox",
    "A paged key value cache keeps the attention state",
    "Tensor processing units run XLA programs",
    "The",
    "Serving large language models needs continuous batching, prefill and decode.",
    "numbers 0 1 2 3 4 5 6 7 8 9",
    "In the beginning was the word",
    "bo ka te mi ru so",
]
MAX_MODEL_LEN = 128


def _child(args: argparse.Namespace) -> None:
    """One platform: the figures as a ``RESULT {json}`` line."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    on_accelkit = bool(os.environ.get("ACCELKIT_DEVICE"))
    prompts = PROMPTS[: args.prompts]
    t0 = time.perf_counter()
    # No prefix caching: every generate prefills its prompts in full (with it, the repeats would
    # find the prompts cached, and run other shapes than the warm-up).
    llm = LLM(model=args.model, dtype="float32", max_model_len=MAX_MODEL_LEN, enforce_eager=not args.compiled, seed=0,
              disable_log_stats=False, enable_prefix_caching=False)
    load_s = time.perf_counter() - t0

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)

    def run(n: int) -> tuple[float, list, dict | None]:
        if on_accelkit:
            llm.collective_rpc("accelkit_reset_stats")
        start = time.perf_counter()
        outs = llm.generate(prompts, params(n), use_tqdm=False)
        wall = time.perf_counter() - start
        stats = llm.collective_rpc("accelkit_stats")[0] if on_accelkit else None
        return wall, outs, stats

    n = args.max_tokens
    t0 = time.perf_counter()
    cold_outs = llm.generate(prompts, params(n), use_tqdm=False)
    cold_s = time.perf_counter() - t0
    # The 1-token run's shapes too, and a second warm-up: the engine may start its first step
    # before all prompts have arrived, so how they split into steps varies from run to run.
    llm.generate(prompts, params(1), use_tqdm=False)
    llm.generate(prompts, params(n), use_tqdm=False)
    counted = ("graphs_captured", "programs_compiled", "compile_seconds")
    warm = llm.collective_rpc("accelkit_stats")[0]["compile"] if on_accelkit else None

    rows = []
    for _ in range(args.repeats):
        wall_n, outs, stats_n = run(n)
        wall_1, outs_1, stats_1 = run(1)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        ttfts = [o.metrics.first_token_latency for o in outs if getattr(o, "metrics", None) is not None]
        ttfts_1 = [o.metrics.first_token_latency for o in outs_1 if getattr(o, "metrics", None) is not None]
        row = {
            "output_tokens_per_s": tokens / wall_n,
            "ttfts": ttfts + ttfts_1,
            "generate_s": wall_n,
            "generate_1_token_s": wall_1,
            "decode_step_s": (wall_n - wall_1) / (n - 1),
        }
        if stats_n is not None:
            est_n, est_1 = stats_n["estimate"], stats_1["estimate"]
            row["estimate_target"] = est_n["target"] if est_n else None
            row["estimated_decode_step_s"] = (est_n["seconds"] - est_1["seconds"]) / (n - 1) if est_n else None
            row["estimated_prefill_and_first_token_s"] = est_1["seconds"] if est_1 else None
            row["fallback_ops"] = sorted(stats_n["fallback_ops"])
            if est_n:  # where a decode step's estimated time goes: the 5 largest ops, per step
                ops_1 = est_1["per_op"]
                per_step = {op: ((v["calls"] - ops_1.get(op, {}).get("calls", 0)) / (n - 1),
                                 (v["seconds"] - ops_1.get(op, {}).get("seconds", 0.0)) / (n - 1))
                            for op, v in est_n["per_op"].items()}
                top = sorted(per_step.items(), key=lambda kv: -kv[1][1])[:5]
                row["estimated_decode_step_top_ops"] = {op: {"calls": round(c, 1), "seconds": sec} for op, (c, sec) in top}
        if stats_n is not None:
            row["compiled_while_timed"] = {k: stats_n["compile"][k] + stats_1["compile"][k] for k in counted[:2]}
        rows.append(row)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in cold_outs]

    def median(key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    all_ttfts = [t for r in rows for t in r.pop("ttfts")]
    result = {
        "platform": type(__import__("vllm.platforms", fromlist=["current_platform"]).current_platform).__name__,
        "device": (os.environ.get("ACCELKIT_DEVICE") or "cpu") + (" compiled" if args.compiled else ""),
        "load_s": round(load_s, 2),
        "cold_generate_s": round(cold_s, 3),
        "ttft_s": statistics.median(all_ttfts) if all_ttfts else None,
        "ttft_max_s": max(all_ttfts) if all_ttfts else None,
        **{key: median(key) for key in rows[0]
           if key not in ("estimate_target", "fallback_ops", "estimated_decode_step_top_ops", "compiled_while_timed")},
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
    }
    if on_accelkit:
        result["estimate_target"] = rows[0]["estimate_target"]
        result["estimate_note"] = (stats_n["estimate"] or {}).get("note")
        result["fallback_ops"] = rows[0]["fallback_ops"]
        result["estimated_decode_step_top_ops"] = rows[-1].get("estimated_decode_step_top_ops")
        result["compiled_after_warmup"] = {k: warm[k] for k in counted}
        result["compiled_while_timed"] = {k: sum(r["compiled_while_timed"][k] for r in rows) for k in counted[:2]}
    print("RESULT " + json.dumps(result))


def _run_platform(device: str, args: argparse.Namespace, compiled: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"}
    if device != "cpu":
        env["ACCELKIT_DEVICE"] = device
    cmd = [sys.executable, __file__, "--child", "--model", str(args.model), "--max-tokens", str(args.max_tokens),
           "--prompts", str(args.prompts), "--repeats", str(args.repeats)] + ["--compiled"] * compiled
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"device": device + " compiled" * compiled, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    return json.loads(lines[-1].removeprefix("RESULT "))


def _ratio_lines(results: list[dict]) -> list[str]:
    by = {r["device"]: r for r in results}
    cpu = by.get("cpu")
    lines = []
    for r in results:
        if "error" in r:
            lines.append(f"{r['device']:>15}: FAILED ({r['error'].splitlines()[-1] if r['error'] else ''})")
            continue
        line = (f"{r['device']:>15}: {r['output_tokens_per_s']:8.1f} output tok/s, TTFT {1e3 * r['ttft_s']:6.1f} ms "
                f"(max {1e3 * r['ttft_max_s']:6.1f}), "
                f"decode step {1e3 * r['decode_step_s']:7.1f} ms wall")
        if cpu and "error" not in cpu and r is not cpu:
            line += (f"  | vs CPU: {r['output_tokens_per_s'] / cpu['output_tokens_per_s']:.3f}x tok/s, "
                     f"{r['ttft_s'] / cpu['ttft_s']:.1f}x TTFT")
            line += ", greedy ids " + ("equal" if r["greedy_ids_equal_cpu"] else "DIFFER")
        eager = by.get(r["device"].removesuffix(" compiled")) if r["device"].endswith(" compiled") else None
        if eager and "error" not in eager:
            line += (f"  | vs eager: {r['output_tokens_per_s'] / eager['output_tokens_per_s']:.2f}x tok/s, "
                     f"{r['compiled_after_warmup']['graphs_captured']} graphs / "
                     f"{r['compiled_after_warmup']['programs_compiled']} programs compiled by the warm-up, "
                     f"{r['compiled_while_timed']['graphs_captured']} graphs while timed")
        # (not for compiled rows: tpu's estimate counts its per-op programs, not compiled graphs)
        if r.get("estimated_decode_step_s") is not None and not eager:
            line += (f"  | estimated on {r['estimate_target']}: {1e6 * r['estimated_decode_step_s']:.1f} us "
                     f"per decode step (the simulation's wall time is "
                     f"{r['decode_step_s'] / r['estimated_decode_step_s']:.0f}x that)")
        lines.append(line)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 prompts, 8 output tokens, 1 repeat")
    ap.add_argument("--model", help="a checkpoint directory (default: the tiny random Llama, written here)")
    ap.add_argument("--max-tokens", type=int, help="output tokens per prompt (default 32; 8 with --quick)")
    ap.add_argument("--platforms", default="cpu,tpu,neuron")
    ap.add_argument("--compiled", action="store_true",
                    help="also run each accelkit platform with enforce_eager=False (compiled serving)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.max_tokens = args.max_tokens or (8 if args.quick else 32)
    args.prompts = args.prompts or (4 if args.quick else len(PROMPTS))
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.max_tokens < 2:
        ap.error("--max-tokens must be at least 2 (a decode step is the difference of N and 1 tokens)")
    if args.child:
        _child(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        if not args.model:
            sys.path.insert(0, str(TESTS_VLLM))
            from tiny_models import make_tiny_llama

            args.model = make_tiny_llama(Path(tmp) / "tiny-llama")
        started = time.perf_counter()
        devices = args.platforms.split(",")
        results = [_run_platform(device, args) for device in devices]
        if args.compiled:
            results += [_run_platform(device, args, compiled=True) for device in devices if device != "cpu"]
    cpu_ids = next((r["token_ids"] for r in results if r["device"] == "cpu" and "token_ids" in r), None)
    for r in results:
        ids = r.pop("token_ids", None)
        if cpu_ids is not None and r["device"] != "cpu" and ids is not None:
            r["greedy_ids_equal_cpu"] = ids == cpu_ids
    config = {
        "model": "tiny random Llama (tests/vllm/tiny_models.py)" if str(args.model).startswith(tmp) else str(args.model),
        "dtype": "float32", "prompts": args.prompts, "output_tokens": args.max_tokens, "repeats": args.repeats,
        "greedy": True, "compiled_too": args.compiled, "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg()[0], "total_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps({"config": config, "results": results}, indent=1))
    print()
    for line in _ratio_lines(results):
        print(line)


if __name__ == "__main__":
    main()
