"""Views and aliasing on the device under test, checked against the same computation on the CPU.

A view on the device must have the CPU view's sizes, strides, offset and values, share its
base's storage and version counter, and pass in-place writes through to the base and to every
other view of it — also under autograd. Each storage has its own data pointer, as on the CPU,
and bad sizes and strides raise the CPU's errors.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accelkit.sdk.testing import device_under_test, holds, require_dtype

DEVICE = device_under_test()

# -- helpers ------------------------------------------------------------------------------------


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as bytes (CPU), so NaN payloads and dtype views compare exactly."""
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    t = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach()).reshape(-1)  # fresh strides
    if t.dtype.is_complex:
        t = torch.view_as_real(t).reshape(-1)
    return t.view(torch.uint8)


def assert_same_view(on_device: torch.Tensor, on_cpu: torch.Tensor) -> None:
    """Same geometry, dtype and bit-identical elements; the device tensor is on ref."""
    assert on_device.device == DEVICE
    assert on_device.dtype == on_cpu.dtype
    assert on_device.shape == on_cpu.shape
    assert on_device.stride() == on_cpu.stride()
    assert on_device.storage_offset() == on_cpu.storage_offset()
    assert on_device.is_contiguous() == on_cpu.is_contiguous()
    assert on_device._is_view() == on_cpu._is_view()
    assert torch.equal(raw_bytes(on_device), raw_bytes(on_cpu))


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def float_base() -> torch.Tensor:
    return torch.arange(60, dtype=torch.float32).reshape(3, 4, 5) / 4 - 3


def complex_base() -> torch.Tensor:
    real = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return torch.complex(real, -real / 2)


def pairs_base() -> torch.Tensor:
    return torch.arange(24, dtype=torch.float32).reshape(3, 4, 2) - 5


# -- view ops: geometry, values and storage -----------------------------------------------------

VIEW_CASES = {
    "transpose": (float_base, lambda x: x.transpose(0, 2)),
    "t_of_matrix": (float_base, lambda x: x[0].t()),
    "mT": (float_base, lambda x: x.mT),
    "permute": (float_base, lambda x: x.permute(2, 0, 1)),
    "movedim": (float_base, lambda x: x.movedim(0, -1)),
    "slice_with_steps": (float_base, lambda x: x[:, 1::2, ::3]),
    "slice_empty": (float_base, lambda x: x[:, 2:2]),
    "narrow": (float_base, lambda x: x.narrow(2, 1, 3)),
    "select_negative_index": (float_base, lambda x: x[:, -1]),
    "select_to_0d": (float_base, lambda x: x[2, 3, 4]),
    "index_none_and_ellipsis": (float_base, lambda x: x[None, ..., 2]),
    "diagonal": (float_base, lambda x: x.diagonal()),
    "diagonal_offset_dims": (float_base, lambda x: x.diagonal(offset=1, dim1=1, dim2=2)),
    "diagonal_negative_offset": (float_base, lambda x: x.diagonal(-1, 0, 2)),
    "unfold": (float_base, lambda x: x.unfold(2, 2, 2)),
    "unfold_overlapping_windows": (float_base, lambda x: x.unfold(1, 3, 1)),
    "expand_size_one_dim": (float_base, lambda x: x[:, :1].expand(3, 4, 5)),
    "expand_new_leading_dim": (float_base, lambda x: x.expand(2, 3, 4, 5)),
    "view": (float_base, lambda x: x.view(12, 5)),
    "view_inferred_dim": (float_base, lambda x: x.view(-1, 10)),
    "reshape_of_contiguous": (float_base, lambda x: x.reshape(4, 15)),
    "reshape_of_transposed_copies": (float_base, lambda x: x.transpose(0, 1).reshape(-1)),
    "flatten_unflatten": (float_base, lambda x: x.flatten().unflatten(0, (6, 10))),
    "squeeze_unsqueeze": (float_base, lambda x: x[:, :1].squeeze(1).unsqueeze(-1)),
    "as_strided": (float_base, lambda x: x.as_strided((4, 3), (1, 4), 2)),
    "detach": (float_base, lambda x: x.detach()),
    "dtype_view_same_size": (float_base, lambda x: x.view(torch.int32)),
    "dtype_view_smaller": (float_base, lambda x: x.view(torch.int16)),
    "dtype_view_bfloat16": (float_base, lambda x: x[1:, 2:].view(torch.bfloat16)),
    "dtype_view_larger": (float_base, lambda x: x.view(6, 10).view(torch.float64)),
    "dtype_view_bytes": (float_base, lambda x: x.view(torch.uint8)),
    "view_as_real": (complex_base, lambda c: torch.view_as_real(c)),
    "view_as_real_of_slice": (complex_base, lambda c: torch.view_as_real(c[1:, ::2])),
    "complex_real_and_imag": (complex_base, lambda c: (c.real, c.imag)),
    "view_as_complex": (pairs_base, lambda x: torch.view_as_complex(x)),
    "split": (float_base, lambda x: x.split(2, dim=1)),
    "split_with_sizes": (float_base, lambda x: x.split([1, 3, 1], dim=2)),
    "chunk": (float_base, lambda x: x.chunk(2, dim=0)),
    "tensor_split": (float_base, lambda x: x.tensor_split(3, dim=2)),
    "unbind": (float_base, lambda x: x.unbind(1)),
    "chain": (float_base, lambda x: x.transpose(0, 1)[1:, ::2].unsqueeze(0).diagonal(0, 1, 3)),
}


