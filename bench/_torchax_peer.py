"""Runs bench_ops' cases on torchax and prints them as JSON (called by bench_ops.py).

torchax records no autograd graph for its tensors (it intercepts ops above the autograd
engine), so ``loss.backward()`` has nothing to differentiate. Its training step is therefore
written the way torchax documents it: the module's weights as a pytree
(:class:`torchax.interop.JittableModule`), gradients from
:func:`torchax.interop.jax_value_and_grad`, and the same plain SGD update (lr 0.01) as torch
ops. Nothing is jitted, so every op dispatches on its own, as in the other columns.
"""

import json
import sys

import jax
import torch
import torchax
from torch import nn
from torchax import interop

from bench_ops import cases, measure


class TrainingStep:
    """One forward, backward and SGD step of bench_ops' MLP on torchax (same shapes)."""

    def __init__(self, env: torchax.tensor.Environment):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        self.env = env
        self.module = interop.JittableModule(env.to_xla(model))
        self.x, self.y = env.to_xla((x, y))
        self.weights = dict(self.module.params)
        self.value_and_grad = interop.jax_value_and_grad(self._loss)

    def _loss(self, weights, x, y):
        with self.env:
            out = self.module.functional_call("forward", weights, self.module.buffers, x)
            return nn.functional.cross_entropy(out, y)

    def __call__(self) -> None:
        _, grads = self.value_and_grad(self.weights, self.x, self.y)
        with self.env:
            self.weights = {k: w - 0.01 * grads[k] for k, w in self.weights.items()}

    def wait(self) -> None:
        jax.block_until_ready(interop.jax_view(self.weights))


number, repeat = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)  # the same single-threaded CPU baseline as bench_ops
cpu = measure("cpu", lambda: None, number, repeat)
env = torchax.default_env()
with env:
    step = TrainingStep(env)

    def sync() -> None:
        probe = torch.zeros(1, device="jax") + 0
        probe.cpu()
        step.wait()

    table = cases("jax")
    table["MLP training step"] = (step, table["MLP training step"][1])
    figures = measure("jax", sync, number, repeat, table)
NOTE = ("torchax MLP step: gradients from torchax.interop.jax_value_and_grad, run op by op (not "
        "jitted); torchax tensors record no autograd graph for loss.backward()")
print(json.dumps({"cpu": cpu, "torchax": figures, "note": NOTE}))
