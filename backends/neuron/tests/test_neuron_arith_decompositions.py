"""The small exact families neuron decomposes (``decompositions/arith.py``, and PyTorch's
``_addmm_activation``/``grid_sampler_2d`` in ``decompositions.VETTED``) vs CPU
PyTorch, fallback denied: bit for bit where the CPU's arithmetic is followed step for step,
within float rounding where a sum is grouped differently."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit

GEN = torch.Generator().manual_seed(0)


def _on_device(fn, *tensors, dev):
    with accelkit.fallback_policy("deny"):
        out = fn(*(t.to(dev) for t in tensors))
    return tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def _close(actual, expected, dtype):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


# -- matmul with beta/alpha ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, -2.0), (0, 1.5)], ids=str)
def test_addbmm_and_addmv_match_cpu(dev, dtype, beta, alpha):
    self2, b1, b2 = _randn(5, 6, dtype=dtype), _randn(3, 5, 4, dtype=dtype), _randn(3, 4, 6, dtype=dtype)
    self1, mat, vec = _randn(5, dtype=dtype), _randn(5, 7, dtype=dtype), _randn(7, dtype=dtype)
    addbmm = lambda s, x, y: torch.addbmm(s, x, y, beta=beta, alpha=alpha)  # noqa: E731
    addmv = lambda s, m, v: torch.addmv(s, m, v, beta=beta, alpha=alpha)  # noqa: E731
    _close(_on_device(addbmm, self2, b1, b2, dev=dev), addbmm(self2, b1, b2), dtype)
    _close(_on_device(addmv, self1, mat, vec, dev=dev), addmv(self1, mat, vec), dtype)


def test_beta_zero_ignores_nan_in_self(dev):
    self2 = torch.full((5, 6), float("nan"))
    b1, b2 = _randn(2, 5, 3), _randn(2, 3, 6)
    actual = _on_device(lambda s, x, y: torch.addbmm(s, x, y, beta=0), self2, b1, b2, dev=dev)
    assert not actual.isnan().any()
    _close(actual, torch.addbmm(self2, b1, b2, beta=0), torch.float32)
    vec_self = torch.full((5,), float("nan"))
    actual = _on_device(lambda s, m, v: torch.addmv(s, m, v, beta=0), vec_self, _randn(5, 3), _randn(3), dev=dev)
    assert not actual.isnan().any()


def test_addbmm_in_place_and_addmm_activation(dev):
    self2, b1, b2 = _randn(4, 4), _randn(2, 4, 3), _randn(2, 3, 4)
    expected = self2.clone().addbmm_(b1, b2, alpha=0.5)
    _close(_on_device(lambda s, x, y: s.addbmm_(x, y, alpha=0.5), self2, b1, b2, dev=dev), expected, torch.float32)
    for use_gelu in (False, True):
        fn = lambda s, x, y: torch.ops.aten._addmm_activation(s, x, y, use_gelu=use_gelu)  # noqa: E731
        _close(_on_device(fn, self2, self2, self2, dev=dev), fn(self2, self2, self2), torch.float32)


# -- integer Euclid ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8], ids=str)
def test_gcd_lcm_match_cpu_exactly(dev, dtype):
    high = min(torch.iinfo(dtype).max, 40_000)  # int64's lcm within the engines' int32
    low = 0 if dtype == torch.uint8 else -high
    a = torch.randint(low, high, (64,), generator=GEN).to(dtype)
    b = torch.randint(low, high, (64,), generator=GEN).to(dtype)
    a[:4] = torch.tensor([0, 0, 7, 12]).to(dtype)
    b[:4] = torch.tensor([0, 5, 0, 18]).to(dtype)
    for fn in (torch.gcd, torch.lcm):
        actual, expected = _on_device(fn, a, b, dev=dev), fn(a, b)
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), fn.__name__


def test_gcd_worst_case_consecutive_fibonacci(dev):
    fib = [1, 1]
    while fib[-1] < 2 ** 31 - 1:
        fib.append(fib[-1] + fib[-2])
    a, b = torch.tensor(fib[-3:-1], dtype=torch.int32), torch.tensor(fib[-4:-2], dtype=torch.int32)
    assert torch.equal(_on_device(torch.gcd, a, b, dev=dev), torch.gcd(a, b))
    x = torch.tensor([12, 18], dtype=torch.int32)
    assert torch.equal(_on_device(lambda t, u: t.gcd_(u), x, torch.tensor([8, 27], dtype=torch.int32), dev=dev),
                       torch.tensor([4, 9], dtype=torch.int32))


# -- nextafter --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nextafter_matches_cpu_bit_for_bit(dev, dtype):
    specials = [0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf"), float("nan"), torch.finfo(dtype).max,
                torch.finfo(dtype).tiny, -torch.finfo(dtype).tiny]
    x = torch.cat([torch.tensor(specials), _randn(20) * 100]).to(dtype)
    grid_x, grid_y = torch.meshgrid(x, x, indexing="ij")
    expected = torch.nextafter(grid_x, grid_y)
    actual = _on_device(torch.nextafter, grid_x, grid_y, dev=dev)
    assert actual.dtype == expected.dtype
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    assert torch.equal(actual[~nan].view(bits), expected[~nan].view(bits))


# -- searchsorted -----------------------------------------------------------------------------

SEARCHES = {
    "left": {},
    "right": {"right": True},
    "side_right_int32": {"side": "right", "out_int32": True},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
@pytest.mark.parametrize("case", SEARCHES, ids=str)
def test_searchsorted_matches_cpu(dev, dtype, case):
    kwargs = SEARCHES[case]
    sorted_1d = (torch.arange(-8, 9) // 2).to(dtype)  # repeated values: left and right differ
    values = (_randn(3, 11) * 6).round().to(dtype)
    batched = torch.sort((_randn(3, 9) * 4).round(), dim=-1).values.to(dtype)
    for seq in (sorted_1d, batched):
        fn = lambda s, v: torch.searchsorted(s, v, **kwargs)  # noqa: E731
        actual, expected = _on_device(fn, seq, values, dev=dev), fn(seq, values)
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)


def test_searchsorted_sorter_scalar_and_nan(dev):
    seq = torch.tensor([3.0, 1.0, float("nan"), 2.0, 2.0])
    sorter = torch.argsort(seq)
    values = torch.tensor([0.5, 2.0, 2.5, 9.0, float("nan")])
    for right in (False, True):
        fn = lambda s, v, o: torch.searchsorted(s, v, right=right, sorter=o)  # noqa: E731
        assert torch.equal(_on_device(fn, seq, values, sorter, dev=dev), fn(seq, values, sorter))
    with_nan = torch.tensor([1.0, float("nan"), float("nan")])  # not sorted: the search's own answer
    assert torch.equal(_on_device(torch.searchsorted, with_nan, values, dev=dev), torch.searchsorted(with_nan, values))
    seq_sorted = torch.linspace(-1, 1, 7)
    fn = lambda s: torch.searchsorted(s, 0.3, right=True)  # noqa: E731
    assert torch.equal(_on_device(fn, seq_sorted, dev=dev), fn(seq_sorted))


# -- index_reduce -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False], ids=["with_self", "without_self"])
def test_index_reduce_matches_cpu(dev, dtype, reduce, include_self):
    self_ = (_randn(5, 4) * 4).round().to(dtype)
    source = (_randn(5, 6) * 4).round().to(dtype)
    index = torch.tensor([0, 2, 0, 3, 2, 0])
    fn = lambda s, i, src: s.index_reduce(1, i, src, reduce, include_self=include_self)  # noqa: E731
    actual, expected = _on_device(fn, self_, index, source, dev=dev), fn(self_, index, source)
    assert actual.dtype == expected.dtype
    if dtype == torch.bfloat16 and reduce == "mean":
        _close(actual, expected, dtype)
    else:
        assert torch.equal(actual, expected)


# -- grid_sampler_2d --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True], ids=["centers", "corners"])
def test_grid_sample_matches_cpu(dev, mode, padding_mode, align_corners):
    image, grid = _randn(2, 3, 5, 7), _randn(2, 4, 6, 2) * 1.2
    fn = lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners)  # noqa: E731
    actual, expected = _on_device(fn, image, grid, dev=dev), fn(image, grid)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


# -- histograms -------------------------------------------------------------------------------

def _histogram_input(dtype):
    x = torch.cat([_randn(200) * 2, torch.tensor([-1.0, 1.0, 0.0, 0.5, 3.0, float("nan")])])
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bins,low,high", [(10, -1.0, 1.0), (7, 0.0, 0.0), (16, -3.0, 2.5)], ids=str)
def test_histc_matches_cpu_exactly(dev, dtype, bins, low, high):
    x = _histogram_input(dtype)
    if low == high:
        x = x[~x.isnan()]  # a range left to the data must be finite (on the CPU too)
    fn = lambda t: torch.histc(t, bins=bins, min=low, max=high)  # noqa: E731
    actual, expected = _on_device(fn, x, dev=dev), fn(x)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


def test_histc_of_constant_data_and_its_errors(dev):
    x = torch.full((5,), 2.0)
    assert torch.equal(_on_device(lambda t: torch.histc(t, bins=4), x, dev=dev), torch.histc(x, bins=4))
    with pytest.raises(RuntimeError, match="not finite"):
        _on_device(lambda t: torch.histc(t, bins=4), torch.tensor([1.0, float("inf")]), dev=dev)


@pytest.mark.parametrize("density", [False, True], ids=["counts", "density"])
@pytest.mark.parametrize("weighted", [False, True], ids=["ones", "weights"])
def test_histogram_matches_cpu(dev, density, weighted):
    x = _histogram_input(torch.float32)[:-1].view(5, 41)
    weight = _randn(5, 41).abs() if weighted else None
    edges = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.25, 2.0, 4.0])
    cases = {
        "count": lambda t, w: torch.histogram(t, bins=9, weight=w, density=density),
        "count_range": lambda t, w: torch.histogram(t, bins=5, range=(-1.0, 1.0), weight=w, density=density),
        "edges": lambda t, w: torch.histogram(t, edges.to(t.device), weight=w, density=density),
    }
    for name, fn in cases.items():
        tensors = (x, weight) if weighted else (x,)
        actual = _on_device(lambda t, w=None: fn(t, w), *tensors, dev=dev)
        expected = fn(x, weight)
        assert torch.equal(actual[1], expected[1]), name
        if weighted or density:  # sums of floats, grouped otherwise than on the CPU
            torch.testing.assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-6, msg=name)
        else:
            assert torch.equal(actual[0], expected[0]), name


@pytest.mark.parametrize("range_", [None, (2.0, 2.0), (1.0, 3.0)], ids=["data", "equal", "given"])
def test_histogram_of_no_data_has_the_cpus_edges(dev, range_):
    """No data and no range: edges [0, 1]; an equal range widened by 0.5; a range as given."""
    x = torch.empty(5, 0, 5)
    expected = torch.histogram(x, bins=2, range=range_)
    actual = _on_device(lambda t: torch.histogram(t, bins=2, range=range_), x, dev=dev)
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])


# -- element-wise odds and ends ---------------------------------------------------------------

def _with_specials(dtype):
    x = torch.cat([torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 0.5, -0.5]), _randn(9)])
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fmax_fmin_shrink_backward_angle_aminmax_match_cpu_exactly(dev, dtype):
    x = _with_specials(dtype)
    grid_a, grid_b = torch.meshgrid(x, x, indexing="ij")
    grad = _randn(*grid_a.shape, dtype=dtype)
    # the CPU's shrink backwards give a NaN input's gradient in their scalar path and 0 in their
    # vectorised one (by the tensor's size): NaN is left out of those two
    finite_a = torch.where(grid_a.isnan(), 1.0, grid_a)
    cases = {
        "fmax": (torch.fmax, (grid_a, grid_b)),
        "fmin": (torch.fmin, (grid_a, grid_b)),
        "hardshrink_backward": (lambda g, t: torch.ops.aten.hardshrink_backward(g, t, 0.5), (grad, finite_a)),
        "softshrink_backward": (lambda g, t: torch.ops.aten.softshrink_backward(g, t, 0.25), (grad, finite_a)),
        "angle": (torch.angle, (grid_a,)),
        "aminmax": (lambda t: torch.stack(torch.ops.aten._aminmax(t)), (grid_a[1:],)),
        "aminmax_dim": (lambda t: torch.stack(torch.ops.aten._aminmax(t, 1, True)), (grid_a,)),
    }
    for name, (fn, args) in cases.items():
        actual, expected = _on_device(fn, *args, dev=dev), fn(*args)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
        nan = expected.isnan()
        assert torch.equal(actual.isnan(), nan), name
        # equal values; a tie of signed zeros may give either (IEEE leaves it open, and the CPU's
        # own vectorised and scalar paths differ)
        assert torch.equal(actual[~nan], expected[~nan]), name


def test_fmax_of_integers_and_angle_of_integers(dev):
    a, b = torch.tensor([3, -4, 7], dtype=torch.int32), torch.tensor([5, -9, 7], dtype=torch.int32)
    assert torch.equal(_on_device(torch.fmax, a, b, dev=dev), torch.fmax(a, b))
    assert torch.equal(_on_device(torch.fmin, a, b, dev=dev), torch.fmin(a, b))
    actual, expected = _on_device(torch.angle, b, dev=dev), torch.angle(b)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("decimals", [0, 1, 3, -1, -2], ids=str)
def test_round_to_decimals_matches_cpu_exactly(dev, dtype, decimals):
    x = torch.cat([_randn(64) * 300, torch.tensor([0.5, 1.5, 2.5, -0.5, 0.125, 0.0125, 15.0, 25.0, 250.0])]).to(dtype)
    fn = lambda t: torch.round(t, decimals=decimals)  # noqa: E731
    actual, expected = _on_device(fn, x, dev=dev), fn(x)
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, float("inf")], ids=str)
@pytest.mark.parametrize("rows", [7, 30], ids=["direct", "matmul_form"])
def test_cdist_matches_cpu(dev, p, rows):
    x1, x2 = _randn(2, rows, 5), _randn(2, 6, 5)
    x2[0, 0] = x1[0, 0]  # a zero distance (p = 0 counts nonzeros)
    fn = lambda a, b: torch.cdist(a, b, p=p)  # noqa: E731
    actual, expected = _on_device(fn, x1, x2, dev=dev), fn(x1, x2)
    assert actual.shape == expected.shape
    atol = 1e-5
    if rows > 25 and p == 2.0:
        # the matmul form squares, sums and cancels: a squared distance carries rounding of the
        # squared norms (a few eps * |x|^2), which the root turns into sqrt of that near zero
        norms = max(x1.square().sum(-1).max().item(), x2.square().sum(-1).max().item())
        atol = (8 * torch.finfo(torch.float32).eps * norms) ** 0.5
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_frexp_matches_the_cpu_bit_for_bit(dev, dtype):
    """Normal numbers around powers of two, subnormals, signed zeros, inf and NaN."""
    special = torch.tensor([0.0, -0.0, 1.0, -3.0, 0.75, 7.9999995, 1e-40, -1e-45, 1.17e-38, 3.4e38,
                            float("inf"), float("-inf"), float("nan")])
    x = torch.cat([special, torch.randn(500, generator=torch.Generator().manual_seed(0)) * 1e3]).to(dtype)
    expected = torch.frexp(x)
    with accelkit.fallback_policy("deny"):
        got = torch.frexp(x.to(dev))
        mantissa, exponent = torch.empty(0, dtype=dtype, device=dev), torch.empty(0, dtype=torch.int32, device=dev)
        torch.frexp(x.to(dev), out=(mantissa, exponent))
    for m, e in ((got.mantissa, got.exponent), (mantissa, exponent)):
        m, e = m.cpu(), e.cpu()
        assert m.dtype == dtype and e.dtype == torch.int32
        assert torch.equal(e, expected.exponent)
        numbers = ~expected.mantissa.isnan()
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        assert torch.equal(m.view(bits)[numbers], expected.mantissa.view(bits)[numbers])  # -0.0 too
        assert torch.equal(m.isnan(), ~numbers)
