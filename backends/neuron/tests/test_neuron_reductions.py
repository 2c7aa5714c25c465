"""neuron reductions, norms, scans, softmax, layer norm and nll_loss tile programs vs CPU PyTorch.

Every check runs the same call on CPU tensors and on neuron copies (non-contiguous inputs are
re-made as the same views on the device) and asserts the op ran as a tile program, not on the
CPU fallback. Shapes are chosen to reach every layout of the programs: more than 128 kept rows
(several partition tiles), more than 2048 reduced elements (several free-axis chunks), reduced
dims in the middle or leading (transposed loads, ones-vector matmuls), long full reductions
(spread over all partitions), keepdim, integer and boolean inputs.

Tolerances: float32 results differ from CPU only in summation order (per-partition chunks, PSUM
accumulation, cross-partition finish) — rtol 1e-5 with atol scaled to the magnitude of the sum
of |x| where sums are large; integer results are exact; bfloat16 results use PyTorch's bf16
defaults.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import accelkit
from accelkit_backends.neuron import profile
from conftest import assert_native, run_python

aten = torch.ops.aten
FLOAT32 = {"rtol": 1e-5, "atol": 1e-5}
#: Sums of a few thousand N(0, 1) values: ~1e-7 relative error of terms of size ~1, summed.
LONG_SUM = {"rtol": 1e-5, "atol": 2e-4}


def sample(shape, dtype=torch.float32, seed=0, low=-4, high=5):
    """Reproducible input: normal floats, small integers (with ties), random booleans."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if not dtype.is_signed:
        low = max(low, 0)
    return torch.randint(low, high, shape, generator=g, dtype=dtype)


def on_device(value, dev):
    """``value`` on neuron with the same geometry (a view is re-made from its base)."""
    if isinstance(value, torch.Tensor):
        if value._base is not None:
            return value._base.to(dev).as_strided(value.shape, value.stride(), value.storage_offset())
        return value.to(dev)
    return value


def compare(dev, fn, *inputs, **tol):
    """``fn`` on CPU inputs and on their neuron copies: same values, dtypes and shapes."""
    expected = fn(*inputs)
    actual = fn(*(on_device(x, dev) for x in inputs))
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.device.type == "neuron"
        torch.testing.assert_close(a.cpu(), e, equal_nan=True, **tol)
    return actual


#: (shape, dims) covering the layouts: rows > 128, free > 2048, middle and leading dims,
#: several dims, a long full reduction, a 0-d input.
GEOMETRIES = {
    "rows_over_128": ((300, 40), 1),
    "free_over_2048": ((3, 5000), 1),
    "leading_dim": ((300, 70), 0),
    "leading_dim_wide": ((150, 600), 0),
    "middle_dim": ((4, 50, 7), 1),
    "two_outer_dims": ((6, 5, 30), (0, 2)),
    "all_long": ((40, 120), None),
    "zero_dim": ((), None),
}


def _reduce(op, dims, keepdim):
    if dims is None:
        return lambda x: getattr(torch, op)(x)
    return lambda x: getattr(torch, op)(x, dims, keepdim=keepdim)


# ---------------------------------------------------------------------------------------------
# sum, mean, prod, amax, amin
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_sum_and_mean_match_cpu(dev, geometry, keepdim):
    shape, dims = GEOMETRIES[geometry]
    x = sample(shape)
    compare(dev, _reduce("sum", dims, keepdim), x, **LONG_SUM)
    compare(dev, _reduce("mean", dims, keepdim), x, **FLOAT32)
    if dims is None:
        assert_native("aten.sum.default", "aten.mean.default")
    else:
        assert_native("aten.sum.dim_IntList", "aten.mean.dim")


@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_amax_amin_match_cpu(dev, geometry, op):
    shape, dims = GEOMETRIES[geometry]
    compare(dev, _reduce(op, () if dims is None else dims, False), sample(shape))
    assert_native(f"aten.{op}.default")


