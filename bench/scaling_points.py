"""Published training throughput at scale against accelkit's scaling projection (issue #41 item 4).

    python bench/scaling_points.py                 # every point (a few minutes of CPU)
    python bench/scaling_points.py --only 128b     # points whose name contains the text

Each point is one real run on one simulated device, through the public API a user calls: one
transformer decoder layer (Llama-style: RMSNorm, grouped-query attention, SwiGLU MLP; bf16) at
the published per-chip widths (the matmuls divided by the tensor-parallel degree), forward and
backward, with ``accelkit.stats()["estimate"]`` read after each. A whole model's step on a chip
would take hours of CPU here, so the run is scaled down in two ways, each a field of the plan:

- **tokens**: ``RUN_TOKENS`` tokens (one sequence of that length) instead of the chip's batch
  (``per_device_batch_size * seq``): ``batches = chip tokens / RUN_TOKENS``. Enough tokens
  for the layer's matmuls to be compute-bound on the target, as they are at the published
  batch; attention over the shorter sequence costs less than over the published one (its
  FLOPs grow with the sequence), which the estimate then misses.
- **layers**: one layer run, ``layers`` = the model's layer count.

Then :func:`accelkit.project_scaling` adds the plan's collectives on the target's interconnect.

Published figures (MFU = model FLOPs per second per chip over the bf16 peak):

- MaxText ``src/maxtext/configs/tpu/v5e/README.md`` (AI-Hypercomputer/maxtext): 16B / 32B / 64B
  / 128B on one v5e-256: 61.10 / 66.86 / 59.90 / 56.06% MFU. The models are base.yml's 1B
  decoder (emb 2048, 16 heads of 128, MLP 7168, 16 layers, vocab 32000) with
  ``global_parameter_scale`` 16/32/64/128 (heads and MLP, embedding, layers doubled in turn,
  ``get_individual_scales``); seq 2048; the scripts ``16b.sh`` .. ``128b.sh``: per-device batch
  6/4/2/1; ``remat_policy=full`` (128B: ``qkv_proj_offloaded``); FSDP over the 256 chips (128B:
  fsdp 16 x tensor 16).
- tpu-recipes ``training/trillium/Llama3.1-8B-MaxText/v6e-8``: 3.443 s per step, 413.4 TF/s per
  chip (MaxText ``benchmarks/maxtext_trillium_model_configs.py``,
  ``llama3_1_8b_8192_no_collective_matmul``: per-device batch 3, seq 8192, FSDP over 8 chips,
  remat ``custom`` with the decoder input and the q/k/v/out projections offloaded, the rest
  recomputed). Llama 3.1 8B: emb 4096, 32 heads of 128, 8 KV heads, MLP 14336, 32 layers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

MAXTEXT_V5E = "AI-Hypercomputer/maxtext src/maxtext/configs/tpu/v5e/README.md (1x v5e-256) and {script}"
TPU_RECIPES = ("AI-Hypercomputer/tpu-recipes training/trillium/Llama3.1-8B-MaxText/v6e-8/README.md "
               "(MaxText tpu-recipes-v0.1.4, llama3_1_8b_8192_no_collective_matmul)")


@dataclass(frozen=True)
class Layer:
    """One decoder layer's widths, per chip (tensor parallelism already divides heads and MLP)."""

    emb: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int


@dataclass(frozen=True)
class Point:
    name: str
    target: str
    layer: Layer
    run_tokens: int
    chip_tokens: int
    plan: str  # ScalingPlan.parse text, without ``batches`` (from the tokens) and ``recompute``
    recompute: str  # "none", "full", or "but_projections" (offloaded projections kept)
    published_mfu: float
    published_step_s: float | None
    source: str
    notes: str = ""
    fast: bool = False  # cheap enough for the test suite
    extra: dict = field(default_factory=dict)


