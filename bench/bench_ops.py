"""Per-op cost on an accelkit device against native CPU torch, measured in the same run.

    python bench/bench_ops.py                 # ref (the default), or --device tpu / neuron

Prints microseconds per call (median of several repeats) for a small elementwise add, a 64×64
matmul and a chain of in-place updates, and the ratio to the same op on the CPU. Figures are
wall-clock on this machine; compare ratios, not absolute numbers, across machines.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable

import torch

import accelkit


def per_call_us(fn: Callable[[], object], sync: Callable[[], None], number: int, repeat: int) -> float:
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


def cases(device: torch.device) -> dict[str, Callable[[], object]]:
    small_a, small_b = torch.randn(16, device=device), torch.randn(16, device=device)
    mat_a, mat_b = torch.randn(64, 64, device=device), torch.randn(64, 64, device=device)
    acc = torch.zeros(16, device=device)
    return {
        "add (16,)": lambda: small_a + small_b,
        "matmul 64x64": lambda: mat_a @ mat_b,
        "add_ in place (16,)": lambda: acc.add_(small_a),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="ref")
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    device = accelkit.select_device(args.device)
    module = torch.get_device_module(device.type) if device.type != "cpu" else None
    sync_device = module.synchronize if module is not None and hasattr(module, "synchronize") else (lambda: None)
    with torch.no_grad():
        cpu = {name: per_call_us(fn, lambda: None, args.number, args.repeat) for name, fn in cases(torch.device("cpu")).items()}
        dev = {name: per_call_us(fn, sync_device, args.number, args.repeat) for name, fn in cases(device).items()}

    print(f"torch {torch.__version__}, device {device}, {args.repeat}×{args.number} calls, median µs per call")
    print(f"{'op':<22}{'cpu µs':>10}{str(device) + ' µs':>12}{'ratio':>8}")
    for name in cpu:
        print(f"{name:<22}{cpu[name]:>10.2f}{dev[name]:>12.2f}{dev[name] / cpu[name]:>7.1f}×")
    if device.type != "cpu":
        totals = accelkit.stats()["totals"]
        print(f"paths taken on {device.type}: {totals}")


if __name__ == "__main__":
    main()
