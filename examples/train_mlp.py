"""Train a small MLP on the device accelkit selects, next to the same run on the CPU.

    python examples/train_mlp.py                 # ACCELKIT_DEVICE, else the best device here
    python examples/train_mlp.py --device ref    # a named device or a list: "tpu,cpu"
    python examples/train_mlp.py --compile       # forward and backward through torch.compile

The two runs start from the same weights and see the same batches, so their losses should
agree to float32 rounding; the last lines show how much of the work ran natively on the device.
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
from torch import nn

import accelkit


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def make_batches(steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    teacher = torch.randn(16, 4, generator=generator)
    batches = []
    for _ in range(steps):
        x = torch.randn(batch, 16, generator=generator)
        batches.append((x, (x @ teacher).argmax(dim=1)))
    return batches


def train(model: nn.Module, device: torch.device, batches: list, compile: bool = False) -> list[float]:
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    # An accelkit device compiles with its own backend; the CPU with PyTorch's default.
    forward = torch.compile(model, backend=device.type if accelkit.active_backend() == device.type else "inductor") \
        if compile else model
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(forward(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="device name or preference list")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compile", action="store_true", help="compile the model's forward and backward")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write both runs' losses to FILE")
    args = parser.parse_args()

    print(accelkit.explain_selection(args.device))
    device = accelkit.select_device(args.device)
    batches = make_batches(args.steps, args.batch)
    model = make_model()
    accelkit.reset_stats()
    device_losses = train(copy.deepcopy(model), device, batches, compile=args.compile)
    stats = accelkit.stats()
    cpu_losses = train(model, torch.device("cpu"), batches)

    print(f"\n{'step':>4}  {str(device):>12}  {'cpu':>12}  {'|diff|':>9}")
    for step, (d, c) in enumerate(zip(device_losses, cpu_losses)):
        print(f"{step:>4}  {d:>12.6f}  {c:>12.6f}  {abs(d - c):>9.2e}")
    worst = max(abs(d - c) for d, c in zip(device_losses, cpu_losses))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "compile": args.compile, "losses": device_losses,
                       "cpu_losses": cpu_losses}, f)
    print(f"\nlargest loss difference: {worst:.2e}")
    if stats["backend"] == device.type:
        totals = stats["totals"]
        print(
            f"{device.type} op executions: {totals['native']} native, {totals['decomposed']} decomposed, "
            f"{totals['fallback']} on the CPU fallback (policy: {stats['fallback_policy']})"
        )
        fallbacks = sorted(
            ((c["fallback"], op) for op, c in stats["ops"].items() if c["fallback"]), reverse=True
        )
        if fallbacks:
            print("ran on the CPU: " + ", ".join(f"{op} ×{n}" for n, op in fallbacks[:8]))


if __name__ == "__main__":
    main()
