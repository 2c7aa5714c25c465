"""Per-op cost on an accelkit device against native CPU torch, measured in the same run.

    python bench/bench_ops.py                      # ref
    python bench/bench_ops.py --device tpu         # tpu (XLA); adds torchax when it is installed

Prints microseconds per call (median of several repeats) for a small elementwise add, a chain
of small adds (each waiting for the one before; the figure is per add: a small op's amortised
cost in a long chain), a 64×64 matmul, an in-place update, a host batch moved to the device,
indexed reads and writes (rows of a table, an embedding lookup, a gather), an integer division and one training step of a small MLP
(forward, backward, SGD), with the ratio to the same work on the CPU. The indexing, division and
loss cases include the device-side checks that refuse bad indices and divisors as CPU does. The device is
synchronised before each clock reading. Figures are wall-clock on this machine: compare ratios,
not absolute numbers, across machines. The CPU baseline runs single-threaded
(``torch.set_num_threads(1)``), in this process and in torchax's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn


def per_call_us(fn: Callable[[], object], sync: Callable[[], None], number: int, repeat: int) -> float:
    for _ in range(3):
        fn()
    sync()
    samples = []
    for _ in range(repeat):
        start = timeit.default_timer()
        for _ in range(number):
            fn()
        sync()
        samples.append((timeit.default_timer() - start) / number * 1e6)
    return statistics.median(samples)


#: Dependent adds in the chain case; its figure is per add.
CHAIN = 100
CHAIN_CASE = f"chain ×{CHAIN} adds, /add"


def cases(device: torch.device | str) -> dict[str, tuple[Callable[[], object], int]]:
    """name -> (callable, relative iteration weight)."""
    torch.manual_seed(0)
    small_a, small_b = torch.randn(16).to(device), torch.randn(16).to(device)
    mat_a, mat_b = torch.randn(64, 64).to(device), torch.randn(64, 64).to(device)
    acc = torch.zeros(16).to(device)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32).to(device), torch.randint(0, 10, (16,)).to(device)
    batch = torch.randn(16, 32)
    table, rows = torch.randn(64, 16).to(device), torch.randint(0, 64, (8,)).to(device)
    updates, columns = torch.randn(8, 16).to(device), torch.randint(0, 16, (64, 4)).to(device)
    dividends, divisors = torch.randint(-99, 99, (16,)).to(device), torch.randint(1, 9, (16,)).to(device)

    def train_step() -> None:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    def chain() -> object:
        y = small_a
        for _ in range(CHAIN):
            y = y + small_b
        return y

    def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn()

        return run

    return {
        "add (16,)": (no_grad(lambda: small_a + small_b), 1),
        CHAIN_CASE: (no_grad(chain), CHAIN),
        "matmul 64x64": (no_grad(lambda: mat_a @ mat_b), 1),
        "add_ in place (16,)": (no_grad(lambda: acc.add_(small_a)), 1),
        # A batch from the host; on the CPU, copy=True makes the same copy.
        "to device (16, 32)": (lambda: batch.to(device, copy=True), 1),
        "rows x[idx] (64, 16)": (no_grad(lambda: table[rows]), 1),
        "x[idx] = v (64, 16)": (no_grad(lambda: table.index_put_((rows,), updates)), 1),
        "embedding (64, 16)": (no_grad(lambda: nn.functional.embedding(rows, table)), 1),
        "gather (64, 16)": (no_grad(lambda: table.gather(1, columns)), 1),
        "int // (16,)": (no_grad(lambda: dividends // divisors), 1),
        "MLP training step": (train_step, 20),
    }


def measure(device: torch.device | str, sync: Callable[[], None], number: int, repeat: int,
            table: dict[str, tuple[Callable[[], object], int]] | None = None) -> dict[str, float]:
    """Median µs per call of each case (``table``, default :func:`cases` on ``device``)."""
    table = cases(device) if table is None else table
    figures = {name: per_call_us(fn, sync, max(number // weight, 5), repeat) for name, (fn, weight) in table.items()}
    if CHAIN_CASE in figures:
        figures[CHAIN_CASE] /= CHAIN
    return figures


def torchax_figures(number: int, repeat: int) -> dict[str, float] | str:
    """The same cases on torchax, in a subprocess (torchax claims PrivateUse1 when imported)."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", ACCELKIT_AUTOLOAD="0")
    script = Path(__file__).with_name("_torchax_peer.py")
    done = subprocess.run([sys.executable, str(script), str(number), str(repeat)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"torchax not measured: {last}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="ref")
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-torchax", action="store_true", help="skip the torchax comparison")
    args = parser.parse_args()

    import accelkit

    # The CPU baseline runs on one thread: these ops are too small to split across threads,
    # and threaded kernels swing by an order of magnitude with the machine's load.
    torch.set_num_threads(1)
    device = accelkit.select_device(args.device)
    module = torch.get_device_module(device.type) if device.type != "cpu" else None
    sync_device = module.synchronize if module is not None and hasattr(module, "synchronize") else (lambda: None)
    cpu = measure("cpu", lambda: None, args.number, args.repeat)
    dev = measure(device, sync_device, args.number, args.repeat)
    peer = None if args.no_torchax or device.type != "tpu" else torchax_figures(args.number, args.repeat)

    print(f"torch {torch.__version__}, device {device}, median µs per call of {args.repeat} repeats, "
          f"CPU baseline on 1 thread, load average {os.getloadavg()[0]:.1f}")
    header = f"{'case':<22}{'cpu µs':>10}{str(device) + ' µs':>12}{'ratio':>8}"
    if isinstance(peer, dict):
        header += f"{'torchax µs':>12}{'ratio':>8}"
    print(header)
    for name in cpu:
        line = f"{name:<22}{cpu[name]:>10.2f}{dev[name]:>12.2f}{dev[name] / cpu[name]:>7.1f}×"
        if isinstance(peer, dict):
            theirs = peer["torchax"][name]
            line += f"{theirs:>12.2f}{theirs / peer['cpu'][name]:>7.1f}×"
        print(line)
    if isinstance(peer, dict):
        print("torchax ratios are against the CPU measured in torchax's own process (same machine, same run)")
        if peer.get("note"):
            print(peer["note"])
    elif isinstance(peer, str):
        print(peer)
    if device.type != "cpu":
        print(f"a small op against the CPU: add (16,) {dev['add (16,)'] / cpu['add (16,)']:.1f}× "
              f"(issue 40's target for strict: ≤ 4×); in a long chain {dev[CHAIN_CASE]:.2f} µs per add")
        stats = accelkit.stats()
        print(f"paths taken on {device.type}: {stats['totals']}")
        if "tpu" in stats:
            estimate = stats["tpu"]["estimate"]
            print(f"estimated {estimate['target']} device time for all of the above: "
                  f"{estimate['estimated_seconds'] * 1e3:.3f} ms (roofline estimate, not a measurement)")


if __name__ == "__main__":
    main()