def test_reductions_of_transposed_views(dev):
    x = sample((90, 150)).T  # non-contiguous: the reduced dim 1 is strided
    compare(dev, lambda t: t.sum(1), x, **FLOAT32)
    compare(dev, lambda t: t.amax(1, keepdim=True), x)
    compare(dev, lambda t: t.argmax(0), x)
    assert_native("aten.sum.dim_IntList", "aten.amax.default", "aten.argmax.default")


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8], ids=str)
def test_integer_and_bool_sums_are_exact(dev, dtype):
    x = sample((200, 3000), dtype)
    for fn in (lambda t: t.sum(1), lambda t: t.sum(0), lambda t: t.sum(), lambda t: t.sum(0, keepdim=True)):
        (result,) = compare(dev, fn, x)
        assert result.dtype == torch.int64
    assert_native("aten.sum.dim_IntList", "aten.sum.default")


def test_integer_extremes_and_products(dev):
    x = sample((130, 9), torch.int64, low=-3, high=4)
    compare(dev, lambda t: t.amax(1), x)
    compare(dev, lambda t: t.amin(0), x)
    compare(dev, lambda t: t.prod(1), x)
    compare(dev, lambda t: t.max(), x)
    compare(dev, lambda t: t.min(), x)
    assert_native("aten.amax.default", "aten.amin.default", "aten.prod.dim_int", "aten.max.default",
                  "aten.min.default")


def test_integer_reductions_over_leading_dims_stay_exact_on_trn1():
    """NeuronCore-v2 has no DMA transpose; its Tensor-engine transpose goes through fp32 PSUM,
    which would round integers above 2**24, so integer tiles load with a strided DMA instead."""
    result = run_python("""
        import torch, accelkit
        dev = accelkit.select_device("neuron")
        x = torch.tensor([[2**30 + 1, 5], [3, 2**30 + 3]], dtype=torch.int64).repeat(70, 1)
        assert torch.equal(x.to(dev).amax(0).cpu(), x.amax(0)), x.to(dev).amax(0).cpu()
        assert torch.equal(x.to(dev).argmax(0).cpu(), x.argmax(0))
        print("exact")
    """, env={"ACCELKIT_NEURON_TARGET": "trn1"})
    assert result.returncode == 0 and "exact" in result.stdout, result.stderr[-2000:]


def test_prod_matches_cpu(dev):
    x = torch.rand(150, 20, generator=torch.Generator().manual_seed(0)) + 0.5
    compare(dev, lambda t: t.prod(1), x, **FLOAT32)
    compare(dev, lambda t: t.prod(0, keepdim=True), x, rtol=1e-5, atol=0)
    compare(dev, lambda t: t[:4, :5].prod(), x, **FLOAT32)
    assert_native("aten.prod.dim_int", "aten.prod.default")


def test_bfloat16_reductions_accumulate_in_float32(dev):
    x = torch.full((4, 4096), 1.0, dtype=torch.bfloat16)  # 4096 ones: a bf16 running sum stalls at 256
    (result,) = compare(dev, lambda t: t.sum(1), x)
    assert result.dtype == torch.bfloat16 and result[0].item() == 4096.0
    y = sample((130, 300), torch.bfloat16)
    compare(dev, lambda t: t.mean(1), y)
    compare(dev, lambda t: t.amax(0), y)
    compare(dev, lambda t: t.sum(0), y)
    compare(dev, lambda t: t.sum(1, dtype=torch.float32), y, **FLOAT32)


def test_nan_and_inf_propagate_like_cpu(dev):
    x = sample((5, 3000))
    x[1, 2500] = math.nan
    x[2, 10] = math.inf
    x[3, 7] = -math.inf
    compare(dev, lambda t: t.sum(1), x, **LONG_SUM)
    compare(dev, lambda t: t.amax(1), x)
    compare(dev, lambda t: t.amin(1), x)
    compare(dev, lambda t: t.amax(), x)