@pytest.mark.parametrize("case", VIEW_CASES.values(), ids=VIEW_CASES.keys())
def test_view_matches_cpu_geometry_values_and_shares_storage(dev, case):
    make_base, view = case
    base_cpu = make_base()
    require_dtype(base_cpu.dtype)
    if make_base is pairs_base:
        require_dtype(torch.complex64)
    base = base_cpu.to(dev)
    expected, actual = view(base_cpu), view(base)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_same_view(a, e)
        # A view shares its base's storage exactly when the CPU view does.
        assert shares_storage(a, base) == shares_storage(e, base_cpu)
        # ``_base`` is the original base exactly when it is on the CPU.
        assert (a._base is base) == (e._base is base_cpu)
        assert (a._base is None) == (e._base is None)


def test_base_of_a_view_of_a_view_is_the_original_base(dev):
    base = float_base().to(dev)
    view = base[0].t()[1:].unsqueeze(0).diagonal(0, 1, 2)
    assert view._base is base
    assert shares_storage(view, base)


# -- in-place writes through views --------------------------------------------------------------


def small_base() -> torch.Tensor:
    return torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])


def _assign(target: torch.Tensor, index, value) -> None:
    target[index] = value


WRITES = {
    "fill_row_of_transpose": lambda x: x.t()[0].fill_(-1),
    "mul_selected_row": lambda x: x[1].mul_(10),
    "add_column_slice": lambda x: x[:, 1:].add_(100),
    "setitem_through_view": lambda x: _assign(x.view(3, 2), (2, 1), 7),
    "sub_strided_slice": lambda x: x[:, ::2].sub_(0.5),
    "neg_diagonal": lambda x: x.diagonal().neg_(),
    "zero_split_piece": lambda x: x.split(2, dim=1)[1].zero_(),
    "copy_into_unbind_piece": lambda x: x.unbind(0)[1].copy_(torch.tensor([9.0, 8.0, 7.0])),
    "copy_device_tensor_into_view": lambda x: x[:, 1].copy_(x[:, 2]),
    "setitem_tensor_on_column": lambda x: _assign(x, (slice(None), 0), torch.tensor([4.0, 5.0])),
    "add_tensor_through_flatten": lambda x: x.view(-1)[1::2].add_(torch.arange(3.0, device=x.device)),
    "clamp_through_transpose": lambda x: x.t()[1:].clamp_(min=1.5, max=4.5),
    "div_through_unfold_nonoverlapping": lambda x: x.view(-1).unfold(0, 2, 2).div_(4),
    "masked_fill_through_view": lambda x: x.t().masked_fill_(x.t() > 2, -2),
    "index_put_through_row": lambda x: _assign(x[1], torch.tensor([0, 2]), torch.tensor([-5.0, -6.0])),
    "int32_dtype_view_write": lambda x: x.view(torch.int32)[0, 1:].fill_(0x3F800000),
    "int32_dtype_view_bitwise": lambda x: x.view(torch.int32).bitwise_xor_(1 << 31),
    "int16_dtype_view_add": lambda x: x[1].view(torch.int16).add_(7),
    "expand_of_row_fill": lambda x: x[0, :1].expand(4).fill_(3),
    "as_strided_write": lambda x: x.as_strided((2, 2), (1, 3), 1).mul_(-1),
    "mul_whole_base_seen_by_views": lambda x: x.mul_(2),
}


def _siblings(x: torch.Tensor) -> list[torch.Tensor]:
    """Views taken before a write, which must all observe it."""
    return [x.t(), x[1], x.view(3, 2), x.view(-1)[::2], x.diagonal(), x.view(torch.int32), x.unbind(1)[2]]


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_inplace_write_through_view_reaches_base_and_every_other_view(dev, write):
    base_cpu = small_base()
    base = base_cpu.to(dev)
    siblings_cpu, siblings = _siblings(base_cpu), _siblings(base)

    write(base_cpu)
    write(base)

    assert not torch.equal(base_cpu, small_base())  # the write changed something
    assert_same_view(base, base_cpu)
    for a, e in zip(siblings, siblings_cpu):
        assert_same_view(a, e)


