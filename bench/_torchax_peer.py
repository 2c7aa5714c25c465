"""Runs bench_ops' cases on torchax and prints them as JSON (called by bench_ops.py)."""

import json
import sys

import torch
import torchax

from bench_ops import measure

number, repeat = int(sys.argv[1]), int(sys.argv[2])
cpu = measure("cpu", lambda: None, number, repeat)
env = torchax.default_env()
with env:
    def sync() -> None:
        probe = torch.zeros(1, device="jax") + 0
        probe.cpu()

    figures = measure("jax", sync, number, repeat)
print(json.dumps({"cpu": cpu, "torchax": figures}))