def test_empty_reductions_match_cpu(dev):
    x = torch.zeros(3, 0)
    compare(dev, lambda t: t.sum(1), x)
    compare(dev, lambda t: t.mean(1), x)  # NaN, as on CPU
    compare(dev, lambda t: t.prod(1), x)
    compare(dev, lambda t: t.sum(0), x)
    with pytest.raises((IndexError, RuntimeError)):
        x.to(dev).amax(1)


def test_layouts_use_the_engines_they_claim(dev):
    """A float sum over a leading dim and a long full sum finish on the Tensor engine (ones
    matmul); an integer one stays on exact integer engines; a row sum needs no matmul."""

    def instructions(fn, x):
        with profile() as prof:
            fn(x.to(dev))
        return {i.name for i in prof.instructions}

    assert "matmul" in instructions(lambda t: t.sum(0), sample((200, 64)))
    assert "matmul" in instructions(lambda t: t.sum(), sample((4000,)))
    assert "matmul" not in instructions(lambda t: t.sum(0), sample((200, 64), torch.int64))
    assert "partition_reduce.add" in instructions(lambda t: t.sum(), sample((4000,), torch.int64))
    assert "matmul" not in instructions(lambda t: t.sum(1), sample((200, 64)))


# ---------------------------------------------------------------------------------------------
# argmax/argmin, max.dim/min.dim
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("geometry", ["rows_over_128", "free_over_2048", "leading_dim", "middle_dim"])
def test_argmax_argmin_match_cpu(dev, geometry, op):
    shape, dim = GEOMETRIES[geometry]
    x = sample(shape)
    compare(dev, lambda t: getattr(t, op)(dim), x)
    compare(dev, lambda t: getattr(t, op)(dim, keepdim=True), x)
    compare(dev, lambda t: getattr(t, op)(), x)
    assert_native(f"aten.{op}.default")


def test_ties_pick_the_first_index_across_chunks(dev):
    x = torch.zeros(3, 5000)
    x[0, [100, 2100, 4100]] = 7.0   # ties in three different chunks
    x[1, [3000, 4999]] = -2.0
    x[2] = 1.0                      # all equal
    compare(dev, lambda t: t.argmax(1), x)
    compare(dev, lambda t: t.argmin(1), x)
    ints = sample((140, 30), torch.int32, low=0, high=3)  # many ties
    compare(dev, lambda t: t.max(1), ints)
    compare(dev, lambda t: t.min(0), ints)


def test_nan_is_the_extreme_with_its_first_index(dev):
    x = sample((4, 5000))
    x[0, 3000] = math.nan
    x[0, 4000] = math.nan
    x[1, 10] = math.nan
    x[2, 2047] = math.nan
    compare(dev, lambda t: t.argmax(1), x)
    compare(dev, lambda t: t.argmin(1), x)
    compare(dev, lambda t: t.max(1), x)
    compare(dev, lambda t: t.min(1), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_max_min_dim_values_and_indices(dev, dtype):
    x = sample((150, 6, 7), dtype)
    for keepdim in (False, True):
        values, indices = compare(dev, lambda t, keepdim=keepdim: t.max(1, keepdim=keepdim), x)
        assert values.dtype == dtype and indices.dtype == torch.int64
        compare(dev, lambda t, keepdim=keepdim: t.min(-1, keepdim=keepdim), x)
    assert_native("aten.max.dim", "aten.min.dim")


# ---------------------------------------------------------------------------------------------
# var, var_mean, any/all, cumsum
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("geometry", ["rows_over_128", "free_over_2048", "middle_dim", "two_outer_dims", "all_long"])
def test_var_and_var_mean_match_cpu(dev, geometry, correction):
    shape, dims = GEOMETRIES[geometry]
    x = sample(shape) * 3 + 10  # an offset mean: a one-pass formula would lose digits
    compare(dev, lambda t: torch.var(t, dims, correction=correction), x, rtol=1e-5, atol=1e-4)
    compare(dev, lambda t: torch.var_mean(t, dims, correction=correction, keepdim=True), x,
            rtol=1e-5, atol=1e-4)
    assert_native("aten.var.correction", "aten.var_mean.correction")


def test_var_of_bfloat16_and_too_few_elements(dev):
    compare(dev, lambda t: torch.var(t, 1), sample((130, 50), torch.bfloat16))
    compare(dev, lambda t: torch.var(t, 1), sample((3, 1)))  # n - 1 = 0: NaN as on CPU
    compare(dev, lambda t: torch.std(t, 0), sample((200, 20)), **FLOAT32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.uint8], ids=str)