def test_the_four_research_scenarios_in_sequence(dev):
    base_cpu = small_base()
    base = base_cpu.to(dev)
    for x in (base_cpu, base):
        x.t()[0].fill_(-1)
        x[1].mul_(10)
        x[:, 1:].add_(100)
        x.view(3, 2)[2, 1] = 7
    assert_same_view(base, base_cpu)
    # The device sequence applied every step (column 0, row 1, columns 1:, last element).
    assert base.cpu().tolist() == base_cpu.tolist()


COMPLEX_WRITES = {
    "view_as_real_imag_fill": lambda c: torch.view_as_real(c)[..., 1].fill_(5),
    "imag_mul": lambda c: c.imag.mul_(2),
    "real_of_row_add": lambda c: c[1].real.add_(0.25),
    "complex_row_mul": lambda c: c[:, 2].mul_(2 - 1j),
}


@pytest.mark.parametrize("write", COMPLEX_WRITES.values(), ids=COMPLEX_WRITES.keys())
def test_write_through_real_views_of_complex_reaches_the_complex_base(dev, write):
    base_cpu = complex_base()
    require_dtype(base_cpu.dtype)
    base = base_cpu.to(dev)
    views_cpu = [torch.view_as_real(base_cpu), base_cpu.imag, base_cpu.t()]
    views = [torch.view_as_real(base), base.imag, base.t()]
    write(base_cpu)
    write(base)
    assert_same_view(base, base_cpu)
    for a, e in zip(views, views_cpu):
        assert_same_view(a, e)


def test_write_to_overlapping_expanded_view_errors_like_cpu(dev):
    cpu = torch.zeros(3).expand(2, 3)
    with pytest.raises(RuntimeError, match="more than one element") as expected:
        cpu.add_(1)
    device = torch.zeros(3, device=dev).expand(2, 3)
    with pytest.raises(RuntimeError, match="more than one element") as actual:
        device.add_(1)
    assert str(actual.value).split(".")[0] == str(expected.value).split(".")[0]


def test_out_argument_that_is_a_view_writes_into_the_base(dev):
    base_cpu = small_base()
    base = base_cpu.to(dev)
    a_cpu = torch.tensor([1.0, 2.0, 3.0])
    torch.add(a_cpu, 10, out=base_cpu[1])
    torch.add(a_cpu.to(dev), 10, out=base[1])
    torch.mul(base_cpu[0], 3, out=base_cpu.t()[:, 0])
    torch.mul(base[0], 3, out=base.t()[:, 0])
    assert_same_view(base, base_cpu)


# -- version counter ----------------------------------------------------------------------------


def test_version_counter_is_shared_by_base_and_views_and_bumps_like_cpu(dev):
    base_cpu = small_base()
    base = base_cpu.to(dev)

    def views(x):
        return [x, x.t(), x[1], x.view(torch.int32), x.unbind(0)[0], x.diagonal()]

    steps = [
        lambda x: x[1].add_(1),  # native in-place
        lambda x: x.t()[0].fill_(2),  # native in-place through a chain
        lambda x: x.view(-1).clamp_(max=3),  # CPU fallback
        lambda x: torch.mul(x[0], 2, out=x[1]),  # out= into a view
        lambda x: x.view(3, 2).__setitem__((0, 0), 5),  # setitem
        lambda x: x.view(torch.int32).bitwise_and_(-1),  # dtype view, fallback
    ]
    held_cpu, held = views(base_cpu), views(base)
    assert {v._version for v in held} == {0}
    for step in steps:
        step(base_cpu)
        step(base)
        expected = base_cpu._version
        assert [v._version for v in held] == [v._version for v in held_cpu] == [expected] * len(held)
        # Views taken after the write start from the shared counter too.
        assert [v._version for v in views(base)] == [expected] * len(held)
    assert_same_view(base, base_cpu)


def test_detached_alias_shares_version_counter_and_memory(dev):
    results = []
    for device in ("cpu", dev):
        x = torch.ones(4, device=device, requires_grad=True)
        y = x.detach()
        y[1:].mul_(3)
        assert x._version == y._version == 1
        results.append(x.detach().cpu())
    assert torch.equal(results[1], results[0])



@pytest.mark.parametrize("numel", [16, 1 << 18])
def test_a_device_copy_shares_no_memory_with_the_host_tensor_it_came_from(dev, numel):
    host = torch.zeros(numel)
    dense, transposed, into = host.to(dev), host.view(-1, 4).t().to(dev), torch.empty(numel, device=dev)
    into.copy_(host)
    host.add_(1)
    for copy in (dense, transposed, into):
        assert copy.cpu().count_nonzero() == 0
    host_again = dense.cpu()
    host_again.add_(1)
    assert dense.cpu().count_nonzero() == 0


# -- autograd through in-place ops on views -----------------------------------------------------


