"""accelkit's estimates against published measurements (issue #41; the table in docs/estimates.md).

    python bench/validate_estimates.py              # every point, tpu then neuron (one process each)
    python bench/validate_estimates.py --skip-large # without the 8192³ matmul (about a minute of CPU)
    python bench/validate_estimates.py --json out.json
    python bench/validate_estimates.py --skip-scaling # without the points at scale (minutes of CPU;
                                                      # bench/scaling_points.py runs them alone)

Each point is run the way a user runs it: device tensors on the backend, the target chosen by the
backend's environment variable (``ACCELKIT_TPU_TARGET``, ``ACCELKIT_NEURON_TARGET``), and the
estimate read from ``accelkit.stats()["estimate"]`` after ``accelkit.reset_stats()``. Nothing
here knows a backend's cost model. A backend holds one process (PyTorch has one PrivateUse1
slot), so each backend's points run in a child process of their own, one after the other.

The table has, per point: the published figure and its source, the estimate's device time, its
launch time (``launch_seconds``: the device waiting on the host to hand it each program, by the
SDK's rule, ``accelkit.sdk.LaunchLedger``), their sum, and the ratio of that sum to the published
figure. A second table has the tour's MLP step on both backends (no published measurement), with
the launches and host waits per step that explain the factor between them.

Published figures (each re-read in its source; see docs/estimates.md):

- JAX's Pallas TPU matmul guide (jax-ml/jax ``docs/pallas/tpu/matmul.ipynb``, section "XLA
  matmul", run on a TPU v5e): ``jnp.matmul`` of two bf16 ``jnp.ones`` arrays, timed with
  ``timeit`` over 100 calls of ``jax.block_until_ready(f(x, y))`` after one warm-up call, so
  each call's dispatch from Python is included: 1024³ 119.4 µs, 4096³ 827.3 µs, 8192³ 6.047 ms.
- AWS Neuron's trn1 inference latency table (aws-neuron-sdk ``about-neuron/benchmarks/trn1/
  latency_data_encoder.csv``): P50 latency of Hugging Face encoders, batch 1, sequence 128,
  FP32 with matmuls autocast to BF16, on a trn1.2xlarge: distilbert-base 0.543 ms, bert-base
  0.943 ms, bert-large 2.669 ms. accelkit's expression: the same architecture (random weights)
  compiled for neuron with ``ACCELKIT_NEURON_TARGET=trn1``, one synchronous inference under
  bf16 autocast.
- vLLM-Neuron's async-execution design note (``vllm-neuron/docs/design/framework/
  async_execution.md``, via shared/research/workloads-and-estimates.md): 437 µs idle on a trn2
  NeuronCore between two synchronous NEFF executions, i.e. the host's per-call cost. accelkit's
  nearest expression: a small program run synchronously, call after call.

The 1024³ point and the NEFF point are the ones the targets' launch costs were read from
(``DeviceModel.sources["launch_seconds"]``): they check the rule, not the constant.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PALLAS_GUIDE = "jax-ml/jax docs/pallas/tpu/matmul.ipynb, 'XLA matmul' (v5e, bf16, block_until_ready, mean of 100)"
VLLM_NEURON = "vllm-neuron docs/design/framework/async_execution.md (trn2, via research/workloads-and-estimates.md)"

#: (name, n, published seconds, source): XLA bf16 matmuls n³ on v5e.
TPU_MATMULS = [
    ("XLA bf16 matmul 1024³, v5e", 1024, 119.43e-6, PALLAS_GUIDE),
    ("XLA bf16 matmul 4096³, v5e", 4096, 827.29e-6, PALLAS_GUIDE),
    ("XLA bf16 matmul 8192³, v5e", 8192, 6.0471e-3, PALLAS_GUIDE),
]
NEFF_IDLE = ("synchronous NEFF call, idle between executions, trn2", 437e-6, VLLM_NEURON)

NEURON_TRN1_LATENCY = ("aws-neuron-sdk about-neuron/benchmarks/trn1/latency_data_encoder.csv "
                       "(trn1.2xlarge, PyTorch, batch 1, seq 128, FP32 with matmuls autocast to BF16, P50)")
#: (name, transformers config class and overrides, published P50 seconds): encoders on one trn1
#: NeuronCore, one synchronous inference at a time.
TRN1_ENCODERS = [
    ("distilbert-base-uncased, trn1, batch 1, seq 128", ("DistilBertConfig", {}), 0.54264069e-3),
    ("bert-base-uncased, trn1, batch 1, seq 128", ("BertConfig", {}), 0.94294548e-3),
    ("bert-large-uncased, trn1, batch 1, seq 128",
     ("BertConfig", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)),
     2.66885757e-3),
]

#: distilbert-base and bert-base have the same encoder layer (hidden 768, 12 heads, MLP 3072): the
#: difference of their latencies is 6 layers' time, with no launch or per-call cost in it (bert-base
#: also has token-type embeddings and a pooler on the first token: a 768x768 matrix-vector product).
PER_LAYER = ("one encoder layer (hidden 768, seq 128), trn1: (bert-base - distilbert) / 6",
             TRN1_ENCODERS[0][0], TRN1_ENCODERS[1][0], 6)

#: Published peaks the roofline column uses (shared/research/hardware-facts.md §1.1, §2.2, §5):
#: bf16 FLOP/s and HBM bytes/s of one device (a v5e chip; one trn2 NeuronCore, chip / 8).
ROOFLINE = {"v5e": (197e12, 819e9), "trn2": (79e12, 2.9e12 / 8)}


# ---------------------------------------------------------------------------------------------
# In a child: one backend's points, through the public API
# ---------------------------------------------------------------------------------------------


def _estimate(calls: int) -> dict:
    """The estimate since the last reset, per call."""
    import accelkit

    e = accelkit.stats()["estimate"]
    return {"target": e["target"], "device_s": e["seconds"] / calls, "launch_s": e["launch_seconds"] / calls,
            "total_s": e["total_seconds"] / calls, "launches": e["launches"] / calls, "syncs": e["syncs"] / calls,
            "flops": (e.get("flops") or 0) / calls, "bytes": (e.get("hbm_bytes") or 0) / calls,
            "programs": sum(r["calls"] for r in e["per_op"].values()) / calls}


def _sync(device) -> None:
    import torch

    getattr(torch, device.type).synchronize()


def _matmul(device, n: int, calls: int) -> dict:
    """``calls`` synchronous bf16 matmuls n³ (the guide's inputs are ``jnp.ones``), the first one
    after a warm-up call, as the guide times them."""
    import torch

    import accelkit

    a = torch.ones(n, n, dtype=torch.bfloat16, device=device)
    b = torch.ones(n, n, dtype=torch.bfloat16, device=device)
    _sync(device)
    c = a @ b  # warm-up: compiles, as the guide's first call does
    _sync(device)
    del c
    accelkit.reset_stats()
    start = time.perf_counter()
    for _ in range(calls):
        c = a @ b
        _sync(device)
    wall = (time.perf_counter() - start) / calls
    return {**_estimate(calls), "wall_here_s": wall}


def _small_sync_calls(device, calls: int = 20) -> dict:
    """A small program (one elementwise op on 128×512 float32) run synchronously, call after
    call: the host's per-call cost is the whole point, not the work."""
    import torch

    import accelkit

    x = torch.ones(128, 512, device=device)
    y = x + 1
    _sync(device)
    accelkit.reset_stats()
    for _ in range(calls):
        y = x + 1
        _sync(device)
    del y
    return _estimate(calls)


def _mlp_step(device, steps: int = 10) -> dict:
    """The tour's model and optimizer (examples/train_mlp.py: 16-64-64-4 MLP, batch 32, Adam),
    one training step with its ``loss.item()``, in the backend's default eager mode; the
    estimate per step after three warm-up steps."""
    import torch
    from torch import nn

    import accelkit

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from train_mlp import make_batches, make_model

    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = [(x.to(device), y.to(device)) for x, y in make_batches(steps + 3, 32)]

    def step(x, y) -> float:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    for x, y in batches[:3]:
        step(x, y)
    accelkit.reset_stats()
    for x, y in batches[3:]:
        step(x, y)
    return _estimate(steps)


def _encoder(device, config: tuple[str, dict], calls: int = 1) -> dict:
    """A Hugging Face encoder (random weights: the time does not depend on them) compiled for
    the device, one synchronous inference of batch 1 × 128 tokens under bf16 autocast (the
    published rows' "Matmult-BF16"), after a warm-up call that compiles it."""
    import torch
    import transformers

    import accelkit

    class_name, overrides = config
    cfg = getattr(transformers, class_name)(**overrides)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(cfg).eval().to(device)
    compiled = torch.compile(model, backend=device.type)
    ids = torch.randint(0, cfg.vocab_size, (1, 128)).to(device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        compiled(input_ids=ids).last_hidden_state.cpu()
        accelkit.reset_stats()
        start = time.perf_counter()
        for _ in range(calls):
            compiled(input_ids=ids).last_hidden_state.cpu()
        wall = (time.perf_counter() - start) / calls
    return {**_estimate(calls), "wall_here_s": wall}


def published_points(backend: str, device, skip_large: bool = False) -> list[dict]:
    """The published points of the backend's active target, each with the estimate of its
    expression here (tpu v5e: XLA matmuls; neuron trn2: a synchronous NEFF call; neuron trn1:
    encoder latencies; ``skip_large`` leaves out the 8192³ matmul and bert-large)."""
    from accelkit.sdk import active_device_model

    rows = []
    target = active_device_model().name
    if backend == "neuron" and target == "trn1":
        for name, config, published in TRN1_ENCODERS:
            if skip_large and "large" in name:
                continue
            rows.append({"table": "published", "point": name, "published_s": published, "source": NEURON_TRN1_LATENCY,
                         **_encoder(device, config)})
    elif backend == "tpu":
        for name, n, published, source in TPU_MATMULS:
            if skip_large and n > 4096:
                continue
            rows.append({"table": "published", "point": name, "published_s": published, "source": source,
                         **_matmul(device, n, calls=5 if n <= 1024 else 1)})
    else:
        name, published, source = NEFF_IDLE
        rows.append({"table": "published", "point": name, "published_s": published, "source": source,
                     **_small_sync_calls(device)})
    return rows


def per_layer_point(rows: list[dict]) -> dict | None:
    """The derived point :data:`PER_LAYER` from the two encoders' rows (None without both):
    published and estimated time per layer, the estimate's device time only (its launch cancels
    in the difference, as the published per-call cost does)."""
    name, shallow, deep, layers = PER_LAYER
    found = {r["point"]: r for r in rows if r.get("table") == "published"}
    if shallow not in found or deep not in found:
        return None
    a, b = found[shallow], found[deep]
    device = (b["device_s"] - a["device_s"]) / layers
    return {"table": "published", "point": name, "target": a["target"], "derived": True,
            "published_s": (b["published_s"] - a["published_s"]) / layers, "device_s": device,
            "launch_s": 0.0, "total_s": device, "source": f"the two rows above ({NEURON_TRN1_LATENCY})"}


def child(backend: str, skip_large: bool) -> list[dict]:
    import accelkit

    device = accelkit.select_device(backend)
    rows = published_points(backend, device, skip_large)
    if os.environ.get("ACCELKIT_NEURON_TARGET") == "trn1":
        return rows
    rows.append({"table": "compare", "point": "tour MLP step (Adam, batch 32), eager", **_mlp_step(device)})
    rows.append({"table": "compare", "point": "bf16 matmul 1024³", "roofline_flops": 2 * 1024 ** 3,
                 "roofline_bytes": 3 * 1024 * 1024 * 2, **_matmul(device, 1024, calls=1)})
    return rows


# ---------------------------------------------------------------------------------------------
# The parent: one child per backend, then the tables
# ---------------------------------------------------------------------------------------------


def _us(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} µs"


def _run_child(backend: str, skip_large: bool, target: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELKIT_DEVICE", "ACCELKIT_ESTIMATE_ON")}
    env["ACCELKIT_TPU_TARGET" if backend == "tpu" else "ACCELKIT_NEURON_TARGET"] = target
    command = [sys.executable, __file__, "--child", backend] + (["--skip-large"] if skip_large else [])
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"validate_estimates: the {backend} points failed (exit {result.returncode})")
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("ROWS ")][-1]
    return json.loads(line[5:])


def print_tables(rows: list[dict]) -> None:
    print("Published measurements against accelkit's estimates (estimate = device + launch)\n")
    print("| point | published | est. device | est. launch | est. total | ratio est/pub | source |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["table"] != "published":
            continue
        print(f"| {r['point']} ({r['target']}) | {_us(r['published_s'])} | {_us(r['device_s'])} | "
              f"{_us(r['launch_s'])} | {_us(r['total_s'])} | {r['total_s'] / r['published_s']:.3f} | {r['source']} |")
    print("\nDetail: what the estimate counted per call; programs (tpu) or kernels (neuron) per call; "
          "wall time here (XLA's CPU platform or the simulator, not a TPU)\n")
    print("| point | FLOPs | bytes | programs/kernels | launches | host waits | wall here |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("derived"):
            continue
        print(f"| {r['point']} ({r['target']}) | {r['flops']:.4g} | {r['bytes']:.4g} | {r['programs']:.1f} | "
              f"{r['launches']:.1f} | {r['syncs']:.1f} | {_us(r.get('wall_here_s'))} |")
    print("\nNo published measurement: the two backends side by side, with each chip's roofline "
          "(max of FLOPs / bf16 peak, minimal bytes / HBM bandwidth; hardware-facts.md)\n")
    print("| point | target | est. device | est. launch | est. total | launches | roofline of the minimal work |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["table"] != "compare":
            continue
        roofline = None
        if "roofline_flops" in r and r["target"] in ROOFLINE:
            peak, bandwidth = ROOFLINE[r["target"]]
            roofline = max(r["roofline_flops"] / peak, r["roofline_bytes"] / bandwidth)
        print(f"| {r['point']} | {r['target']} | {_us(r['device_s'])} | {_us(r['launch_s'])} | "
              f"{_us(r['total_s'])} | {r['launches']:.1f} | {_us(roofline)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-large", action="store_true", help="leave out the 8192³ matmul")
    parser.add_argument("--skip-scaling", action="store_true",
                        help="leave out the points at scale (bench/scaling_points.py)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the rows to FILE")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("ROWS " + json.dumps(child(args.child, args.skip_large)))
        return
    rows = []
    for backend, target in (("tpu", "v5e"), ("neuron", "trn2"), ("neuron", "trn1")):
        rows += _run_child(backend, args.skip_large, target)
    derived = per_layer_point(rows)
    if derived is not None:
        rows.append(derived)
    print_tables(rows)
    if not args.skip_scaling:
        import scaling_points

        print("\nAt scale: published MFU against accelkit.project_scaling of one layer run on one device "
              "(bench/scaling_points.py)\n")
        scaled = scaling_points.run_points(scaling_points.POINTS)
        scaling_points.print_table(scaled)
        rows += [{"table": "scaling", **r} for r in scaled]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
