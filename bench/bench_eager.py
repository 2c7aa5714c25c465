"""Eager on tpu, strict against fused, beside compiled, JAX + jax.jit and the CPU, in one run.

    python bench/bench_eager.py [--repeat N] [--rounds N]

Prints issue 40's figures, each with its ratio to its baseline from the same run and the
issue's target beside it:

- the small MLP's SGD step (batch 16, 32→64→64→10, GELU; forward, cross-entropy, backward,
  update, as :mod:`bench_compile`): tpu strict eager, tpu fused eager,
  ``torch.compile(step, backend="tpu")``, the same step in JAX jitted whole (same shapes, same
  initial weights, same batch), CPU torch eager (PyTorch's own eager cost of the step: the floor
  of any eager mode, whose ops pass through the same dispatcher, autograd engine and optimizer
  code; tiny CPU kernels add little to it), and ``torch.compile(step, backend="aot_eager")``
  on CPU tensors (PyTorch's own compile stack with no compiler under it: the floor a compiled
  step can reach from Python);
- a chain of 10 elementwise ops on 1M float32, strict against fused;
- a small op's amortised cost in a long chain (1000 adds on 16 floats, then one
  synchronisation), strict against fused;
- Hugging Face ``generate`` per token (a 2-layer Llama from a random-initialised config, greedy,
  32 new tokens), strict against fused;
- a strict add of 16 floats against the CPU's, and against the same add through ``jax.jit``
  alone on the XLA device tpu runs on (the engine's per-call floor under the backend).

Each execution mode runs in its own process (a mode is set for the whole process, through the
public switch :func:`accelkit_backends.tpu.execution_mode`); the processes alternate over
``--rounds`` and each figure is the median of the rounds. Inside a process the cases compared
with each other (the MLP steps; the two adds) are interleaved (one block of each in turn,
``--repeat`` times), groups one after another, and a figure is the median block;
the device is synchronised before every clock reading. A mode the backend does not have yet is
reported as not available. Wall-clock on a shared machine: compare the ratios. The CPU runs on
one thread, as in :mod:`bench_ops`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import timeit
import types
from collections.abc import Callable
from pathlib import Path

import torch

from bench_compile import jax_stepper, mlp, torch_step
from bench_ops import cases as op_cases

SIZES, BATCH = (32, 64, 64, 10), 16
CHAIN_NUMEL = 1 << 20
LONG_CHAIN = 1000
NEW_TOKENS = 32

#: A case: (callable, synchronisation, calls per block, units of work per call).
Case = tuple[Callable[[], object], Callable[[], None], int, int]


def interleaved(table: dict[str, Case], repeat: int, warmup: int = 2) -> dict[str, float]:
    """Median µs per unit of work of each case: blocks of ``calls`` calls, then the case's
    synchronisation, the cases in turn, ``repeat`` blocks each, after ``warmup`` blocks (a
    fused region compiles when met the second time)."""
    for fn, sync, calls, _ in table.values():
        for _ in range(warmup):
            for _ in range(calls):
                fn()
            sync()
    samples: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(repeat):
        for name, (fn, sync, calls, units) in table.items():
            start = timeit.default_timer()
            for _ in range(calls):
                fn()
            sync()
            samples[name].append((timeit.default_timer() - start) / (calls * units) * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def _own_code(fn: Callable) -> Callable:
    """``fn`` with a code object of its own: Dynamo keeps compiled entries per code object, so
    two backends compiling the same function would otherwise test each other's guards first."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _stepper(device: torch.device | str, backend: str | None, base: torch.nn.Module,
             x: torch.Tensor, y: torch.Tensor) -> Callable[[], object]:
    """One SGD step of a copy of ``base`` on ``device``, eager or ``torch.compile``d."""
    model = mlp(SIZES).to(device)
    model.load_state_dict(base.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = torch_step if backend is None else torch.compile(_own_code(torch_step), backend=backend)
    x, y = x.to(device), y.to(device)
    return lambda: step(model, optimizer, x, y)


def _chain(x: torch.Tensor) -> torch.Tensor:
    """Ten elementwise ops, each reading the previous result."""
    y = x * 0.5
    y = y + 1.0
    y = y.sin()
    y = y * y
    y = y - 0.25
    y = y.abs()
    y = y.sqrt()
    y = y * 2.0
    y = y.tanh()
    return y + x


def _long_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    for _ in range(LONG_CHAIN):
        a = a + b
    return a


def _generator(device: torch.device) -> Callable[[], object]:
    """Greedy ``generate`` of exactly :data:`NEW_TOKENS` tokens by a tiny random Llama."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )
    model = transformers.LlamaForCausalLM(config).eval().to(device)
    model.generation_config.eos_token_id = None  # no early stop: every call makes NEW_TOKENS
    model.generation_config.pad_token_id = 0
    prompt = torch.randint(0, config.vocab_size, (1, 8)).to(device)

    def generate() -> torch.Tensor:
        with torch.no_grad():
            tokens = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
        if tokens.shape[1] != prompt.shape[1] + NEW_TOKENS:
            raise RuntimeError(f"generate made {tokens.shape[1] - prompt.shape[1]} tokens, not {NEW_TOKENS}")
        return tokens

    return generate


def tpu_cases(device: torch.device, with_baselines: bool) -> list[dict[str, Case]]:
    """The cases run in every mode and (``with_baselines``) the ones measured once, beside
    strict (compiled, JAX, the CPU), in groups: the cases of a group are compared with each other
    and interleaved; groups run one after another, so that a case's fused regions recur at once
    (fused mode compiles a region met again within a few flushes, as a loop's body is)."""
    sync = torch.tpu.synchronize
    torch.manual_seed(0)
    base = mlp(SIZES)
    x, y = torch.randn(BATCH, SIZES[0]), torch.randint(0, SIZES[-1], (BATCH,))
    chain_in = torch.randn(CHAIN_NUMEL).to(device)
    small_a, small_b = torch.randn(16).to(device), torch.randn(16).to(device)

    def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn()

        return run

    steps: dict[str, Case] = {"mlp_step": (_stepper(device, None, base, x, y), sync, 5, 1)}
    groups = [
        steps,
        {"chain10_1M": (no_grad(lambda: _chain(chain_in)), sync, 5, 1)},
        {"long_chain_add16": (no_grad(lambda: _long_chain(small_a, small_b)), sync, 1, LONG_CHAIN)},
        {"generate_token": (_generator(device), sync, 1, NEW_TOKENS)},
    ]
    if with_baselines:
        jax_run, jax_sync, _ = jax_stepper(SIZES, BATCH, start=(base, x, y))
        steps.update({
            "compiled_step": (_stepper(device, "tpu", base, x, y), sync, 5, 1),
            "aot_eager_cpu_step": (_stepper("cpu", "aot_eager", base, x, y), lambda: None, 5, 1),
            "cpu_step": (_stepper("cpu", None, base, x, y), lambda: None, 5, 1),
            "jax_jit_step": (jax_run, jax_sync, 5, 1),
        })
        add, _ = op_cases(device)["add (16,)"]
        cpu_add, _ = op_cases("cpu")["add (16,)"]
        jax_add, jax_add_sync = _jax_add16()
        groups.append({"add16": (add, sync, 500, 1), "cpu_add16": (cpu_add, lambda: None, 500, 1),
                       "jax_add16": (jax_add, jax_add_sync, 500, 1)})
    return groups


def _jax_add16() -> tuple[Callable[[], object], Callable[[], None]]:
    """An add of 16 floats through ``jax.jit`` alone, on the XLA device tpu runs on here: what
    one call of a compiled program costs the engine under the backend (its dispatch floor)."""
    import jax
    import jax.numpy as jnp

    add = jax.jit(lambda x, y: x + y)
    x, y = jnp.arange(16, dtype=jnp.float32), jnp.ones(16, jnp.float32)
    last: list = [add(x, y)]

    def run() -> object:
        last[0] = add(x, y)
        return last[0]

    return run, lambda: last[0].block_until_ready()


def child(mode: str, repeat: int) -> dict:
    """This process's figures in ``mode``, or why the mode is not available."""
    import accelkit
    from accelkit_backends.tpu import execution_mode

    torch.set_num_threads(1)
    device = accelkit.select_device("tpu")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(execution_mode(mode))
        except ValueError as why:  # a mode this backend does not have (yet)
            return {"unavailable": str(why)}
        figures: dict = {}
        for group in tpu_cases(device, with_baselines=mode == "strict"):
            figures.update(interleaved(group, repeat))
    if mode == "fused":
        figures["stats"] = accelkit.stats()["tpu"].get("fused")
    return figures


def run_child(mode: str, repeat: int) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__)), "--child", mode, "--repeat", str(repeat)],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} process failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def combine(rounds: list[dict]) -> dict:
    """Median over rounds of each figure (a mode reported unavailable stays so)."""
    if any("unavailable" in r for r in rounds):
        return next(r for r in rounds if "unavailable" in r)
    combined: dict = {name: statistics.median(r[name] for r in rounds) for name in rounds[0] if name != "stats"}
    if "stats" in rounds[-1]:
        combined["stats"] = rounds[-1]["stats"]
    return combined