def _grads(device: torch.device | str, program) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    leaves = [torch.randn(2, 3, generator=gen).to(device).requires_grad_() for _ in range(2)]
    out = program(*leaves)
    out.backward()
    return [out.detach().cpu()] + [leaf.grad.cpu() for leaf in leaves]


def _mul_row(a, b):
    x = a.clone()
    x[1].mul_(10)
    return (x * x).sum() + b.sum()


def _add_leaf_through_column_slice(a, b):
    x = a * 2
    x[:, 1:].add_(b[:, :2])
    return (x.exp() * torch.arange(6.0, device=x.device).view(2, 3)).sum()


def _fill_transposed_row(a, b):
    x = a + b
    x.t()[0].fill_(-1)
    return (x * a).sum()


def _setitem_through_view(a, b):
    x = a.clone()
    x.view(3, 2)[2] = b[0, :2] * 3
    return (x**2).mean()


def _copy_into_diagonal(a, b):
    x = torch.zeros(3, 3, device=a.device)
    x.diagonal().copy_(a[0] * b[1])
    return (x @ x.t()).sum()


def _inplace_on_base_then_use_older_view(a, b):
    x = a.clone()
    v = x[0]
    x.mul_(b)
    return (v * torch.tensor([1.0, 2.0, 3.0], device=a.device)).sum()


def _inplace_on_view_of_view(a, b):
    x = a.clone()
    x.t()[1:].unsqueeze(0)[0, 0].mul_(b[1, :2])
    return x.tanh().sum()


def _relu_inplace_on_slice(a, b):
    x = a - b
    x[:, ::2].relu_()
    return (x * b).sum()


AUTOGRAD_PROGRAMS = {
    f.__name__.lstrip("_"): f
    for f in (
        _mul_row,
        _add_leaf_through_column_slice,
        _fill_transposed_row,
        _setitem_through_view,
        _copy_into_diagonal,
        _inplace_on_base_then_use_older_view,
        _inplace_on_view_of_view,
        _relu_inplace_on_slice,
    )
}


@pytest.mark.parametrize("program", AUTOGRAD_PROGRAMS.values(), ids=AUTOGRAD_PROGRAMS.keys())
def test_autograd_through_inplace_on_views_gives_cpu_gradients(dev, program):
    expected = _grads("cpu", program)
    actual = _grads(dev, program)
    for a, e in zip(actual, expected):
        # Same CPU kernels underneath; only summation order may differ, hence float32 eps-level.
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
    # The gradient really flowed: some entries are non-zero.
    assert any(g.abs().sum() > 0 for g in expected[1:])


def test_mul_row_gradient_is_ten_times_twice_the_row(dev):
    a = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], device=dev, requires_grad=True)
    x = a.clone()
    x[1].mul_(10)
    x[1].sum().backward()
    assert a.grad.cpu().tolist() == [[0.0, 0.0, 0.0], [10.0, 10.0, 10.0]]


def test_view_taken_before_inplace_on_base_gets_the_cpu_grad_fn(dev):
    """PyTorch regenerates an older view's grad_fn after an in-place op on its base."""
    names = []
    for device in ("cpu", dev):
        a = torch.ones(2, 3, device=device, requires_grad=True)
        x = a.clone()
        v = x[1]
        x.mul_(2)
        names.append(type(v.grad_fn).__name__)
        v.sum().backward()
        assert a.grad.cpu().tolist() == [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]
    assert names[1] == names[0]


def test_fill_and_zero_of_expanded_view_are_allowed_like_cpu(dev):
    for device in ("cpu", dev):
        base = torch.arange(6.0, device=device).reshape(2, 3).clone()
        base[0, :1].expand(5).fill_(-1)
        base[1].expand(4, 3).zero_()
        assert base.cpu().tolist() == [[-1.0, 1.0, 2.0], [0.0, 0.0, 0.0]]


# -- data pointers: one address per storage, as on the CPU --------------------------------------


def _address(t: torch.Tensor) -> int:
    """Where CPU PyTorch puts a tensor's first element: its storage's address plus its offset."""
    return t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()


def test_data_ptr_is_the_storage_address_plus_the_offset_and_views_share_it(dev):
    base_cpu = float_base()
    base = base_cpu.to(dev)
    assert base.data_ptr() != 0 and base.data_ptr() == base.untyped_storage().data_ptr()
    for name, (make_base, view) in VIEW_CASES.items():
        if make_base is not float_base:
            continue
        expected, actual = view(base_cpu), view(base)
        pairs = zip(actual, expected) if isinstance(actual, tuple) else [(actual, expected)]
        for a, e in pairs:
            shared = a.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
            assert shared == shares_storage(e, base_cpu), name
            assert a.data_ptr() == (0 if a.numel() == 0 else _address(a)), name  # empty: 0, as on the CPU
            if shared and a.numel():  # the same distance from the base's first element as on the CPU
                assert a.data_ptr() - base.data_ptr() == e.data_ptr() - base_cpu.data_ptr(), name


