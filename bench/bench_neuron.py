"""The neuron backend's two kinds of figures, printed side by side.

    python bench/bench_neuron.py

1. **Simulator wall time** per op — what a user waits on this machine: a small elementwise add
   (16 elements) and a 64×64 matmul on ``neuron`` against native CPU torch, measured in the same
   run, median of several repeats; each with static kernels replayed (the default: a recorded
   instance recomputes its numerics only) and with every kernel run in full
   (``ACCELKIT_NEURON_REPLAY=0``, the baseline).
2. **Eager vs compiled**: simulator wall time (replayed and in full), estimated device time, HBM
   bytes and kernels of a small-MLP SGD step (loss and optimizer step under
   ``torch.compile(backend="neuron")``), and the estimates of an elementwise-heavy block, where
   fusion keeps intermediates in SBUF.
3. **Estimated device time and HBM bytes** of one training step (forward, backward, SGD) of a
   small and a large MLP and a transformer encoder layer, eager vs compiled, on each Trainium
   generation, from the simulator's cost model: an estimate from public specifications, not a
   measurement. Each generation and mode runs in its own process (``ACCELKIT_NEURON_TARGET``),
   since a process holds one target. Also shown: the share of Tensor-engine peak the eager step
   reaches, and which engine was busiest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_ops import per_call_us  # noqa: E402

TARGETS = ("trn1", "trn2", "trn3")
#: (batch, input, hidden, classes): the bench_ops MLP, and one big enough to use the Tensor engine.
MLPS = {"small": (16, 32, 64, 10), "large": (512, 1024, 4096, 1024)}
#: (batch, sequence, width, heads, feed-forward, classes): one transformer encoder layer and a head.
TRANSFORMER = (8, 32, 128, 4, 256, 10)


REPLAY_ENV = "ACCELKIT_NEURON_REPLAY"


@contextlib.contextmanager
def _in_full(run: bool) -> Iterator[None]:
    """Within the block, every neuron kernel runs in full (no replay) when ``run`` is true."""
    previous = os.environ.get(REPLAY_ENV)
    if run:
        os.environ[REPLAY_ENV] = "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(REPLAY_ENV, None)
        else:
            os.environ[REPLAY_ENV] = previous


def wall_times(number: int, repeat: int) -> dict[str, dict[str, float]]:
    import accelkit

    dev = accelkit.select_device("neuron")
    torch.manual_seed(0)
    figures: dict[str, dict[str, float]] = {}
    inputs = {"add (16,)": (torch.randn(16), torch.randn(16), torch.add),
              "matmul 64x64": (torch.randn(64, 64), torch.randn(64, 64), torch.mm)}
    for name, (a, b, fn) in inputs.items():
        da, db = a.to(dev), b.to(dev)
        figures[name] = {"cpu_us": per_call_us(lambda: fn(a, b), lambda: None, number * 20, repeat)}
        rounds: dict[str, list[float]] = {"neuron_us": [], "in_full_us": []}
        for _ in range(repeat):  # replayed and in full take turns
            for key, full in (("neuron_us", False), ("in_full_us", True)):
                with _in_full(full):
                    rounds[key].append(per_call_us(lambda: fn(da, db), lambda: None, number, 1))
        figures[name].update({key: statistics.median(values) for key, values in rounds.items()})
    return figures


def step_wall_times(steps: int, block: int = 10) -> dict[str, float]:
    """Simulator wall time (ms, median), estimated device time (us), HBM bytes and kernels of
    one small-MLP SGD step, eager and under ``torch.compile(backend="neuron")``: the loss
    (forward and backward graphs) and the optimizer step compiled, as a training script does;
    and ``whole_step``, the same step as one compiled graph (:func:`_whole_step`). The timed
    variants (each mode replayed or in full) take turns in blocks of
    ``block`` steps, so a machine whose speed drifts moves them alike; the first step of a block
    is not counted. (Turns of single steps measured each variant with the other's data in the
    caches, which a training loop never does: it made compiled steps 15% slower than in a run of
    their own, eager ones 5%.)"""
    import copy
    import statistics
    import time

    import accelkit
    from torch import nn

    dev = accelkit.select_device("neuron")
    batch, width_in, hidden, classes = MLPS["small"]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    x, y = torch.randn(batch, width_in, device=dev), torch.randint(0, classes, (batch,), device=dev)
    runs = {"whole_step": _whole_step(copy.deepcopy(model).to(dev), x, y)}
    for mode in ("eager", "compiled"):
        net = copy.deepcopy(model).to(dev)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

        def loss_of(x: torch.Tensor, y: torch.Tensor, net: nn.Module = net) -> torch.Tensor:
            return nn.functional.cross_entropy(net(x), y)

        loss = torch.compile(loss_of, backend="neuron") if mode == "compiled" else loss_of
        update = torch.compile(optimizer.step, backend="neuron") if mode == "compiled" else optimizer.step

        def step(optimizer: torch.optim.Optimizer = optimizer, loss: object = loss, update: object = update) -> None:
            optimizer.zero_grad(set_to_none=True)
            loss(x, y).backward()
            update()

        runs[mode] = step
    for step in runs.values():
        for _ in range(3):
            step()
    samples: dict[str, list[float]] = {f"{mode}{suffix}": [] for mode in runs for suffix in ("_ms", "_in_full_ms")}
    for _ in range(max(1, steps // block)):
        for mode, step in runs.items():
            for suffix, full in (("_ms", False), ("_in_full_ms", True)):
                with _in_full(full):
                    step()
                    for _ in range(block):
                        start = time.perf_counter()
                        step()
                        samples[mode + suffix].append(time.perf_counter() - start)
    figures = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    for mode, step in runs.items():
        accelkit.reset_stats()
        for _ in range(steps):
            step()
        estimate = accelkit.stats()["neuron"]["estimate"]
        figures[f"{mode}_device_us"] = estimate["device_seconds"] / steps * 1e6
        figures[f"{mode}_hbm_bytes"] = estimate["hbm_bytes"] / steps
        figures[f"{mode}_kernels"] = estimate["kernels"] / steps
    return figures


def adaptive_vs_strict(steps: int = 60, block: int = 10) -> dict[str, float]:
    """The eager small-MLP SGD step (as :func:`step_wall_times`) in adaptive eager (the default:
    recorded, one program per step) and in strict eager (``ACCELKIT_NEURON_EAGER=strict``, one
    program per op): simulator wall time per step (ms, median; the two modes take turns in blocks of ``block`` steps, the first
    of each block not counted) and estimated device time per step (us)."""
    import copy
    import time

    import accelkit
    from accelkit_backends.neuron import eager_mode
    from torch import nn

    dev = accelkit.select_device("neuron")
    batch, width_in, hidden, classes = MLPS["small"]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    x, y = torch.randn(batch, width_in, device=dev), torch.randint(0, classes, (batch,), device=dev)
    runs = {}
    for mode in ("strict", "adaptive"):
        net = copy.deepcopy(model).to(dev)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

        def step(net: nn.Module = net, optimizer: torch.optim.Optimizer = optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()

        runs[mode] = step
    samples: dict[str, list[float]] = {mode: [] for mode in runs}
    for mode, step in runs.items():
        with eager_mode(mode):
            for _ in range(3):
                step()
    for _ in range(max(1, steps // block)):
        for mode, step in runs.items():
            with eager_mode(mode):
                step()
                for _ in range(block):
                    start = time.perf_counter()
                    step()
                    samples[mode].append(time.perf_counter() - start)
    figures = {f"{mode}_ms": statistics.median(values) * 1e3 for mode, values in samples.items()}
    for mode, step in runs.items():
        with eager_mode(mode):
            accelkit.reset_stats()
            for _ in range(steps):
                step()
            stats = accelkit.stats()["neuron"]
        figures[f"{mode}_device_us"] = stats["estimate"]["device_seconds"] / steps * 1e6
        figures[f"{mode}_kernels"] = stats["estimate"]["kernels"] / steps
        if mode == "adaptive":
            figures.update(regions=stats["adaptive"]["regions"] / steps,
                           programs_built=stats["adaptive"]["programs_built"])
    return figures


def _whole_step(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """The same SGD step as one compiled graph: the loss's gradients taken with ``torch.func``
    inside the compiled function, the update applied there too, so forward, backward and
    update are one program (as a JAX train step is one jitted function)."""
    from torch.func import functional_call, grad_and_value

    params = {name: p.detach() for name, p in net.named_parameters()}

    def loss_of(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(functional_call(net, p, (x,)), y)

    def step(p: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads, loss = grad_and_value(loss_of)(p, x, y)
        with torch.no_grad():
            for name in p:
                p[name].sub_(grads[name], alpha=0.1)
        return loss

    compiled = torch.compile(step, backend="neuron")
    return lambda: compiled(params, x, y)


def activation_block(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """An elementwise-heavy block (a gated activation with a residual): what fusion is for."""
    return x + torch.nn.functional.silu(gate) * torch.tanh(x * 0.5 + 1.0) - 0.1 * gate


def block_estimates(rows: int = 512, cols: int = 1024) -> dict[str, float]:
    """Estimated device time, HBM bytes and kernels of :func:`activation_block` on float32
    ``[rows, cols]`` inputs, eager and compiled (after a warm-up call)."""
    import accelkit

    dev = accelkit.select_device("neuron")
    x, gate = torch.randn(rows, cols, device=dev), torch.randn(rows, cols, device=dev)
    figures = {}
    for mode, fn in (("eager", activation_block), ("compiled", torch.compile(activation_block, backend="neuron"))):
        fn(x, gate)
        accelkit.reset_stats()
        # Held while the estimate is read: adaptive eager never computes a result nobody holds.
        result = fn(x, gate)
        estimate = accelkit.stats()["neuron"]["estimate"]
        del result
        figures[f"{mode}_device_us"] = estimate["device_seconds"] * 1e6
        figures[f"{mode}_hbm_bytes"] = estimate["hbm_bytes"]
        figures[f"{mode}_kernels"] = estimate["kernels"]
    return figures


def _model_and_batch(name: str, dtype: torch.dtype, dev: torch.device):
    from torch import nn

    torch.manual_seed(0)
    if name == "transformer":
        batch, seq, width, heads, ff, classes = TRANSFORMER
        layer = nn.TransformerEncoderLayer(width, heads, ff, dropout=0.0, batch_first=True)
        model = nn.Sequential(layer, nn.Flatten(), nn.Linear(seq * width, classes))
        x = torch.randn(batch, seq, width)
    else:
        batch, width_in, hidden, classes = MLPS[name]
        model = nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        x = torch.randn(batch, width_in)
    y = torch.randint(0, classes, (batch,))
    return model.to(dev, dtype), x.to(dev, dtype), y.to(dev)


def step_estimate(name: str, dtype: str, compiled: bool) -> dict:
    """One training step's estimate on the active target (run inside a target's process):
    eagerly, or with the loss and the optimizer step under ``torch.compile(backend="neuron")``."""
    import accelkit
    from torch import nn

    dev = accelkit.select_device("neuron")
    model, x, y = _model_and_batch(name, getattr(torch, dtype), dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x).float(), y)

    loss = torch.compile(loss_of, backend="neuron") if compiled else loss_of
    update = torch.compile(optimizer.step, backend="neuron") if compiled else optimizer.step

    def step() -> None:
        optimizer.zero_grad()
        loss(x, y).backward()
        update()

    step()  # first step: optimizer state, kernel instances, programs
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        step()
    stats = accelkit.stats()
    estimate = stats["neuron"]["estimate"]
    from accelkit_backends.neuron.device import device_model

    peak = device_model().peak_flops.get(getattr(torch, dtype))
    return {
        "target": estimate["target"],
        "device_us": estimate["device_seconds"] * 1e6,
        "hbm_bytes": estimate["hbm_bytes"],
        "flops": estimate["flops"],
        "tensor_peak_share": (estimate["flops"] / estimate["device_seconds"] / peak) if peak else None,
        "busiest_engine": max(estimate["per_engine_seconds"], key=estimate["per_engine_seconds"].get),
        "kernels": estimate["kernels"],
        "fallbacks": stats["totals"]["fallback"],
        "eager_nodes": sum(stats["compile"]["eager_nodes"].values()),
    }


def estimates_per_target(name: str, dtype: str) -> list[dict]:
    """Per generation, the eager and the compiled step's estimates, each from a fresh process."""
    rows = []
    for target in TARGETS:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
        env["ACCELKIT_NEURON_TARGET"] = target
        row = {"target": target}
        for mode in ("eager", "compiled"):
            done = subprocess.run([sys.executable, __file__, "--estimate", name, dtype, mode], env=env,
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                row["error"] = done.stderr.strip().splitlines()[-1:]
                break
            row[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--estimate", nargs=3, metavar=("MODEL", "DTYPE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.estimate:
        name, dtype, mode = args.estimate
        print(json.dumps(step_estimate(name, dtype, compiled=mode == "compiled")))
        return

    print(f"neuron (simulated NeuronCore) vs CPU, load average {os.getloadavg()[0]:.1f}\n")
    print("Simulator wall time per op (median), static kernels replayed (the default) and every kernel "
          "run in full (the baseline):")
    for name, row in wall_times(args.number, args.repeat).items():
        print(f"  {name:14s} neuron {row['neuron_us']:7.1f} us ({row['neuron_us'] / row['cpu_us']:.0f}x cpu) | "
              f"in full {row['in_full_us']:7.1f} us | replayed / in full {row['neuron_us'] / row['in_full_us']:.2f}x | "
              f"cpu {row['cpu_us']:6.2f} us")
    step = step_wall_times(60)
    batch, width_in, hidden, classes = MLPS["small"]
    print(f"\nOne small-MLP SGD step ({batch}x{width_in} -> {hidden} -> {classes}, float32), eager vs "
          "torch.compile(backend='neuron'):")
    print(f"  simulator wall time: eager {step['eager_ms']:.2f} ms, compiled {step['compiled_ms']:.2f} ms "
          f"({step['compiled_ms'] / step['eager_ms']:.2f}x); every kernel in full: eager "
          f"{step['eager_in_full_ms']:.2f} ms, compiled {step['compiled_in_full_ms']:.2f} ms "
          f"({step['compiled_in_full_ms'] / step['eager_in_full_ms']:.2f}x); compiled replayed / eager in full "
          f"{step['compiled_ms'] / step['eager_in_full_ms']:.2f}x")
    print(f"  estimated device time: eager {step['eager_device_us']:.1f} us, compiled "
          f"{step['compiled_device_us']:.1f} us ({step['compiled_device_us'] / step['eager_device_us']:.2f}x)")
    print(f"  HBM bytes: eager {step['eager_hbm_bytes']:.0f}, compiled {step['compiled_hbm_bytes']:.0f} "
          f"({step['compiled_hbm_bytes'] / step['eager_hbm_bytes']:.2f}x); kernels: eager "
          f"{step['eager_kernels']:.0f}, compiled {step['compiled_kernels']:.0f})")
    print(f"  the whole step as one compiled graph (torch.func grad and the update inside): wall "
          f"{step['whole_step_ms']:.2f} ms ({step['whole_step_ms'] / step['eager_ms']:.2f}x eager), in full "
          f"{step['whole_step_in_full_ms']:.2f} ms; device {step['whole_step_device_us']:.1f} us "
          f"({step['whole_step_device_us'] / step['eager_device_us']:.2f}x); HBM {step['whole_step_hbm_bytes']:.0f} "
          f"({step['whole_step_hbm_bytes'] / step['eager_hbm_bytes']:.2f}x); kernels {step['whole_step_kernels']:.0f}")
    ab = adaptive_vs_strict(60)
    print("\nThe same eager step, adaptive eager (one program per step) vs strict (the default, one program "
          "per op), A/B in this run:")
    print(f"  estimated device time: adaptive {ab['adaptive_device_us']:.1f} us, strict {ab['strict_device_us']:.1f} us "
          f"({ab['adaptive_device_us'] / ab['strict_device_us']:.2f}x); kernels {ab['adaptive_kernels']:.0f} vs "
          f"{ab['strict_kernels']:.0f}; regions per step {ab['regions']:.1f}, programs built {ab['programs_built']}")
    print(f"  simulator wall time: adaptive {ab['adaptive_ms']:.2f} ms, strict {ab['strict_ms']:.2f} ms "
          f"({ab['adaptive_ms'] / ab['strict_ms']:.2f}x)")
    block = block_estimates()
    print("\nAn elementwise block x + silu(g) * tanh(0.5 x + 1) - 0.1 g on 512x1024 float32, eager vs compiled:")
    print(f"  estimated device time: eager {block['eager_device_us']:.1f} us, compiled {block['compiled_device_us']:.1f} us "
          f"({block['compiled_device_us'] / block['eager_device_us']:.2f}x)")
    print(f"  HBM bytes: eager {block['eager_hbm_bytes']:.0f}, compiled {block['compiled_hbm_bytes']:.0f} "
          f"({block['compiled_hbm_bytes'] / block['eager_hbm_bytes']:.2f}x); kernels: eager "
          f"{block['eager_kernels']}, compiled {block['compiled_kernels']}")
    print("\nEstimated device time and HBM bytes of one training step, eager vs compiled (loss and SGD step "
          "under torch.compile), per generation (estimates from public specifications):")
    for name in (*MLPS, "transformer"):
        for dtype in ("float32", "bfloat16"):
            if name == "transformer":
                batch, seq, width, heads, ff, classes = TRANSFORMER
                shape = f"encoder layer {batch}x{seq}x{width}, {heads} heads, ff {ff} -> {classes}"
            else:
                batch, width_in, hidden, classes = MLPS[name]
                shape = f"MLP {batch}x{width_in} -> {hidden} -> {classes}"
            print(f"  {name} {shape}, {dtype}:")
            for row in estimates_per_target(name, dtype):
                if "error" in row:
                    print(f"    {row['target']}: failed: {row['error']}")
                    continue
                eager, compiled = row["eager"], row["compiled"]
                share = f"{eager['tensor_peak_share']:.1%}" if eager["tensor_peak_share"] else "n/a"
                print(f"    {row['target']}: eager {eager['device_us']:9.1f} us {eager['hbm_bytes'] / 1e6:8.2f} MB "
                      f"{eager['kernels']:3d} kernels | compiled {compiled['device_us']:9.1f} us "
                      f"({compiled['device_us'] / eager['device_us']:.2f}x) {compiled['hbm_bytes'] / 1e6:8.2f} MB "
                      f"({compiled['hbm_bytes'] / eager['hbm_bytes']:.2f}x) {compiled['kernels']:3d} kernels | eager: "
                      f"{share} of Tensor-engine peak, busiest {eager['busiest_engine']}; fallbacks "
                      f"{eager['fallbacks'] + compiled['fallbacks']}, eager nodes {compiled['eager_nodes']}")


if __name__ == "__main__":
    main()
