"""The lane's C++ front against its Python front, interleaved in one process.

    python bench/bench_lane_front.py [--blocks N]

Strict add of 16 floats (500 calls, then a synchronisation, per block) and, in fused mode, the
amortised add of a 1000-op chain on 16 floats, each through the C++ front (``_native/lane.cpp``)
and through the Python kernel it stands in for (registered over it for the block, as a process
with ``ACCELKIT_NATIVE_LANE=off`` has it), beside the CPU's add; blocks alternate, and each
figure is the median block in µs per op. Needs the native extension built. On a shared machine
compare the ratios, which come from the same minutes.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch

import accelkit
from accelkit import _runtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = accelkit.select_device("tpu")
    from accelkit_backends.tpu import execution_mode

    if _runtime._native_front() is None:
        raise SystemExit("the native lane front is not in use (extension not built, or ACCELKIT_NATIVE_LANE=off)")
    ctx, pipeline, op = _runtime.active(), _runtime._pipeline, torch.ops.aten.add.Tensor
    python_kernel = _runtime._native_kernel(ctx, pipeline, op, next(e.fn for e in ctx.kernels if e.op == op))
    a, b = torch.randn(16).to(device), torch.randn(16).to(device)
    ca, cb = torch.randn(16), torch.randn(16)
    sync = torch.tpu.synchronize

    def strict_adds() -> None:
        for _ in range(500):
            a + b
        sync()

    def cpu_adds() -> None:
        for _ in range(500):
            ca + cb

    def fused_chain() -> None:
        with execution_mode("fused"):
            x = a
            for _ in range(1000):
                x = x + b
            sync()

    cases: dict[str, tuple[Callable[[], None], int]] = {
        "strict add16": (strict_adds, 500), "CPU add16": (cpu_adds, 500), "fused chain add": (fused_chain, 1000)}
    samples: dict[tuple[str, str], list[float]] = {}
    for block in range(args.blocks + 2):
        for name, (run, ops) in cases.items():
            for front in (("native", "python") if name != "CPU add16" else ("-",)):
                library = None
                if front == "python":
                    library = torch.library.Library("aten", "IMPL")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        library.impl(op, python_kernel, "PrivateUse1")
                start = time.perf_counter()
                run()
                seconds = time.perf_counter() - start
                if library is not None:
                    library._destroy()
                if block >= 2:  # warm-up: layouts met, regions compiled
                    samples.setdefault((name, front), []).append(seconds / ops * 1e6)
    median = {key: statistics.median(values) for key, values in samples.items()}
    cpu = median[("CPU add16", "-")]
    print(f"CPU add16: {cpu:.2f} µs")
    for name in ("strict add16", "fused chain add"):
        native, python = median[(name, "native")], median[(name, "python")]
        print(f"{name}: C++ front {native:.2f} µs ({native / cpu:.2f}× CPU), Python front {python:.2f} µs "
              f"({python / cpu:.2f}× CPU); C++ / Python {native / python:.2f}")


if __name__ == "__main__":
    main()