def test_empty_tensors_and_storages_report_a_null_pointer_like_the_cpu(dev):
    for device in ("cpu", dev):
        t = torch.empty(0, 3, device=device)
        assert t.data_ptr() == 0 and t.untyped_storage().data_ptr() == 0


def test_distinct_live_storages_never_overlap(dev):
    torch.manual_seed(0)
    live = [torch.empty(int(n), device=dev) for n in torch.randint(1, 3000, (60,))]
    live += [torch.randn(7, 5, device=dev), torch.arange(100, device=dev), torch.ones(3, device=dev) + 1]
    spans = sorted((t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in live)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


INPLACE_OPS = {
    "add_": lambda t: t.add_(1),
    "mul__of_view": lambda t: (t[1:].mul_(2), t)[1],
    "copy_from_cpu": lambda t: t.copy_(torch.ones(t.shape)),
    "fill_": lambda t: t.fill_(3),
    "zero_": lambda t: t.zero_(),
    "clamp_": lambda t: t.clamp_(0, 2),
    "index_add_": lambda t: t.index_add_(0, torch.tensor([0, 2], device=t.device), torch.ones(2, 4, device=t.device)),
    "masked_fill_": lambda t: t.masked_fill_(t > 1, -1.0),
    "scatter_": lambda t: t.scatter_(1, torch.zeros(3, 1, dtype=torch.long, device=t.device), 5.0),
    "unsqueeze_": lambda t: t.unsqueeze_(0),
    "t_": lambda t: t.t_(),
    "resize__smaller": lambda t: t.resize_(2, 2),
    "set__own_storage": lambda t: t.set_(t.untyped_storage(), 1, (2, 2), (1, 2)),
    "out_of_the_right_shape": lambda t: torch.mul(torch.ones(3, 4, device=t.device), 2, out=t),
    "out_of_a_smaller_shape": pytest.param(  # resized, as on the CPU (with its deprecation warning)
        lambda t: torch.sum(torch.ones(2, 5, 2, device=t.device), 1, out=t),
        marks=pytest.mark.filterwarnings("ignore:An output with one or more elements was resized"),
    ),
}


@pytest.mark.parametrize("op", INPLACE_OPS.values(), ids=INPLACE_OPS.keys())
def test_inplace_ops_keep_the_data_pointer(dev, op):
    t = torch.arange(12.0, device=dev).reshape(3, 4)
    storage_address = t.untyped_storage().data_ptr()
    out = op(t)
    assert out is t
    assert t.untyped_storage().data_ptr() == storage_address
    assert t.data_ptr() == _address(t)


def test_a_resize_that_reallocates_moves_the_storage_and_every_tensor_on_it(dev):
    x = torch.arange(4.0, device=dev)
    view = x[1:]
    old = x.untyped_storage().data_ptr()
    x.resize_(1000)
    assert x.untyped_storage().nbytes() == 4000  # like the CPU's resize_
    assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() != old
    assert view.data_ptr() == x.data_ptr() + 4
    assert x[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0] and view[:3].cpu().tolist() == [1.0, 2.0, 3.0]


def test_set__grows_the_storage_like_the_cpu(dev):
    results = []
    for device in ("cpu", dev):
        source = torch.arange(6.0, device=device)
        storage = source.untyped_storage()
        t = torch.empty(0, device=device).set_(storage, 2, (4, 4), (4, 1))
        t[0].fill_(-1)
        assert t.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()  # one storage
        results.append((t.shape, t.stride(), t.storage_offset(), storage.nbytes(), source[:6].cpu().tolist()))
    assert results[1] == results[0]


# -- bad geometry: PyTorch's own errors -------------------------------------------------------

BAD_GEOMETRY = {
    "empty": lambda d: torch.empty((2, -1), device=d),
    "empty_int": lambda d: torch.empty(-1, device=d),
    "empty_strided": lambda d: torch.empty_strided((2, -1), (1, 1), device=d),
    "empty_strided_negative_stride": lambda d: torch.empty_strided((2, 2), (-1, 1), device=d),
    "empty_strided_rank_mismatch": lambda d: torch.empty_strided((2, 2), (1,), device=d),
    "empty_permuted": lambda d: torch.empty_permuted((2, -1), (1, 0), device=d),
    "zeros": lambda d: torch.zeros(2, -1, device=d),
    "ones": lambda d: torch.ones(2, -1, device=d),
    "full": lambda d: torch.full((2, -1), 1.0, device=d),
    "rand": lambda d: torch.rand(2, -1, device=d),
    "randn": lambda d: torch.randn(-3, device=d),
    "randint": lambda d: torch.randint(5, (2, -1), device=d),
    "randperm": lambda d: torch.randperm(-1, device=d),
    "normal": lambda d: torch.normal(0.0, 1.0, (2, -1), device=d),
    "new_empty": lambda d: torch.ones(2, device=d).new_empty((2, -1)),
    "new_empty_strided": lambda d: torch.ones(2, device=d).new_empty_strided((2, -1), (1, 1)),
    "new_zeros": lambda d: torch.ones(2, device=d).new_zeros((-2, 3)),
    "new_ones": lambda d: torch.ones(2, device=d).new_ones((2, -1)),
    "new_full": lambda d: torch.ones(2, device=d).new_full((2, -1), 3.0),
    "repeat": pytest.param(
        lambda d: torch.ones(4, device=d).repeat(-1),
        marks=pytest.mark.xfail(
            DEVICE.type == "tpu", strict=True,
            reason="tpu takes result shapes from PyTorch's Meta kernels, whose repeat check words it "
            "'Repeats cannot be negative' where the CPU reports the negative dimension",
        ),
    ),
    "resize_": lambda d: torch.ones(2, device=d).resize_(2, -1),
    "view": lambda d: torch.ones(4, device=d).view(2, -2),
    "view_two_inferred": lambda d: torch.ones(4, device=d).view(-1, -1),
    "reshape": lambda d: torch.ones(4, device=d).reshape(-2, 2),
    "reshape_of_transposed": lambda d: torch.ones(4, 2, device=d).t().reshape(-2, 4),
    "expand": lambda d: torch.ones(4, device=d).expand(-2, 4),
    "as_strided_negative_size": lambda d: torch.ones(4, device=d).as_strided((2, -1), (1, 1)),
    "as_strided_negative_size_zero_stride": lambda d: torch.ones(4, device=d).as_strided((-2, 4), (0, 1)),
    "as_strided_negative_stride": lambda d: torch.ones(4, device=d).as_strided((2, -1), (-1, 1)),
    "as_strided_negative_offset": lambda d: torch.ones(4, device=d).as_strided((2,), (1,), -1),
    "as_strided_past_the_storage": lambda d: torch.ones(4, device=d).as_strided((3,), (1,), 2),
    "as_strided_of_a_view_past_the_storage": lambda d: torch.ones(4, device=d)[1:].as_strided((3, 3), (1, 1)),
    "as_strided_0d_past_the_end": lambda d: torch.ones(4, device=d).as_strided((), (), 4),
    "narrow_negative_length": lambda d: torch.ones(4, device=d).narrow(0, 0, -1),
}


def _outcome(make, device):
    try:
        return ("ok", tuple(make(device).shape))
    except Exception as error:  # noqa: BLE001 - the exception is what is compared
        return (type(error), str(error).splitlines()[0])


@pytest.mark.parametrize("make", BAD_GEOMETRY.values(), ids=BAD_GEOMETRY.keys())
def test_bad_sizes_and_strides_raise_the_cpu_error(dev, make):
    expected = _outcome(make, "cpu")
    assert expected[0] is RuntimeError  # every case is an error on the CPU
    assert _outcome(make, dev) == expected


def test_as_strided_up_to_the_end_of_the_storage_is_allowed_like_cpu(dev):
    for make in (lambda x: x.as_strided((2,), (1,), 2), lambda x: x[1:].as_strided((2, 2), (1, 1), 1),
                 lambda x: x.as_strided((0, 3), (1, 1), 9), lambda x: x.as_strided((), (), 3)):
        assert_same_view(make(torch.arange(4.0).to(dev)), make(torch.arange(4.0)))


def test_failed_resize_leaves_the_tensor_and_its_storage_as_they_were(dev):
    # The CPU raises the same error but keeps the negative size; a failed in-place op on the
    # device changes nothing.
    x = torch.arange(4.0, device=dev)
    view = x[1:]
    with pytest.raises(RuntimeError):
        x.resize_(2, -1)
    assert x.shape == (4,) and x.untyped_storage().nbytes() == 16
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0] and view.cpu().tolist() == [1.0, 2.0, 3.0]
    x.resize_(2, 2)  # the process and the tensor keep working
    assert x.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]


