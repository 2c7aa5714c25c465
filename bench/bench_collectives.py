"""Collectives on accelkit device tensors against gloo on CPU tensors, and a DDP step at 1 and 2
ranks, in one run.

Two ranks on 127.0.0.1 (fresh processes with torchrun's environment). Per size from 4 KiB to
64 MiB, each rank times ``all_reduce`` (SUM, float32) on device tensors through the device's
process group (``init_process_group("<device>")``: agreement check, host staging, gloo) and on
CPU tensors through a plain gloo group of the same ranks: the baseline, same run, same
transport. The device's group is timed three ways: as created by default (the agreement check
over the group's own connections), with ``ACCELKIT_COLLECTIVE_CHECKS=gloo`` (the check through
gloo) and ``=off`` (no check). A sample is a burst of back-to-back calls after a barrier (calls in
step, as DDP's gradient buckets are), divided by its length. Every round times the four in
turns, so the machine's noise falls on all of them alike; a ratio is the median over the rounds
of the round's ratio, with a 95% interval for that median. Gloo alone on this kind of machine
(2 shared cores, loopback) varies by up to 10x from one burst to the next, so a ratio from a
few rounds is a coin toss: read the interval. Then one DDP training step of an MLP (batch 64, 256→1024→1024→10), at 1 rank
(no DDP) and at 2 ranks. Prints JSON from rank 0, then ratio lines.

    python bench/bench_collectives.py [--device tpu] [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

SIZES_KIB = (4, 64, 1024, 4096, 16384, 65536)
#: What is timed, in this order: the device group by default (checks over its sockets), with
#: ACCELKIT_COLLECTIVE_CHECKS=gloo and =off, and the baseline, gloo on CPU tensors.
VARIANTS = ("device", "device_gloo_check", "device_unchecked", "gloo_cpu")


def timed(fn, repeat: int, barrier) -> float:
    return statistics.median(interleaved([fn], repeat, barrier)[0])


def interleaved(fns, repeat: int, barrier, burst: int = 1) -> list[list[float]]:
    """Seconds per call of each of ``fns``, one sample per round: every round times each of
    them once, in turns (round ``r`` starts with ``fns[r % len(fns)]``), so a noisy moment of a
    shared machine falls on all of them alike and no variant always goes first. A sample is
    ``burst`` calls in a row after a barrier."""
    for fn in fns:
        fn()
        fn()
    samples = [[] for _ in fns]
    for round_ in range(repeat):
        for i in range(len(fns)):
            which = (round_ + i) % len(fns)
            barrier()
            start = time.perf_counter()
            for _ in range(burst):
                fns[which]()
            samples[which].append((time.perf_counter() - start) / burst)
    return samples


def paired_ratio(samples: list[float], baseline: list[float]) -> dict:
    """The median of the per-round ratios ``samples[r] / baseline[r]`` and a 95% interval for
    it that assumes no distribution (order statistics: the ranks ``j`` and ``n - j + 1`` with
    P(Binomial(n, 1/2) < j) <= 2.5%). Rounds are the pairing: both were timed moments apart."""
    ratios = sorted(a / b for a, b in zip(samples, baseline))
    n = len(ratios)
    below, j = 0.0, 0
    while below + math.comb(n, j) / 2 ** n <= 0.025:
        below += math.comb(n, j) / 2 ** n
        j += 1
    low, high = (ratios[j - 1], ratios[n - j]) if j else (ratios[0], ratios[-1])
    return {"median": statistics.median(ratios), "low95": low, "high95": high, "rounds": n}


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import accelkit

    device = accelkit.select_device(args.device)
    world = int(os.environ["WORLD_SIZE"])
    if world > 1:
        dist.init_process_group(device.type)
        gloo = dist.new_group(backend="gloo")
        variants = {}
        for mode in ("gloo", "off"):
            os.environ["ACCELKIT_COLLECTIVE_CHECKS"] = mode
            variants[mode] = dist.new_group(backend=device.type)
        del os.environ["ACCELKIT_COLLECTIVE_CHECKS"]
        rank = dist.get_rank()
    else:
        rank = 0
    results: dict = {"device": args.device, "world_size": world}
    if world > 1:
        rows = []
        sizes = SIZES_KIB[:4] if args.quick else SIZES_KIB
        for kib in sizes:
            n = kib * 1024 // 4
            on_device, on_cpu = torch.ones(n, device=device), torch.ones(n)
            barrier = lambda: dist.barrier(group=gloo)  # noqa: E731
            burst = max(1, 8 // (1 + kib // 2048))
            repeat = max(6, args.repeat // (1 + kib // 16384))
            sync = torch.get_device_module(device.type).synchronize
            samples = dict(zip(VARIANTS, interleaved([
                lambda: (dist.all_reduce(on_device), sync()),
                lambda: (dist.all_reduce(on_device, group=variants["gloo"]), sync()),
                lambda: (dist.all_reduce(on_device, group=variants["off"]), sync()),
                lambda: dist.all_reduce(on_cpu, group=gloo),
            ], repeat, barrier, burst)))
            rows.append({"bytes": kib * 1024,
                         **{f"{name}_s": statistics.median(samples[name]) for name in VARIANTS},
                         **{f"{name}_ratio": paired_ratio(samples[name], samples["gloo_cpu"]) for name in VARIANTS[:3]}})
        results["all_reduce"] = rows
        results["estimate"] = accelkit.stats()["distributed"]["collectives"]["all_reduce"]
    results["ddp_step_s"] = ddp_step(device, world, args.repeat, (lambda: dist.barrier(group=gloo)) if world > 1 else (lambda: None))
    if rank == 0:
        print(json.dumps(results), flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def ddp_step(device, world: int, repeat: int, barrier) -> float:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
                                torch.nn.GELU(), torch.nn.Linear(1024, 10)).to(device)
    if world > 1:
        model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64 // world, 256, device=device), torch.randint(0, 10, (64 // world,), device=device)
    module = torch.get_device_module(device.type)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        module.synchronize()

    return timed(step, repeat, barrier)


def launch(args: argparse.Namespace, world: int) -> dict:
    from accelkit.sdk.testing.distributed import free_port

    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        argv = [sys.executable, __file__, "--rank-worker", "--device", args.device, "--repeat", str(args.repeat)]
        procs.append(subprocess.Popen(argv + (["--quick"] if args.quick else []), env=env,
                                      stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    return json.loads(outputs[0].strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--repeat", type=int, default=120, help="rounds per size (fewer from 16 MiB on)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        rank_main(args)
        return
    two = launch(args, 2)
    one = launch(args, 1)
    print(json.dumps({"two_ranks": two, "one_rank": one}, indent=1))
    print(f"\nall_reduce float32 on {args.device} tensors vs gloo on CPU tensors, 2 ranks (same run), per call;"
          " default = checks over the group's sockets; ACCELKIT_COLLECTIVE_CHECKS=gloo and =off:")
    print("  median ms per call (ratio to gloo on CPU: the median of the rounds' ratios [its 95% interval]):")
    for row in two["all_reduce"]:
        cells = [f"{label} {row[name + '_s'] * 1e3:7.3f} ({row[name + '_ratio']['median']:.2f}x "
                 f"[{row[name + '_ratio']['low95']:.2f}-{row[name + '_ratio']['high95']:.2f}])"
                 for label, name in (("default", "device"), ("gloo-check", "device_gloo_check"),
                                     ("off", "device_unchecked"))]
        print(f"  {row['bytes'] / 1024:>6.0f} KiB  " + "  ".join(cells) +
              f"  gloo on CPU {row['gloo_cpu_s'] * 1e3:7.3f}  ({row['device_ratio']['rounds']} rounds)")
    print(f"DDP step (batch 64 in total): 1 rank {one['ddp_step_s'] * 1e3:.2f} ms, 2 ranks "
          f"{two['ddp_step_s'] * 1e3:.2f} ms ({two['ddp_step_s'] / one['ddp_step_s']:.2f}x)")


if __name__ == "__main__":
    main()
