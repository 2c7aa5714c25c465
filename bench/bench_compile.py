"""torch.compile on tpu against eager tpu, JAX + jax.jit, and native CPU, in one run.

Per MLP (the issue's small one: batch 16, 32→64→64→10, GELU; a larger one: batch 64,
256→512→512→10) it times one SGD training step (forward, cross-entropy, backward, update):

- ``eager``: tpu eager (one XLA program per op);
- ``compiled_fwd_bwd``: ``torch.compile(model, backend="tpu")``, optimizer eager;
- ``compiled_step``: the whole step function compiled (forward, backward and optimizer graphs);
- ``jax_jit``: the same step written in JAX, jitted as one function, on the same XLA CPU;
- ``cpu``: native PyTorch on the CPU.

Each figure is the median of ``--repeat`` timed steps after warm-up, synchronised. Also: the
compile time of the first compiled step against JAX's (trace + compile), the peak device memory
a compiled step allocates against an eager one (above what is allocated when it begins), a BERT-sized encoder forward (6 layers, hidden 384)
compiled vs eager, and the persistent compile cache (``ACCELKIT_COMPILE_CACHE``): time to the
first compiled step in a cold and a warm second process. Prints JSON, then ratio lines.

    python bench/bench_compile.py [--repeat N] [--quick]
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

import torch


def mlp(sizes: tuple[int, ...]) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.GELU())
    return torch.nn.Sequential(*layers)


def timed(fn, sync, repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def peak_increase(step) -> int:
    """Device memory a step allocates at its peak, above what was allocated when it began."""
    torch.tpu.synchronize()
    start = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    step()
    torch.tpu.synchronize()
    return torch.tpu.max_memory_allocated() - start


def torch_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def jax_stepper(sizes, batch, start=None):
    """The training step written in JAX and jitted whole: ``(run, sync, compile_seconds)``.

    ``start``: ``(model, x, y)``, a torch :func:`mlp` of these sizes and a CPU batch, whose
    values the JAX step starts from (the same weights, the same batch); default JAX's own.
    """
    import jax
    import jax.numpy as jnp

    if start is None:
        keys = jax.random.split(jax.random.key(0), len(sizes))
        params = [(jax.random.normal(k, (sizes[i], sizes[i + 1])) * 0.05, jnp.zeros(sizes[i + 1]))
                  for i, k in enumerate(keys[:-1])]
        x = jax.random.normal(keys[-1], (batch, sizes[0]))
        y = jnp.arange(batch) % sizes[-1]
    else:
        model, x_cpu, y_cpu = start
        linears = [m for m in model if isinstance(m, torch.nn.Linear)]
        params = [(jnp.asarray(m.weight.detach().T.numpy()), jnp.asarray(m.bias.detach().numpy())) for m in linears]
        x, y = jnp.asarray(x_cpu.numpy()), jnp.asarray(y_cpu.numpy())

    def loss_fn(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i < len(params) - 1:
                h = jax.nn.gelu(h, approximate=False)
        logp = jax.nn.log_softmax(h)
        return -jnp.mean(logp[jnp.arange(batch), y])

    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    started = time.perf_counter()
    jitted = jax.jit(step).lower(params, x, y).compile()
    compile_seconds = time.perf_counter() - started
    state = {"params": params}

    def run():
        loss, state["params"] = jitted(state["params"], x, y)
        state["loss"] = loss

    return run, lambda: state["loss"].block_until_ready(), compile_seconds


def jax_case(sizes, batch, repeat):
    run, sync, compile_seconds = jax_stepper(sizes, batch)
    return timed(run, sync, repeat), compile_seconds


def mlp_case(dev, name, sizes, batch, repeat):
    import accelkit

    torch.manual_seed(0)
    base = mlp(sizes)
    x_cpu, y_cpu = torch.randn(batch, sizes[0]), torch.randint(0, sizes[-1], (batch,))
    x, y = x_cpu.to(dev), y_cpu.to(dev)
    sync = torch.tpu.synchronize
    result: dict = {"shapes": f"batch {batch}, {'→'.join(map(str, sizes))}"}

    cpu_model = mlp(sizes)
    cpu_model.load_state_dict(base.state_dict())
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.01)
    result["cpu"] = timed(lambda: torch_step(cpu_model, cpu_opt, x_cpu, y_cpu), lambda: None, repeat)

    eager = mlp(sizes).to(dev)
    eager.load_state_dict(base.state_dict())
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.01)
    result["eager"] = timed(lambda: torch_step(eager, eager_opt, x, y), sync, repeat)
    eager_peak = peak_increase(lambda: torch_step(eager, eager_opt, x, y))

    fwd_model = mlp(sizes).to(dev)
    fwd_model.load_state_dict(base.state_dict())
    compiled_model = torch.compile(fwd_model, backend="tpu")
    fwd_opt = torch.optim.SGD(fwd_model.parameters(), lr=0.01)
    result["compiled_fwd_bwd"] = timed(lambda: torch_step(compiled_model, fwd_opt, x, y), sync, repeat)

    step_model = mlp(sizes).to(dev)
    step_model.load_state_dict(base.state_dict())
    step_opt = torch.optim.SGD(step_model.parameters(), lr=0.01)
    compiled_step = torch.compile(torch_step, backend="tpu")
    accelkit.reset_stats()
    started = time.perf_counter()
    compiled_step(step_model, step_opt, x, y)
    sync()
    result["compile_seconds"] = time.perf_counter() - started
    result["compiled_step"] = timed(lambda: compiled_step(step_model, step_opt, x, y), sync, repeat)
    compiled_peak = peak_increase(lambda: compiled_step(step_model, step_opt, x, y))
    # Above what is allocated before a step (the models, their gradients, the batch).
    result["peak_bytes_above_step_start"] = {"eager": eager_peak, "compiled_step": compiled_peak}
    result["compile_stats"] = {k: accelkit.stats()["compile"][k] for k in ("graphs_captured", "programs_compiled", "eager_nodes")}

    result["jax_jit"], result["jax_compile_seconds"] = jax_case(sizes, batch, repeat)
    return result


def encoder_case(dev, repeat, quick):
    torch.manual_seed(0)
    layers, hidden, heads, seq, batch = (2, 384, 6, 64, 4) if quick else (6, 384, 6, 128, 8)
    encoder = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, batch_first=True),
        layers, enable_nested_tensor=False,
    ).eval().to(dev)
    x = torch.randn(batch, seq, hidden, device=dev)
    compiled = torch.compile(encoder, backend="tpu")
    sync = torch.tpu.synchronize
    with torch.no_grad():
        started = time.perf_counter()
        compiled(x)
        sync()
        compile_seconds = time.perf_counter() - started
        figures = {
            "shapes": f"{layers} layers, hidden {hidden}, {heads} heads, batch {batch}, seq {seq}",
            "eager": timed(lambda: encoder(x), sync, repeat),
            "compiled": timed(lambda: compiled(x), sync, repeat),
            "compile_seconds": compile_seconds,
            "max_abs_difference": (compiled(x) - encoder(x)).abs().max().item(),
        }
    return figures


_FIRST_STEP = """
import time, torch, accelkit
started = time.perf_counter()
dev = accelkit.select_device("tpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10)).to(dev)
loss = torch.compile(model, backend="tpu")(torch.randn(16, 32, device=dev)).sum()
loss.backward(); torch.tpu.synchronize()
cache = accelkit.stats()["compile"]["persistent_cache"]
print(time.perf_counter() - started, cache["hits"], cache["misses"])
"""


def cache_case():
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "ACCELKIT_COMPILE_CACHE": directory}
        runs = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", _FIRST_STEP], env=env, capture_output=True, text=True, check=True)
            seconds, hits, misses = out.stdout.split()
            runs.append({"seconds_to_first_step": float(seconds), "hits": int(hits), "misses": int(misses)})
    return {"cold": runs[0], "warm": runs[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, a smaller encoder, no cache case")
    args = parser.parse_args()
    repeat = 10 if args.quick else args.repeat

    import accelkit

    dev = accelkit.select_device("tpu")
    results = {
        "small_mlp": mlp_case(dev, "small", (32, 64, 64, 10), 16, repeat),
        "large_mlp": mlp_case(dev, "large", (256, 512, 512, 10), 64, repeat),
        "encoder_forward": encoder_case(dev, max(repeat // 5, 3), args.quick),
    }
    if not args.quick:
        results["persistent_cache"] = cache_case()
    print(json.dumps(results, indent=1))
    for name in ("small_mlp", "large_mlp"):
        r = results[name]
        print(f"{name} ({r['shapes']}): compiled step / jax+jit = {r['compiled_step'] / r['jax_jit']:.2f}x, "
              f"compiled fwd+bwd / jax+jit = {r['compiled_fwd_bwd'] / r['jax_jit']:.2f}x, "
              f"eager / jax+jit = {r['eager'] / r['jax_jit']:.2f}x, cpu / jax+jit = {r['cpu'] / r['jax_jit']:.2f}x, "
              f"eager / compiled step = {r['eager'] / r['compiled_step']:.2f}x; "
              f"compile time / jax's = {r['compile_seconds'] / r['jax_compile_seconds']:.1f}x; "
              f"a step's peak memory above its start: compiled {r['peak_bytes_above_step_start']['compiled_step']} B, "
              f"eager {r['peak_bytes_above_step_start']['eager']} B")
    e = results["encoder_forward"]
    print(f"encoder forward ({e['shapes']}): eager / compiled = {e['eager'] / e['compiled']:.2f}x")
    if "persistent_cache" in results:
        c = results["persistent_cache"]
        print(f"persistent cache: warm / cold time to first compiled step = "
              f"{c['warm']['seconds_to_first_step'] / c['cold']['seconds_to_first_step']:.2f} "
              f"({c['warm']['hits']} hits warm, {c['cold']['misses']} compiled cold)")


if __name__ == "__main__":
    main()