def test_any_all_match_cpu(dev, dtype):
    x = sample((300, 20), dtype, low=0, high=2)
    for fn in (lambda t: t.any(1), lambda t: t.all(0, keepdim=True), lambda t: t.any(),
               lambda t: t.all(), lambda t: torch.any(t, dim=(0, 1))):
        (result,) = compare(dev, fn, x)
        assert result.dtype == (torch.uint8 if dtype == torch.uint8 else torch.bool)
    assert_native("aten.any.dim", "aten.all.dim", "aten.any.default", "aten.all.default", "aten.any.dims")


def test_any_all_of_long_rows_and_nan(dev):
    x = torch.zeros(3, 5000)
    x[0, 4999] = math.nan  # NaN is true
    x[1] = 1.0
    compare(dev, lambda t: t.any(1), x)
    compare(dev, lambda t: t.all(1), x)
    compare(dev, lambda t: t.any(), torch.zeros(10000))
    compare(dev, lambda t: t.all(), torch.zeros(0))  # all of nothing is true


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_cumsum_matches_cpu(dev, dtype):
    x = sample((150, 70), dtype)
    compare(dev, lambda t: t.cumsum(1), x, **FLOAT32)
    compare(dev, lambda t: t.cumsum(0), x, rtol=1e-5, atol=1e-4)
    compare(dev, lambda t: t[:3].reshape(-1).cumsum(0), x, rtol=1e-5, atol=1e-4)
    assert_native("aten.cumsum.default")


def test_cumsum_of_long_rows_carries_across_chunks(dev):
    x = sample((3, 5000))
    compare(dev, lambda t: t.cumsum(-1), x, rtol=1e-5, atol=5e-4)
    ones = torch.ones(2, 5000, dtype=torch.int32)
    (result,) = compare(dev, lambda t: t.cumsum(1), ones)
    assert result[0, -1].item() == 5000
    compare(dev, lambda t: t.cumsum(1, dtype=torch.float32), ones)


def test_cumprod_matches_cpu(dev):
    x = torch.rand(140, 3000, generator=torch.Generator().manual_seed(0)) * 0.2 + 0.95
    compare(dev, lambda t: t.cumprod(1), x, rtol=1e-4, atol=1e-6)
    compare(dev, lambda t: t[:, :50].cumprod(0), x, rtol=1e-5, atol=1e-6)
    compare(dev, lambda t: t.cumprod(1), sample((5, 30), torch.int64, low=-1, high=2))
    assert_native("aten.cumprod.default")


@pytest.mark.parametrize("order", [2, 1, 0, 3, 0.5, math.inf, -math.inf])
def test_vector_norm_matches_cpu(dev, order):
    x = sample((300, 40))
    x[0, :5] = 0.0
    compare(dev, lambda t: torch.linalg.vector_norm(t, order, 1), x, rtol=1e-5, atol=1e-4)
    compare(dev, lambda t: torch.linalg.vector_norm(t, order, 0, keepdim=True), x, rtol=1e-5, atol=1e-4)
    compare(dev, lambda t: torch.linalg.vector_norm(t, order), x, rtol=1e-5, atol=1e-3)
    assert_native("aten.linalg_vector_norm.default")


def test_gradient_clipping_runs_natively(dev):
    grads = [sample((300, 40)), sample((5000,), seed=1)]
    norms = []
    for device in ("cpu", dev):
        params = [torch.nn.Parameter(torch.zeros_like(g).to(device)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone().to(device)  # clipping scales the gradients in place
        with accelkit.fallback_policy("deny"):
            norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False).cpu())
    torch.testing.assert_close(norms[1], norms[0], **LONG_SUM)