# -- property: random view chains plus an in-place write ----------------------------------------


def _overlap_free(t: torch.Tensor) -> bool:
    """True when no two elements of ``t`` share a memory location."""
    if t.numel() <= 1:
        return True
    span = t.storage_offset() + 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    offsets = torch.arange(span).as_strided(t.shape, t.stride(), t.storage_offset())
    return offsets.unique().numel() == t.numel()


@st.composite
def _view_step(draw, t: torch.Tensor):
    """One view op with parameters valid for ``t`` (a CPU tensor), as (name, fn)."""
    n, shape = t.dim(), tuple(t.shape)
    choices = ["unsqueeze", "dtype"]
    if n >= 1:
        choices += ["transpose", "permute", "slice", "narrow", "split", "flatten", "reshape", "dim_split"]
        if any(s > 0 for s in shape):
            choices += ["select", "unbind"]
        choices += ["unfold", "expand"]
        if 1 in shape:
            choices.append("squeeze")
    if n >= 2:
        choices += ["diagonal", "merge_dims"]
    if t.dtype.is_complex:
        choices.append("view_as_real")
    elif t.dtype == torch.float32 and n >= 1 and shape[-1] == 2 and torch.complex64 in BASE_DTYPES:
        choices.append("view_as_complex")
    kind = draw(st.sampled_from(choices))
    dim = draw(st.integers(0, n - 1)) if n >= 1 else 0
    size = shape[dim] if n >= 1 else 1

    if kind == "unsqueeze":
        d = draw(st.integers(-n - 1, n))
        return f"unsqueeze({d})", lambda x: x.unsqueeze(d)
    if kind == "dtype":
        targets = [torch.float32, torch.int32, torch.int16, torch.uint8]
        if _computes_float64_exactly():  # a write to the view is float64 arithmetic
            targets.append(torch.float64)
        target = draw(st.sampled_from(targets))
        return f"view({target})", lambda x: x.view(target)
    if kind == "transpose":
        d2 = draw(st.integers(-n, n - 1))
        return f"transpose({dim},{d2})", lambda x: x.transpose(dim, d2)
    if kind == "permute":
        order = draw(st.permutations(range(n)))
        return f"permute({order})", lambda x: x.permute(*order)
    if kind == "slice":
        start = draw(st.integers(0, size))
        stop = draw(st.integers(start, size))
        step = draw(st.integers(1, 3))
        index = (slice(None),) * dim + (slice(start, stop, step),)
        return f"[{index}]", lambda x: x[index]
    if kind == "narrow":
        start = draw(st.integers(0, size))
        length = draw(st.integers(0, size - start))
        if start < size and draw(st.booleans()):
            start -= size  # the same position, counted from the end
        return f"narrow({dim},{start},{length})", lambda x: x.narrow(dim, start, length)
    if kind == "split":
        chunk = draw(st.integers(1, max(size, 1)))
        pieces = max(1, -(-size // chunk))
        which = draw(st.integers(0, pieces - 1))
        return f"split({chunk},{dim})[{which}]", lambda x: x.split(chunk, dim)[which]
    if kind == "flatten":
        end = draw(st.integers(dim, n - 1))
        return f"flatten({dim},{end})", lambda x: x.flatten(dim, end)
    if kind == "reshape":
        return "reshape(-1)", lambda x: x.reshape(-1)
    if kind == "dim_split":
        divisors = [k for k in range(1, size + 1) if size % k == 0] or [1]
        k = draw(st.sampled_from(divisors))
        new = shape[:dim] + (k, size // k if k else 0) + shape[dim + 1:]
        return f"view({new})", lambda x: x.view(new)
    if kind == "select":
        dim = draw(st.sampled_from([i for i, s in enumerate(shape) if s > 0]))
        index = draw(st.integers(-shape[dim], shape[dim] - 1))
        return f"select({dim},{index})", lambda x: x.select(dim, index)
    if kind == "unbind":
        dim = draw(st.sampled_from([i for i, s in enumerate(shape) if s > 0]))
        which = draw(st.integers(0, shape[dim] - 1))
        return f"unbind({dim})[{which}]", lambda x: x.unbind(dim)[which]
    if kind == "unfold":
        window = draw(st.integers(0, size))
        step = draw(st.integers(1, 3))
        return f"unfold({dim},{window},{step})", lambda x: x.unfold(dim, window, step)
    if kind == "expand":
        new_shape = tuple(draw(st.integers(0, 3)) if s == 1 else s for s in shape)
        lead = draw(st.lists(st.integers(1, 3), max_size=1))
        target = tuple(lead) + new_shape
        return f"expand({target})", lambda x: x.expand(*target)
    if kind == "squeeze":
        d = draw(st.sampled_from([i for i, s in enumerate(shape) if s == 1]))
        return f"squeeze({d})", lambda x: x.squeeze(d)
    if kind == "diagonal":
        d1, d2 = draw(st.permutations(range(n)))[:2]
        offset = draw(st.integers(-3, 3))
        return f"diagonal({offset},{d1},{d2})", lambda x: x.diagonal(offset, d1, d2)
    if kind == "merge_dims":
        d = draw(st.integers(0, n - 2))
        new = shape[:d] + (shape[d] * shape[d + 1],) + shape[d + 2:]
        return f"view({new})", lambda x: x.view(new)
    if kind == "view_as_real":
        return "view_as_real", torch.view_as_real
    return "view_as_complex", torch.view_as_complex


def _apply(fn, t: torch.Tensor):
    try:
        return fn(t), None
    except RuntimeError as error:  # e.g. a dtype view or view() the strides do not allow
        return None, error


@st.composite
def _write(draw, view: torch.Tensor):
    """An in-place write valid for ``view``'s dtype, as (name, fn)."""
    kind = draw(st.sampled_from(["fill_", "add_", "mul_", "copy_", "add_tensor"]))
    if view.dtype.is_floating_point or view.dtype.is_complex:
        value = draw(st.floats(-4, 4, allow_nan=False, width=16))
    else:
        info = torch.iinfo(view.dtype)
        value = draw(st.integers(max(info.min, -300), min(info.max, 300)))
    if kind in ("copy_", "add_tensor"):
        seed = draw(st.integers(0, 2**16))
        source = (torch.rand(view.shape, generator=torch.Generator().manual_seed(seed)) * 50 - 25).to(view.dtype)
        if kind == "copy_":
            return "copy_", lambda x: x.copy_(source.to(x.device))
        return "add_(tensor)", lambda x: x.add_(source.to(x.device))
    return f"{kind}({value})", lambda x: getattr(x, kind)(value)


#: Dtypes of the random chains' bases, limited to those the device under test holds.
BASE_DTYPES = [d for d in (torch.float32, torch.complex64, torch.int32) if holds(d)]


@functools.cache
def _computes_float64_exactly() -> bool:
    """Whether float64 arithmetic on the device under test is exact (neuron's
    ACCELKIT_NEURON_FLOAT64=downcast computes it in float32)."""
    if not holds(torch.float64):
        return False
    value = torch.tensor([1 + 2.0**-40], dtype=torch.float64)
    return torch.equal((value.to(DEVICE) + 0.0).cpu(), value)


@functools.cache
def _flushes_subnormals() -> bool:
    """Whether arithmetic on the device under test flushes subnormal floats to zero, as XLA
    does (real TPUs, and XLA's CPU platform the simulated tpu runs on)."""
    smallest = torch.tensor([1e-45])  # the smallest float32 subnormal
    return (smallest.to(DEVICE) + 0.0).cpu().item() == 0.0


@contextlib.contextmanager
def _cpu_flushing_like_the_device() -> Iterator[None]:
    """Run the CPU reference with subnormals flushed when the device flushes them: an integer
    base viewed as floats holds subnormals, and the write is arithmetic on them."""
    flush = _flushes_subnormals()
    torch.set_flush_denormal(flush)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def test_arithmetic_on_subnormals_matches_the_cpu_flushing_them_as_the_device_does(dev):
    bits = torch.tensor([2, -2147483645, -1, 0x3F800000], dtype=torch.int32)  # ±subnormal, NaN, 1.0
    on_cpu, on_device = bits.view(torch.float32).clone(), bits.to(dev).view(torch.float32)
    with _cpu_flushing_like_the_device():
        on_cpu.add_(0.0)
    on_device.add_(0.0)
    assert torch.equal(raw_bytes(on_device), raw_bytes(on_cpu))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_view_chain_with_inplace_write_matches_cpu(data):
    base_dtype = data.draw(st.sampled_from(BASE_DTYPES), label="dtype")
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4), label="shape"))
    base_cpu = (torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) * 1.5 - 7).to(base_dtype)
    if base_dtype.is_complex:
        base_cpu = base_cpu + 1j * base_cpu.flip(-1)
    base = base_cpu.to(DEVICE)

    view_cpu, view = base_cpu, base
    for _ in range(data.draw(st.integers(1, 5), label="length")):
        name, fn = data.draw(_view_step(view_cpu), label="view op")
        next_cpu, cpu_error = _apply(fn, view_cpu)
        next_dev, dev_error = _apply(fn, view)
        # The device accepts exactly the view ops the CPU accepts.
        assert (cpu_error is None) == (dev_error is None), (name, cpu_error, dev_error)
        if cpu_error is not None:
            continue
        view_cpu, view = next_cpu, next_dev
        assert_same_view(view, view_cpu)

    name, write = data.draw(_write(view_cpu), label="write")
    note = f"write {name} on view {tuple(view_cpu.shape)}/{view_cpu.stride()}+{view_cpu.storage_offset()}"
    if not _overlap_free(view_cpu) and 0 not in view_cpu.stride():
        # Partially overlapping windows (unfold with step < size): the result of an in-place
        # write is unspecified in PyTorch, so only the geometry checked above is compared.
        return
    with _cpu_flushing_like_the_device():
        _, cpu_error = _apply(write, view_cpu)
    _, dev_error = _apply(write, view)
    assert (cpu_error is None) == (dev_error is None), (note, cpu_error, dev_error)
    assert_same_view(view, view_cpu)
    assert_same_view(base, base_cpu)
    # Version counters: shared with the base when the chain kept aliasing, bumped like the CPU's.
    assert base._version == base_cpu._version
    assert view._version == view_cpu._version