def _maxtext(scale: int) -> Layer:
    """base.yml's decoder with MaxText's global_parameter_scale (powers of two, doubled in turn)."""
    log2 = scale.bit_length() - 1
    base, rem = divmod(log2, 3)
    heads_scale, emb_scale = base + int(rem > 0), base + int(rem > 1)
    heads = 16 * 2 ** heads_scale
    return Layer(emb=2048 * 2 ** emb_scale, heads=heads, kv_heads=heads, head_dim=128, mlp=7168 * 2 ** heads_scale)


def _tensor_shard(layer: Layer, tp: int) -> Layer:
    return Layer(layer.emb, layer.heads // tp, layer.kv_heads // tp, layer.head_dim, layer.mlp // tp)


POINTS = [
    Point("MaxText 16B, v5e-256, fsdp 256", "v5e", _maxtext(16), 512, 6 * 2048,
          "fsdp=256,layers=32", "full", 0.6110, None, MAXTEXT_V5E.format(script="16b.sh")),
    Point("MaxText 32B, v5e-256, fsdp 256", "v5e", _maxtext(32), 512, 4 * 2048,
          "fsdp=256,layers=32", "full", 0.6686, None, MAXTEXT_V5E.format(script="32b.sh")),
    Point("MaxText 64B, v5e-256, fsdp 256", "v5e", _maxtext(64), 512, 2 * 2048,
          "fsdp=256,layers=64", "full", 0.5990, None, MAXTEXT_V5E.format(script="64b.sh")),
    Point("MaxText 128B, v5e-256, fsdp 16 x tp 16", "v5e", _tensor_shard(_maxtext(128), 16), 512, 1 * 2048,
          "fsdp=16,tp=16,layers=64", "full", 0.5606, None, MAXTEXT_V5E.format(script="128b.sh"),
          notes="qkv_proj_offloaded counted as full remat", fast=True),
    Point("tpu-recipes Llama3.1-8B, v6e-8, fsdp 8", "v6e", Layer(4096, 32, 8, 128, 14336), 1024, 3 * 8192,
          "fsdp=8,layers=32", "but_projections", 413.433e12 / 918e12, 3.443, TPU_RECIPES),
]


# ---------------------------------------------------------------------------------------------
# In a child (one per target): the run and its projection
# ---------------------------------------------------------------------------------------------


def run_layer(device, layer: Layer, tokens: int) -> dict:
    """One decoder layer, forward then backward, on ``tokens`` tokens of one sequence; the
    estimates: the forward, its q/k/v/out projections, and the whole step."""
    import torch
    import torch.nn.functional as F

    import accelkit

    torch.manual_seed(0)
    bf16 = dict(dtype=torch.bfloat16, device=device)
    q_width, kv_width = layer.heads * layer.head_dim, layer.kv_heads * layer.head_dim

    def weight(*shape):
        return (torch.randn(*shape, **bf16) * shape[-1] ** -0.5).requires_grad_()

    w = dict(qkv=weight(q_width + 2 * kv_width, layer.emb), out=weight(layer.emb, q_width),
             gate_up=weight(2 * layer.mlp, layer.emb), down=weight(layer.emb, layer.mlp),
             norm1=torch.ones(layer.emb, **bf16).requires_grad_(), norm2=torch.ones(layer.emb, **bf16).requires_grad_())
    x = torch.randn(1, tokens, layer.emb, **bf16).requires_grad_()

    def read() -> dict:
        return accelkit.stats()["estimate"]

    def forward(marks: dict):
        h = F.rms_norm(x, (layer.emb,), w["norm1"])
        before = read()["seconds"]
        q, k, v = F.linear(h, w["qkv"]).split([q_width, kv_width, kv_width], dim=-1)
        marks["projections"] = read()["seconds"] - before
        q = q.view(1, tokens, layer.heads, layer.head_dim).transpose(1, 2)
        k = k.view(1, tokens, layer.kv_heads, layer.head_dim).transpose(1, 2)
        v = v.view(1, tokens, layer.kv_heads, layer.head_dim).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=layer.kv_heads != layer.heads)
        a = a.transpose(1, 2).reshape(1, tokens, q_width)
        before = read()["seconds"]
        h = x + F.linear(a, w["out"])
        marks["projections"] += read()["seconds"] - before
        gate, up = F.linear(F.rms_norm(h, (layer.emb,), w["norm2"]), w["gate_up"]).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, w["down"])

    forward({})[0, 0, 0].item()  # warm-up: compiles every program once
    accelkit.reset_stats()
    marks: dict = {}
    y = forward(marks)
    y[0, 0, 0].item()
    fwd = read()
    y.float().square().mean().backward()
    x.grad[0, 0, 0].item()
    step = read()
    parameter_bytes = sum(t.numel() * t.element_size() for t in w.values())
    return {"estimate": step, "forward_s": fwd["seconds"], "projections_s": marks["projections"],
            "parameter_bytes": parameter_bytes, "activation_bytes": tokens * layer.emb * 2}