def test_logsumexp_matches_cpu(dev):
    x = sample((130, 3000))
    x[3, 5] = math.inf
    x[4] = -math.inf
    x[5, 7] = math.nan
    compare(dev, lambda t: t.logsumexp(1), x, **FLOAT32)
    compare(dev, lambda t: t[:, :40].logsumexp((0,), keepdim=True), x, **FLOAT32)
    compare(dev, lambda t: t.logsumexp((0, 1)), sample((3, 7)), **FLOAT32)
    assert_native("aten.logsumexp.default")


# ---------------------------------------------------------------------------------------------
# softmax, log_softmax and their backward passes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape, dim", [((300, 40), 1), ((200, 30), 0), ((3, 7, 5), 1), ((3, 5000), -1)])
def test_softmax_forward_and_backward_match_cpu(dev, shape, dim, log):
    x, grad = sample(shape), sample(shape, seed=1)

    def forward_backward(t, g):
        t = t.detach().requires_grad_(True)
        y = F.log_softmax(t, dim) if log else F.softmax(t, dim)
        y.backward(g)
        return y.detach(), t.grad

    compare(dev, forward_backward, x, grad, rtol=1e-5, atol=1e-6)
    if log:
        assert_native("aten._log_softmax.default", "aten._log_softmax_backward_data.default")
    else:
        assert_native("aten._softmax.default", "aten._softmax_backward_data.default")


def test_softmax_of_bfloat16(dev):
    x = sample((130, 64), torch.bfloat16)
    (result,) = compare(dev, lambda t: F.softmax(t, -1), x)
    assert result.dtype == torch.bfloat16
    compare(dev, lambda t: F.log_softmax(t, -1), x)


def test_safe_softmax_gives_zeros_for_fully_masked_rows(dev):
    x = sample((6, 9))
    x[2] = -math.inf
    x[4, :5] = -math.inf
    (result,) = compare(dev, lambda t: aten._safe_softmax(t, -1), x, **FLOAT32)
    assert torch.equal(result[2].cpu(), torch.zeros(9))
    (plain,) = compare(dev, lambda t: F.softmax(t, -1), x, **FLOAT32)
    assert plain[2].cpu().isnan().all()  # plain softmax keeps CPU's NaN
    assert_native("aten._safe_softmax.default", "aten._softmax.default")


# ---------------------------------------------------------------------------------------------
# layer norm
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape, normalized", [((3, 6, 16), (16,)), ((300, 40), (40,)),
                                               ((5, 4, 6), (4, 6)), ((3, 5000), (5000,))])
def test_layer_norm_forward_and_backward_match_cpu(dev, shape, normalized, affine):
    x = sample(shape) * 3 + 1
    grad = sample(shape, seed=1)
    weight = sample(normalized, seed=2) if affine else None
    bias = sample(normalized, seed=3) if affine else None

    def forward_backward(t, g, w, b):
        t = t.detach().requires_grad_(True)
        params = [p.detach().requires_grad_(True) if p is not None else None for p in (w, b)]
        y = F.layer_norm(t, normalized, *params, eps=1e-5)
        y.backward(g)
        grads = tuple(p.grad for p in params if p is not None)
        return (y.detach(), t.grad) + grads

    def run(t, g):
        return forward_backward(t, g, on_device(weight, t.device) if weight is not None else None,
                                on_device(bias, t.device) if bias is not None else None)

    compare(dev, run, x, grad, rtol=1e-5, atol=1e-4)
    assert_native("aten.native_layer_norm.default", "aten.native_layer_norm_backward.default")


