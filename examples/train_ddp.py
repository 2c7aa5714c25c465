"""Data-parallel training with PyTorch's DDP on an accelkit device, launched by torchrun.

    ACCELKIT_DEVICE=tpu torchrun --nproc-per-node 2 examples/train_ddp.py
    ACCELKIT_DEVICE=neuron torchrun --nproc-per-node 2 examples/train_ddp.py

Each rank trains on its slice of every batch; DDP averages the gradients, so the loss of the
whole batch (the mean over the ranks) equals a single process's full-batch run, which rank 0
computes on the CPU and prints next to it. The script is plain PyTorch: the only accelkit line
is ``select_device()``, and ``init_process_group`` takes the device's name as its backend.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import accelkit

STEPS, BATCH = 8, 32


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def make_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(16, 4, generator=generator)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 16, generator=generator)
        batches.append((x, (x @ teacher).argmax(dim=1)))
    return batches


def train(model: nn.Module, device: torch.device, rank: int = 0, world: int = 1) -> list[torch.Tensor]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = BATCH // world
    losses = []
    for x, y in make_batches():
        x, y = x[rank * rows:(rank + 1) * rows].to(device), y[rank * rows:(rank + 1) * rows].to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def main() -> None:
    device = accelkit.select_device()
    dist.init_process_group(device.type)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_model().to(device))
    losses = torch.stack(train(model, device, rank, world))
    dist.all_reduce(losses, op=dist.ReduceOp.AVG)  # the full batch's loss per step
    if rank == 0:
        reference = train(make_model(), torch.device("cpu"))
        print(f"{world} ranks on {device.type} ({torch.get_device_module(device.type).get_device_name()})")
        print("step  loss (DDP)  loss (1 process, CPU)")
        for step, (ours, cpu) in enumerate(zip(losses.cpu().tolist(), reference)):
            print(f"{step:4d}  {ours:10.6f}  {float(cpu):10.6f}")
        gap = max(abs(a - float(b)) for a, b in zip(losses.cpu().tolist(), reference))
        print(f"largest difference: {gap:.2e}")
        collectives = accelkit.stats()["distributed"]["collectives"]["all_reduce"]
        print(f"all_reduce: {collectives['calls']} calls, {collectives['bytes']} bytes, "
              f"estimated {collectives['estimated_seconds'] * 1e6:.1f} us on the target's interconnect "
              "(an estimate; here the bytes travel host-staged through gloo)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
