"""``torch.autocast("ref")``: which ops run in the low dtype, which in float32 and which at the
widest input dtype; ops outside the policy; backward; agreement with CPU autocast; GradScaler."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

LOW = [torch.bfloat16, torch.float16]


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {
        "a": r(4, 8), "b": r(8, 3), "w": r(3, 8), "bias": r(3), "A": r(2, 4, 8), "B": r(2, 8, 3),
        "C": r(2, 4, 3), "M": r(4, 3), "img": r(1, 2, 6, 6), "k": r(3, 2, 3, 3),
    }


LOWER_PRECISION_OPS = {
    "mm": lambda t: torch.mm(t["a"], t["b"]),
    "matmul": lambda t: t["a"] @ t["b"],
    "linear": lambda t: F.linear(t["a"], t["w"], t["bias"]),
    "conv2d": lambda t: F.conv2d(t["img"], t["k"]),
    "bmm": lambda t: torch.bmm(t["A"], t["B"]),
    "baddbmm": lambda t: torch.baddbmm(t["C"], t["A"], t["B"]),
    "addmm": lambda t: torch.addmm(t["M"], t["a"], t["b"]),
}


def _on(tensors, device):
    return {k: v.to(device) for k, v in tensors.items()}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", list(LOWER_PRECISION_OPS))
def test_matmul_like_ops_run_in_the_autocast_dtype(dev, name, dtype):
    t = _on(_inputs(), dev)
    with torch.autocast("ref", dtype=dtype):
        out = LOWER_PRECISION_OPS[name](t)
    assert out.device == dev
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", list(LOWER_PRECISION_OPS))
def test_matmul_like_ops_match_cpu_autocast(dev, name, dtype):
    cpu = _inputs(1)
    with torch.autocast("cpu", dtype=dtype):
        expected = LOWER_PRECISION_OPS[name](cpu)
    with torch.autocast("ref", dtype=dtype):
        got = LOWER_PRECISION_OPS[name](_on(cpu, dev))
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("name", ["mm", "linear", "addmm"])
def test_float64_inputs_are_not_lowered(dev, name):
    t = {k: v.double() for k, v in _on(_inputs(), dev).items()}
    with torch.autocast("ref", dtype=torch.bfloat16):
        assert LOWER_PRECISION_OPS[name](t).dtype == torch.float64


def test_integer_inputs_and_disabled_regions_are_left_alone(dev):
    a = torch.randn(4, 4, device=dev)
    ints = torch.arange(16, device=dev).reshape(4, 4)
    with torch.autocast("ref", dtype=torch.bfloat16):
        assert torch.equal((ints @ ints).cpu(), ints.cpu() @ ints.cpu())
        with torch.autocast("ref", enabled=False):
            assert (a @ a).dtype == torch.float32
        assert (a @ a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32  # and off again after the region


FLOAT32_OPS = {
    "sum": (lambda x, y, tgt: x.sum(), lambda x, y, tgt: x.sum()),
    "softmax": (lambda x, y, tgt: torch.softmax(x, -1), lambda x, y, tgt: torch.softmax(x, -1)),
    "log_softmax": (lambda x, y, tgt: F.log_softmax(x, -1), lambda x, y, tgt: F.log_softmax(x, -1)),
    "layer_norm": (lambda x, y, tgt: F.layer_norm(x, (8,)), lambda x, y, tgt: F.layer_norm(x, (8,))),
    "mse_loss": (lambda x, y, tgt: F.mse_loss(x, y), lambda x, y, tgt: F.mse_loss(x, y)),
    "cross_entropy": (lambda x, y, tgt: F.cross_entropy(x, tgt), lambda x, y, tgt: F.cross_entropy(x, tgt)),
}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", list(FLOAT32_OPS))
def test_reductions_and_losses_run_in_float32_even_from_low_precision_inputs(dev, name, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 8, generator=g).to(dtype)
    y = torch.randn(4, 8, generator=g).to(dtype)
    tgt = torch.tensor([0, 3, 7, 1])
    device_op, cpu_op = FLOAT32_OPS[name]
    with torch.autocast("ref", dtype=dtype):
        got = device_op(x.to(dev), y.to(dev), tgt.to(dev))
    assert got.dtype == torch.float32
    # The reference: the same op computed in float32 on the CPU from the same low-precision values.
    expected = cpu_op(x.float(), y.float(), tgt)
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("dtype", LOW)
def test_promote_ops_take_the_widest_input_dtype(dev, dtype):
    low = torch.randn(3, device=dev).to(dtype)
    full = torch.randn(3, device=dev)
    double = torch.randn(3, device=dev, dtype=torch.float64)
    with torch.autocast("ref", dtype=dtype):
        assert torch.cat([low, full]).dtype == torch.float32
        assert torch.stack([full, low]).dtype == torch.float32
        assert torch.addcmul(full, low, low).dtype == torch.float32
        assert torch.cat([low, double]).dtype == torch.float64
        assert torch.stack([low, low]).dtype == dtype
        assert torch.addcmul(low, low, low).dtype == dtype
        cat = torch.cat([low, full])
    torch.testing.assert_close(cat.cpu(), torch.cat([low.cpu().float(), full.cpu()]))


@pytest.mark.parametrize("dtype", LOW)
def test_promote_ops_agree_with_cpu_autocast(dev, dtype):
    low = torch.randn(3).to(dtype)
    full = torch.randn(3)
    double = torch.randn(3, dtype=torch.float64)
    cases = [
        lambda l, f, d: torch.cat([l, f]),
        lambda l, f, d: torch.stack([f, l]),
        lambda l, f, d: torch.addcmul(f, l, l),
        lambda l, f, d: torch.cat([l, d]),
    ]
    for case in cases:
        with torch.autocast("cpu", dtype=dtype):
            expected = case(low, full, double)
        with torch.autocast("ref", dtype=dtype):
            got = case(low.to(dev), full.to(dev), double.to(dev))
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("dtype", LOW)
def test_ops_outside_the_policy_keep_their_input_dtype(dev, dtype):
    x = torch.randn(5, device=dev)
    low = x.to(dtype)
    with torch.autocast("ref", dtype=dtype):
        assert (low + low).dtype == dtype
        assert torch.relu(low).dtype == dtype
        assert (x + x).dtype == torch.float32
        assert torch.relu(x).dtype == torch.float32
        assert torch.flip(low, [0]).dtype == dtype  # an op that runs through the CPU fallback
        added = low + 1
        relu = torch.relu(x)
    torch.testing.assert_close(added.cpu(), low.cpu() + 1)
    torch.testing.assert_close(relu.cpu(), torch.relu(x.cpu()))


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("dtype", LOW)
def test_backward_through_an_autocast_region_gives_float32_grads_like_cpu(dev, dtype):
    cpu_model = _model()
    dev_model = _model().to(dev)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 8, generator=g)
    target = torch.randint(0, 4, (6,), generator=g)

    with torch.autocast("cpu", dtype=dtype):
        cpu_out = cpu_model(x)
        cpu_loss = F.cross_entropy(cpu_out, target)
    cpu_loss.backward()

    xd = x.to(dev).requires_grad_()
    with torch.autocast("ref", dtype=dtype):
        out = dev_model(xd)
        loss = F.cross_entropy(out, target.to(dev))
    assert out.dtype == dtype
    assert loss.dtype == torch.float32
    loss.backward()

    assert xd.grad.dtype == torch.float32
    torch.testing.assert_close(loss.cpu(), cpu_loss)
    for (name, p), (_, q) in zip(dev_model.named_parameters(), cpu_model.named_parameters()):
        assert p.grad.dtype == torch.float32, name
        assert p.grad.device == dev, name
        torch.testing.assert_close(p.grad.cpu(), q.grad, msg=name)


def test_conv_backward_under_autocast_matches_cpu(dev):
    torch.manual_seed(4)
    conv_cpu = nn.Conv2d(2, 3, 3)
    conv_dev = nn.Conv2d(2, 3, 3).to(dev)
    conv_dev.load_state_dict(conv_cpu.state_dict())
    x = torch.randn(2, 2, 7, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cpu_loss = conv_cpu(x).float().pow(2).mean()
    cpu_loss.backward()
    with torch.autocast("ref", dtype=torch.bfloat16):
        loss = conv_dev(x.to(dev)).float().pow(2).mean()
    loss.backward()
    torch.testing.assert_close(loss.cpu(), cpu_loss)
    torch.testing.assert_close(conv_dev.weight.grad.cpu(), conv_cpu.weight.grad)
    torch.testing.assert_close(conv_dev.bias.grad.cpu(), conv_cpu.bias.grad)


def _scaler_run(device, steps, poison_step=None):
    """Train with GradScaler; at ``poison_step`` a gradient is set to inf. Returns the history."""
    model = _model(5).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device.type if isinstance(device, torch.device) else device,
                                  init_scale=2.0**10, growth_interval=2)
    g = torch.Generator().manual_seed(6)
    history = []
    for step in range(steps):
        x = torch.randn(6, 8, generator=g).to(device)
        target = torch.randint(0, 4, (6,), generator=g).to(device)
        opt.zero_grad()
        with torch.autocast(torch.device(device).type, dtype=torch.float16):
            loss = F.cross_entropy(model(x), target)
        scaled = scaler.scale(loss)
        scaled.backward()
        if step == poison_step:
            model[0].weight.grad[0, 0] = float("inf")
        before = model[0].weight.detach().cpu().clone()
        scaler.step(opt)
        scaler.update()
        after = model[0].weight.detach().cpu()
        history.append({
            "loss": loss.detach().cpu(),
            "scaled": scaled.detach().cpu(),
            "scale": scaler.get_scale(),
            "stepped": not torch.equal(before, after),
            "weight": after.clone(),
        })
    return history


def test_grad_scaler_scales_steps_and_grows_like_on_cpu(dev):
    got = _scaler_run(dev, steps=4)
    expected = _scaler_run("cpu", steps=4)
    for step, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g["scaled"], g["loss"] * 2.0**10 * 2 ** (step // 2), msg=f"step {step}")
        assert g["stepped"]
        assert g["scale"] == e["scale"], step
        torch.testing.assert_close(g["loss"], e["loss"])
        torch.testing.assert_close(g["weight"], e["weight"])
    assert [g["scale"] for g in got] == [2.0**10, 2.0**11, 2.0**11, 2.0**12]


def test_grad_scaler_skips_the_step_and_backs_off_on_inf_grads(dev):
    got = _scaler_run(dev, steps=3, poison_step=1)
    expected = _scaler_run("cpu", steps=3, poison_step=1)
    assert [g["stepped"] for g in got] == [True, False, True]
    assert [g["scale"] for g in got] == [e["scale"] for e in expected]
    assert got[1]["scale"] == got[0]["scale"] / 2
    torch.testing.assert_close(got[1]["weight"], got[0]["weight"])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g["weight"], e["weight"])