def test_layer_norm_statistics_match_cpu(dev):
    compare(dev, lambda t: aten.native_layer_norm(t, [24], None, None, 1e-5), sample((130, 24)), **FLOAT32)
    x = sample((130, 24), torch.bfloat16)
    result, mean, rstd = aten.native_layer_norm(x.to(dev), [24], None, None, 1e-5)
    expected = aten.native_layer_norm(x, [24], None, None, 1e-5)
    torch.testing.assert_close(result.cpu(), expected[0])
    # CPU rounds a bfloat16 input's statistics to bfloat16 (PyTorch's Meta kernel says float32,
    # which neuron used to follow); beside a float32 weight they stay float32.
    assert mean.dtype == rstd.dtype == torch.bfloat16
    torch.testing.assert_close(mean.cpu(), expected[1], rtol=1.6e-2, atol=1e-3)
    torch.testing.assert_close(rstd.cpu(), expected[2], rtol=1.6e-2, atol=1e-3)
    weight = torch.ones(24)
    mixed = aten.native_layer_norm(x.to(dev), [24], weight.to(dev), None, 1e-5)
    assert [t.dtype for t in mixed] == [t.dtype for t in aten.native_layer_norm(x, [24], weight, None, 1e-5)]


# ---------------------------------------------------------------------------------------------
# nll_loss (cross_entropy)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("samples, classes", [(16, 5), (200, 7), (3, 3000)])
def test_cross_entropy_forward_and_backward_match_cpu(dev, samples, classes, weighted, reduction):
    logits = sample((samples, classes))
    target = torch.randint(0, classes, (samples,), generator=torch.Generator().manual_seed(1))
    target[1] = -100  # ignored
    weight = torch.rand(classes, generator=torch.Generator().manual_seed(2)) if weighted else None

    def forward_backward(x, t):
        x = x.detach().requires_grad_(True)
        w = on_device(weight, x.device) if weight is not None else None
        loss = F.cross_entropy(x, t, weight=w, reduction=reduction)
        loss.backward(torch.full_like(loss, 0.7))
        return loss.detach(), x.grad

    compare(dev, forward_backward, logits, target, **FLOAT32)
    assert_native("aten.nll_loss_forward.default", "aten.nll_loss_backward.default")


def test_nll_loss_of_one_sample_and_total_weight(dev):
    x = F.log_softmax(sample((5,)), 0)
    target = torch.tensor(2)
    for reduction in (0, 1, 2):
        compare(dev, lambda t, y, reduction=reduction: aten.nll_loss_forward(t, y, None, reduction, -100), x, target)
    batch = F.log_softmax(sample((4, 5)), 1)
    targets = torch.tensor([1, -100, 3, 0])
    compare(dev, lambda t, y: aten.nll_loss_forward(t, y, None, 0, -100), batch, targets)
    real_class_ignored = torch.tensor([1, 3, 3, 0])
    compare(dev, lambda t, y: aten.nll_loss_forward(t, y, None, 1, 3), batch, real_class_ignored)


def test_nll_loss_target_out_of_range_raises(dev):
    with pytest.raises(IndexError, match="out of bounds"):
        F.nll_loss(torch.randn(3, 4).to(dev), torch.tensor([0, 4, 1]).to(dev))


def test_out_and_inplace_variants_use_the_tile_programs(dev):
    x = sample((5, 7))
    with accelkit.fallback_policy("deny"):
        on = x.to(dev)
        total = torch.empty(5, device=dev)
        torch.sum(on, 1, out=total)
        values, indices = torch.empty(5, device=dev), torch.empty(5, dtype=torch.long, device=dev)
        torch.max(on, 1, out=(values, indices))
        lse = torch.empty(5, device=dev)
        torch.logsumexp(on, 1, out=lse)
        on.cumsum_(0)
    torch.testing.assert_close(total.cpu(), x.sum(1), **FLOAT32)
    torch.testing.assert_close((values.cpu(), indices.cpu()), tuple(x.max(1)))
    torch.testing.assert_close(lse.cpu(), x.logsumexp(1), **FLOAT32)
    torch.testing.assert_close(on.cpu(), x.cumsum(0), **FLOAT32)
    assert_native("aten.sum.IntList_out", "aten.max.dim_max", "aten.logsumexp.out", "aten.cumsum_.default")
