"""Training on the device under test matches the same training on the CPU.

Models are built from one seed on the CPU and copied to each device, so both runs start from
identical weights and data (whole training runs: :mod:`accelkit.sdk.testing.parity`).
Tolerances: ref computes with CPU kernels, but some ops take another route on ref
(cross-entropy and optimizer updates are partly decomposed, and optimizers use their
``foreach`` implementation on an accelerator where the CPU uses the single-tensor loop), so
float32 results may differ in the last bits. Observed differences are below 3e-7 after eight
steps; the tests allow ``rtol=1e-5, atol=1e-6`` — tight enough that one wrong or skipped
update (a step of size ``lr * grad``, about 1e-3 here) fails.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from accelkit.sdk.testing.parity import assert_training_parity

RTOL, ATOL = 1e-5, 1e-6


def close(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)


def on_cpu(tensors) -> list[torch.Tensor]:
    return [t.detach().cpu() for t in tensors]


def batch(*shape: int, classes: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen), torch.randint(0, classes, (shape[0],), generator=gen)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 5),
    )


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "sgd_nesterov_weight_decay": lambda params: torch.optim.SGD(
        params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2
    ),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "adamw_amsgrad": lambda params: torch.optim.AdamW(params, lr=1e-2, amsgrad=True),
    # The fused steps (one _fused_*_ op per step, on the CPU too).
    "sgd_fused_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True),
    "adam_fused": lambda params: torch.optim.Adam(params, lr=1e-2, fused=True),
    "adamw_fused_amsgrad_weight_decay": lambda params: torch.optim.AdamW(
        params, lr=1e-2, amsgrad=True, weight_decay=1e-2, fused=True
    ),
    "adagrad_fused": lambda params: torch.optim.Adagrad(params, lr=1e-1, lr_decay=1e-2, fused=True),
}


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_mlp_training_matches_cpu_losses_parameters_and_optimizer_state(dev, make_optimizer):
    model = mlp()
    x, y = batch(32, 8, classes=4)
    result = assert_training_parity(model, [(x, y)] * 8, dev, make_optimizer, rtol=RTOL, atol=ATOL,
                                    compare_optimizer_state=True)
    expected, actual = result.reference, result.device
    assert len(actual.optimizer_state) == len(expected.optimizer_state) > 0
    # The runs trained: the loss fell and the weights moved away from the start.
    assert expected.losses[-1] < expected.losses[0] - 0.05
    assert not torch.allclose(actual.state["0.weight"], model.state_dict()["0.weight"])


def test_cnn_forward_and_backward_match_cpu(dev):
    model = cnn()
    x, y = batch(6, 3, 8, 8, classes=5)
    results = {}
    for device in ("cpu", dev):
        m = copy.deepcopy(model).to(device)
        inputs = x.to(device, copy=True).requires_grad_()
        logits = m(inputs)
        loss = nn.functional.cross_entropy(logits, y.to(device))
        loss.backward()
        results[str(device)] = {
            "logits": logits.detach().cpu(),
            "loss": loss.detach().cpu(),
            "input_grad": inputs.grad.cpu(),
            "grads": {n: p.grad.cpu() for n, p in m.named_parameters()},
            # BatchNorm updated its running statistics (buffers) during the forward.
            "buffers": {n: b.cpu() for n, b in m.named_buffers()},
        }
    expected, actual = results["cpu"], results[str(dev)]
    close(actual["logits"], expected["logits"])
    close(actual["loss"], expected["loss"])
    close(actual["input_grad"], expected["input_grad"])
    assert actual["grads"].keys() == expected["grads"].keys()
    for name, grad in expected["grads"].items():
        assert grad.abs().sum() > 0, name
        close(actual["grads"][name], grad)
    for name, buffer in expected["buffers"].items():
        close(actual["buffers"][name], buffer)
    assert int(actual["buffers"]["1.num_batches_tracked"]) == 1
    assert not torch.equal(actual["buffers"]["1.running_mean"], torch.zeros(8))


def test_cnn_training_steps_and_eval_output_match_cpu(dev):
    x, y = batch(6, 3, 8, 8, classes=5)
    # Compares the losses, the state (with batch norm's running statistics) and the eval-mode
    # output, which normalises with the running statistics the training accumulated.
    result = assert_training_parity(cnn(), [(x, y)] * 4, dev, OPTIMIZERS["sgd_momentum"], rtol=RTOL, atol=ATOL)
    assert int(result.device.state["1.num_batches_tracked"]) == 4


# -- gradient clipping ------------------------------------------------------------------------


@pytest.mark.parametrize("foreach", [None, False], ids=["foreach_default", "foreach_off"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")], ids=["l2", "l1", "inf"])
def test_clip_grad_norm_matches_cpu(dev, norm_type, foreach):
    model = mlp()
    x, _ = batch(5, 8, classes=4)
    max_norm = 0.5
    results = []
    for device in ("cpu", dev):
        m = copy.deepcopy(model).to(device)
        m(x.to(device)).pow(2).sum().backward()
        total = nn.utils.clip_grad_norm_(m.parameters(), max_norm, norm_type=norm_type, foreach=foreach)
        assert total.device == torch.device(device)
        grads = on_cpu(p.grad for p in m.parameters())
        results.append((total.cpu(), grads))
    (total_cpu, grads_cpu), (total_dev, grads_dev) = results
    close(total_dev, total_cpu)
    assert total_cpu > max_norm  # clipping really happened
    for a, e in zip(grads_dev, grads_cpu):
        close(a, e)
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads_dev]), norm_type)
    torch.testing.assert_close(clipped, torch.tensor(max_norm), rtol=1e-4, atol=0)


def test_clip_grad_norm_rejects_non_finite_gradients_like_cpu(dev):
    errors = []
    for device in ("cpu", dev):
        p = nn.Parameter(torch.ones(3, device=device))
        p.grad = torch.tensor([1.0, float("inf"), 2.0], device=device)
        with pytest.raises(RuntimeError, match="non-finite") as caught:
            nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
        errors.append(str(caught.value))
    assert errors[1] == errors[0]


# -- activation checkpointing -----------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(8, 32), nn.Tanh(), nn.Dropout(dropout), nn.Linear(32, 16), nn.ReLU()
        )
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, use_checkpoint: bool, use_reentrant: bool) -> torch.Tensor:
        if use_checkpoint:
            h = checkpoint(self.body, x, use_reentrant=use_reentrant)
        else:
            h = self.body(x)
        return self.head(h)


def _block_grads(block: Block, device, use_checkpoint: bool, use_reentrant: bool, seed: int = 5):
    block = copy.deepcopy(block).to(device)
    x = batch(4, 8, classes=1)[0].to(device).requires_grad_()
    torch.manual_seed(seed)
    out = block(x, use_checkpoint, use_reentrant)
    out.sum().backward()
    return [out.detach().cpu(), x.grad.cpu()] + on_cpu(p.grad for p in block.parameters())


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpointed_gradients_match_cpu(dev, use_reentrant):
    torch.manual_seed(0)
    block = Block()
    expected = _block_grads(block, "cpu", use_checkpoint=False, use_reentrant=use_reentrant)
    actual = _block_grads(block, dev, use_checkpoint=True, use_reentrant=use_reentrant)
    for a, e in zip(actual, expected):
        close(a, e)


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpoint_recomputes_with_the_forward_dropout_mask(dev, use_reentrant):
    """The recomputation restores the device RNG state, so dropout drops the same units."""
    torch.manual_seed(0)
    block = Block(dropout=0.5)
    plain = _block_grads(block, dev, use_checkpoint=False, use_reentrant=use_reentrant)
    checkpointed = _block_grads(block, dev, use_checkpoint=True, use_reentrant=use_reentrant)
    for a, e in zip(checkpointed, plain):
        close(a, e)
    # Dropout was active: a different seed gives a different output.
    other = _block_grads(block, dev, use_checkpoint=False, use_reentrant=use_reentrant, seed=6)
    assert not torch.allclose(other[0], plain[0])


def test_grad_scaler_skips_overflowing_steps_and_moves_its_scale_as_on_cpu(dev):
    # Code ported from CUDA scales fp16 losses with torch.amp.GradScaler: a step whose gradients
    # overflow is skipped and the scale backs off; growth_interval clean steps double it.
    cpu_model = mlp()
    device_model = copy.deepcopy(cpu_model).to(dev)
    x, y = batch(16, 8, classes=4)
    runs = {}
    for device, model, (inputs, labels) in (("cpu", cpu_model, (x, y)), (dev.type, device_model, (x.to(dev), y.to(dev)))):
        scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scales, skipped = [], []
        for step in range(6):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), labels)
            if step == 2:
                loss = loss * float("inf")  # every gradient overflows
            before = [p.detach().cpu().clone() for p in model.parameters()]
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scales.append(scaler.get_scale())
            skipped.append(all(torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters())))
        runs[device] = scales, skipped, on_cpu(model.parameters())
    cpu_scales, cpu_skipped, cpu_params = runs["cpu"]
    scales, skipped, params = runs[dev.type]
    assert cpu_skipped == [False, False, True, False, False, False]
    assert skipped == cpu_skipped
    assert scales == cpu_scales == [2.0**10, 2.0**11, 2.0**10, 2.0**10, 2.0**11, 2.0**11]
    for got, want in zip(params, cpu_params):
        close(got, want)


def test_group_norm_of_a_channels_last_input_matches_cpu(dev):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 3, 3, generator=gen).to(memory_format=torch.channels_last).requires_grad_()
    weight, bias = torch.randn(4, generator=gen, requires_grad=True), torch.randn(4, generator=gen, requires_grad=True)
    x_dev, weight_dev, bias_dev = (t.detach().to(dev).requires_grad_() for t in (x, weight, bias))
    assert x_dev.is_contiguous(memory_format=torch.channels_last)
    want = nn.functional.group_norm(x, 2, weight, bias)
    got = nn.functional.group_norm(x_dev, 2, weight_dev, bias_dev)
    close(got.cpu(), want)
    grad = torch.randn(want.shape, generator=gen)
    want.backward(grad)
    got.backward(grad.to(dev))
    for device_leaf, cpu_leaf in ((x_dev, x), (weight_dev, weight), (bias_dev, bias)):
        close(device_leaf.grad.cpu(), cpu_leaf.grad)


def test_vander_differentiates_where_the_cpu_does_and_fails_where_it_fails(dev):
    # torch.linalg.vander differentiates; in torch 2.13 torch.vander's composite overwrites the
    # slice its cumprod saved, so its backward raises on the CPU, and must raise alike here.
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x_dev = x.detach().to(dev).requires_grad_()
    torch.linalg.vander(x).square().sum().backward()
    torch.linalg.vander(x_dev).square().sum().backward()
    close(x_dev.grad.cpu(), x.grad)
    for t in (x, x_dev):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.vander(t).sum().backward()