def project(point: Point, run: dict) -> dict:
    import accelkit

    recompute = {"none": 0.0, "full": run["forward_s"],
                 "but_projections": run["forward_s"] - run["projections_s"]}[point.recompute]
    plan = accelkit.ScalingPlan.parse(f"{point.plan},batches={point.chip_tokens / point.run_tokens},"
                                      f"recompute={1.0 if recompute else 0.0}")
    result = accelkit.project_scaling(
        run["estimate"], plan, parameter_bytes=run["parameter_bytes"],
        activation_bytes=run["activation_bytes"], forward_seconds=recompute)
    return result.as_dict()


def child(names: list[str]) -> list[dict]:
    import accelkit

    device = accelkit.select_device("tpu")
    rows, runs = [], {}
    for point in POINTS:
        if point.name not in names:
            continue
        key = (point.layer, point.run_tokens)  # 32B and 64B share their layer
        run = runs[key] = runs.get(key) or run_layer(device, point.layer, point.run_tokens)
        projection = project(point, run)
        rows.append({"point": point.name, "published_mfu": point.published_mfu,
                     "published_step_s": point.published_step_s, "source": point.source, "notes": point.notes,
                     "run_device_s": run["estimate"]["seconds"], "run_flops": run["estimate"]["flops"],
                     "run_parameter_bytes": run["parameter_bytes"], **projection})
    return rows


def run_points(points: list[Point]) -> list[dict]:
    """Each target's points in a child process of its own (``ACCELKIT_TPU_TARGET``)."""
    rows = []
    for target in dict.fromkeys(p.target for p in points):
        names = [p.name for p in points if p.target == target]
        env = {k: v for k, v in os.environ.items() if k not in ("ACCELKIT_DEVICE", "ACCELKIT_ESTIMATE_ON")}
        env["ACCELKIT_TPU_TARGET"] = target
        result = subprocess.run([sys.executable, __file__, "--child", json.dumps(names)], env=env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.stderr.write(result.stdout + result.stderr)
            raise SystemExit(f"scaling_points: the {target} points failed (exit {result.returncode})")
        rows += json.loads([ln for ln in result.stdout.splitlines() if ln.startswith("ROWS ")][-1][5:])
    return rows


def print_table(rows: list[dict]) -> None:
    print("| point | published MFU | est. MFU | ratio est/pub | est. step | compute | exposed comm | source |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        published = f"{r['published_mfu']:.1%}" + (f" ({r['published_step_s']} s/step)" if r["published_step_s"] else "")
        print(f"| {r['point']} | {published} | {r['mfu']:.1%} | {r['mfu'] / r['published_mfu']:.3f} | "
              f"{r['step_seconds']:.3f} s | {r['seconds']['compute']:.3f} s | {r['seconds']['exposed']:.3f} s | "
              f"{r['source']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="points whose name contains this text")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("ROWS " + json.dumps(child(json.loads(args.child))))
        return
    rows = run_points([p for p in POINTS if args.only.lower() in p.name.lower()])
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