# (label, mode, figure, baseline mode, baseline figure, relation to the target, target):
# the ratio is figure / baseline (a speed-up when the baseline is the candidate).
ROWS = [
    ("MLP step: tpu fused / JAX+jit", "fused", "mlp_step", "strict", "jax_jit_step", "≤", 3.0),
    ("MLP step: tpu strict / JAX+jit", "strict", "mlp_step", "strict", "jax_jit_step", None, None),
    ("MLP step: compiled tpu / JAX+jit", "strict", "compiled_step", "strict", "jax_jit_step", None, None),
    ("MLP step: CPU eager / JAX+jit (floor)", "strict", "cpu_step", "strict", "jax_jit_step", None, None),
    ("MLP step: aot_eager CPU / JAX+jit", "strict", "aot_eager_cpu_step", "strict", "jax_jit_step", None, None),
    ("MLP step: compiled tpu / aot_eager CPU", "strict", "compiled_step", "strict", "aot_eager_cpu_step", "≤", 1.3),
    ("MLP step: fused / strict", "fused", "mlp_step", "strict", "mlp_step", None, None),
    ("10 elementwise ops on 1M: strict / fused", "strict", "chain10_1M", "fused", "chain10_1M", "≥", 2.0),
    ("add in a 1000-op chain: fused µs per op", "fused", "long_chain_add16", None, None, "≤µs", 8.0),
    ("add in a 1000-op chain: fused / strict", "fused", "long_chain_add16", "strict", "long_chain_add16", None, None),
    ("HF generate per token: fused / strict", "fused", "generate_token", "strict", "generate_token", "≤", 1.1),
    ("add (16,): strict / CPU", "strict", "add16", "strict", "cpu_add16", "≤", 4.0),
    ("add (16,): JAX+jit alone / CPU (floor)", "strict", "jax_add16", "strict", "cpu_add16", None, None),
    ("add (16,): strict / JAX+jit alone", "strict", "add16", "strict", "jax_add16", None, None),
]


