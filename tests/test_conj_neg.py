"""Conjugate and negative views (``is_conj()``/``is_neg()``) on the ref device.

Such a view stores its base's elements and reads them conjugated or negated. Every copy and
every op that PyTorch lets see the view unresolved (``copy_``, ``mm``, ``addmm``, the CPU
fallback of ``linalg_solve_triangular``) must use the values, as CPU torch does.
"""

from __future__ import annotations

import pytest
import torch

aten = torch.ops.aten


def complex_values() -> torch.Tensor:
    real = torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5
    return torch.complex(real, real.flip(0) / 3 + 0.5)


def assert_values(device_result: torch.Tensor, cpu_result: torch.Tensor) -> None:
    assert device_result.device.type == "ref"
    assert device_result.is_conj() == cpu_result.is_conj()
    assert device_result.is_neg() == cpu_result.is_neg()
    torch.testing.assert_close(device_result.cpu(), cpu_result, rtol=1e-6, atol=1e-6)


MATH_VIEWS = {
    "conj": torch.conj,
    "neg_view": torch._neg_view,
    "conj_of_neg_view": lambda t: torch._neg_view(t).conj(),
    "adjoint": lambda t: t.mH,
}


@pytest.mark.parametrize("view", MATH_VIEWS.values(), ids=MATH_VIEWS.keys())
def test_device_to_host_copy_of_a_math_view_gives_its_values(dev, view):
    x = complex_values()
    assert torch.equal(view(x.to(dev)).cpu(), view(x).resolve_conj().resolve_neg())


def test_neg_view_of_a_real_tensor_copies_negated(dev):
    x = torch.arange(6, dtype=torch.float32) - 2
    assert torch.equal(torch._neg_view(x.to(dev)).cpu(), -x)


@pytest.mark.parametrize("view", MATH_VIEWS.values(), ids=MATH_VIEWS.keys())
def test_host_to_device_copy_of_a_math_view_gives_its_values(dev, view):
    x = complex_values()
    assert_values(view(x).to(dev), view(x).resolve_conj().resolve_neg())


@pytest.mark.parametrize("view", MATH_VIEWS.values(), ids=MATH_VIEWS.keys())
def test_device_to_device_copy_from_a_math_view_gives_its_values(dev, view):
    x = complex_values()
    expected = view(x).resolve_conj().resolve_neg()
    dst = torch.zeros(expected.shape, dtype=x.dtype, device=dev)
    dst.copy_(view(x.to(dev)))
    assert_values(dst, expected)
    assert_values(view(x.to(dev)).clone(), view(x).clone())


@pytest.mark.parametrize("view", MATH_VIEWS.values(), ids=MATH_VIEWS.keys())
@pytest.mark.parametrize("source", ["device", "host"])
def test_copy_into_a_math_view_stores_what_the_cpu_stores(dev, view, source):
    x = complex_values()
    values = view(x * 2j).resolve_conj().resolve_neg()  # the view's shape, no bits
    base_cpu = torch.zeros_like(x)
    view(base_cpu).copy_(values)
    base_dev = torch.zeros_like(x, device=dev)
    view(base_dev).copy_(values.to(dev) if source == "device" else values)
    assert torch.equal(base_dev.cpu(), base_cpu)


def test_copy_between_two_conj_views_keeps_the_stored_elements(dev):
    x = complex_values()
    cpu = torch.zeros_like(x)
    cpu.conj().copy_(x.conj())
    device = torch.zeros_like(x, device=dev)
    device.conj().copy_(x.to(dev).conj())
    assert torch.equal(device.cpu(), cpu)
    assert torch.equal(cpu, x)


def test_copy_from_a_conj_view_into_a_host_tensor(dev):
    x = complex_values()
    host = torch.zeros_like(x)
    host.copy_(x.to(dev).conj())
    assert torch.equal(host, x.conj().resolve_conj())
    host.conj().copy_(x.to(dev))
    assert torch.equal(host, x.conj().resolve_conj())


def test_item_of_a_conj_view(dev):
    x = complex_values()
    assert x.to(dev).conj()[1, 2].item() == x.conj()[1, 2].item()


PROGRAMS = {
    "mm_conj_left": lambda a, b: a.conj() @ b,
    "mm_neg_right": lambda a, b: a @ torch._neg_view(b),
    "mm_adjoint": lambda a, b: a.mH @ b,
    "bmm_conj": lambda a, b: torch.bmm(a.conj()[None], b[None]),
    "addmm_both_conj": lambda a, b: torch.addmm(b, a.conj(), b.conj()),
    "addmm_conj_bias": lambda a, b: torch.addmm(b.conj(), a, b),
    "mm_out_conj_view": lambda a, b: torch.mm(a, b, out=torch.empty_like(a).conj()).resolve_conj(),
    "addmm_inplace_conj_self": lambda a, b: b.clone().conj().addmm_(a, b).resolve_conj(),
    "dot_conj": lambda a, b: torch.dot(a[0].conj(), b[1]),
    "solve_triangular_conj": lambda a, b: torch.linalg.solve_triangular(
        a.triu().conj() + 10 * torch.eye(4, dtype=a.dtype, device=a.device), b.conj(), upper=True
    ),
}


@pytest.mark.parametrize("program", PROGRAMS.values(), ids=PROGRAMS.keys())
def test_ops_that_see_math_views_unresolved_compute_cpu_values(dev, program):
    a = complex_values()[:, :3].repeat(2, 1)[:4, :3]
    a = torch.cat([a, a[:, :1] * 1j], 1)  # 4 x 4
    b = a.flip(1) - 1j
    assert_values(program(a.to(dev), b.to(dev)), program(a, b))


def test_gradient_through_a_complex_view_matches_cpu(dev):
    x = complex_values()

    def grad(t: torch.Tensor) -> torch.Tensor:
        t = t.clone().requires_grad_()
        (torch.fft.ifft(t.conj()) * torch.polar(t.abs(), t.angle())).abs().sum().backward()
        return t.grad

    torch.testing.assert_close(grad(x.to(dev)).cpu(), grad(x))