def report(modes: dict[str, dict]) -> None:
    print(f"torch {torch.__version__}, tpu (simulated on XLA:CPU unless a TPU is present), "
          f"CPU torch on 1 thread, load average {os.getloadavg()[0]:.1f}")
    for mode, figures in modes.items():
        if "unavailable" in figures:
            print(f"{mode}: not available ({figures['unavailable']})")
    names = sorted({name for f in modes.values() for name in f if name not in ("unavailable", "stats")})
    print(f"\n{'figure (µs per step, op, chain or token)':<42}" + "".join(f"{m:>12}" for m in modes))
    for name in names:
        cells = [f"{modes[m][name]:>12.1f}" if name in modes[m] else f"{'—':>12}" for m in modes]
        print(f"{name:<42}" + "".join(cells))
    print(f"\n{'ratio':<42}{'value':>10}{'target':>10}  met")
    for label, mode, name, base_mode, base_name, relation, target in ROWS:
        value = modes.get(mode, {}).get(name)
        if base_mode is not None:
            baseline = modes.get(base_mode, {}).get(base_name)
            value = None if value is None or baseline is None else value / baseline
        shown = "n/a" if value is None else (f"{value:.1f}µs" if relation == "≤µs" else f"{value:.2f}×")
        if target is None:
            goal, met = "", ""
        else:
            goal = f"≤{target:g}µs" if relation == "≤µs" else f"{relation}{target:g}×"
            met = "—" if value is None else ("yes" if (value >= target if relation == "≥" else value <= target) else "NO")
        print(f"{label:<42}{shown:>10}{goal:>10}  {met}")
    for mode, figures in modes.items():
        if figures.get("stats"):
            print(f"\n{mode} mode statistics (its last process, all cases): {json.dumps(figures['stats'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="blocks per case in each process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per mode, alternating")
    parser.add_argument("--modes", default="strict,fused")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeat)))
        return
    modes = args.modes.split(",")
    if "strict" not in modes:
        parser.error("--modes must include strict: it measures the baselines")
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            if not any("unavailable" in r for r in results[mode]):
                results[mode].append(run_child(mode, args.repeat))
    report({mode: combine(rounds) for mode, rounds in results.items()})


if __name__ == "__main__":
    main()
