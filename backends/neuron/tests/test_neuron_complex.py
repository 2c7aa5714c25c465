"""complex64 on neuron: stored as float32 (real, imaginary) pairs and computed as real
arithmetic on the engines, checked against the CPU.

The centrepiece is TorchTitan's llama3 rotary embedding (``precompute_freqs_cis`` and
``apply_rotary_emb`` of torchtitan 0.2.2, written out here with plain torch ops at its debug
model's shapes), forward and backward, with the CPU fallback denied so every op of it runs as a
neuron tile program.

Tolerance of the RoPE comparison, measured: a complex multiply is bit-exact to the CPU's (both
compute ``(ac - bd, ad + bc)`` with fp32 roundings), but ``polar``'s cosine and sine come from
the Scalar engine's activation tables, which the simulator evaluates with torch's vectorised
fp32 functions where the CPU's ``polar`` calls the scalar ones: ``freqs_cis`` differs from the
CPU's by at most 1 ulp (5.96e-8 on values of magnitude up to 1; 8.4e-8 once the float32 angles
are computed on neuron too), and both are within 3.6e-8 of float64. Multiplied into
``randn`` queries and keys (magnitude up to about 5) that is up to 4.8e-7 in the outputs and
gradients (measured, both thetas), so ``atol=1e-6`` (about two ulps at the largest values) and
``rtol=1e-6``; ``freqs_cis`` itself is held to ``atol=2e-7``.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_native, run_python

import accelkit
from accelkit.sdk import UnsupportedDtypeError

# TorchTitan's llama3 debug model: dim 256, 16 heads -> head_dim 16; a batch of 2 x 64 tokens.
DIM, HEADS, SEQ, BATCH = 256, 16, 64, 2
HEAD_DIM = DIM // HEADS
MAX_SEQ = 2048


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    """torchtitan 0.2.2's llama3 ``precompute_freqs_cis`` with its default RoPE scaling
    (factor 8, low 1, high 4, original context 8192), on the current default device."""
    scaling_factor, low_freq_factor, high_freq_factor, original = 8.0, 1.0, 4.0, 8192
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    wavelen = 2 * math.pi / freqs
    high_freq_wavelen = original / high_freq_factor
    low_freq_wavelen = original / low_freq_factor
    freqs = torch.where(wavelen > low_freq_wavelen, freqs / scaling_factor, freqs)
    smooth_factor = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_freqs = (1 - smooth_factor) * freqs / scaling_factor + smooth_factor * freqs
    is_medium_freqs = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    freqs = torch.where(is_medium_freqs, smoothed_freqs, freqs)
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchtitan 0.2.2's llama3 ``apply_rotary_emb`` (with ``reshape_for_broadcast``, no
    positions)."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    seqlen = xq_.shape[1]
    freqs_cis = freqs_cis[0:seqlen]
    assert freqs_cis.shape == (seqlen, xq_.shape[-1])
    shape = [d if i == 1 or i == xq_.ndim - 1 else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis.view(*shape)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


ROPE_TOLERANCE = dict(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_llama3_rope_forward_and_backward_run_natively_and_match_the_cpu(dev, theta):
    generator = torch.Generator().manual_seed(int(theta))
    xq, xk, grad_q, grad_k = (torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=generator) for _ in range(4))

    freqs_cpu = precompute_freqs_cis(HEAD_DIM, MAX_SEQ, theta)
    q, k = xq.clone().requires_grad_(), xk.clone().requires_grad_()
    out_q, out_k = apply_rotary_emb(q, k, freqs_cpu)
    (out_q * grad_q + out_k * grad_k).sum().backward()

    with accelkit.fallback_policy("deny"):
        # As TorchTitan's init_weights does: the buffer is computed under the device context.
        with torch.device(dev):
            freqs = precompute_freqs_cis(HEAD_DIM, MAX_SEQ, theta)
        assert freqs.device.type == "neuron" and freqs.dtype == torch.complex64
        q_dev, k_dev = xq.to(dev).requires_grad_(), xk.to(dev).requires_grad_()
        dev_q, dev_k = apply_rotary_emb(q_dev, k_dev, freqs)
        (dev_q * grad_q.to(dev) + dev_k * grad_k.to(dev)).sum().backward()

    torch.testing.assert_close(freqs.cpu(), freqs_cpu, rtol=0, atol=2e-7)
    torch.testing.assert_close(dev_q.cpu(), out_q, **ROPE_TOLERANCE)
    torch.testing.assert_close(dev_k.cpu(), out_k, **ROPE_TOLERANCE)
    torch.testing.assert_close(q_dev.grad.cpu(), q.grad, **ROPE_TOLERANCE)
    torch.testing.assert_close(k_dev.grad.cpu(), k.grad, **ROPE_TOLERANCE)
    assert accelkit.stats()["totals"]["fallback"] == 0
    # The complex ops of the sequence and of its backward (grad * conj(freqs_cis)).
    assert_native("aten.polar.default", "aten.mul.Tensor", "aten._conj_physical.default")


def test_llama3_rope_buffer_survives_to_empty_and_init_on_neuron(dev):
    """TorchTitan builds the model on the meta device, moves it with ``to_empty`` (an
    uninitialised complex64 buffer on neuron) and recomputes ``freqs_cis`` there."""

    class Rope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("freqs_cis", precompute_freqs_cis(HEAD_DIM, SEQ, 500000.0), persistent=False)

    with torch.device("meta"):
        model = Rope()
    model.to_empty(device=dev)
    assert model.freqs_cis.device.type == "neuron" and model.freqs_cis.dtype == torch.complex64
    with torch.device(dev):
        model.freqs_cis = precompute_freqs_cis(HEAD_DIM, SEQ, 500000.0)
    torch.testing.assert_close(model.freqs_cis.cpu(), precompute_freqs_cis(HEAD_DIM, SEQ, 500000.0), rtol=0, atol=2e-7)


# ---------------------------------------------------------------------------------------------
# Storage: complex64 held, complex128 refused
# ---------------------------------------------------------------------------------------------


def test_complex64_round_trips_bit_for_bit(dev):
    values = torch.complex(torch.tensor([1.5, -0.0, float("inf"), float("nan"), 1e-40]),
                           torch.tensor([-2.25, 0.0, -0.0, 3.0, -1e-38]))
    back = values.to(dev).cpu()
    assert back.dtype == torch.complex64
    assert torch.equal(torch.view_as_real(back).view(torch.int32), torch.view_as_real(values).view(torch.int32))


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex32])
def test_other_complex_dtypes_are_refused_with_the_fix(dev, dtype):
    with pytest.raises(UnsupportedDtypeError, match="complex64 is stored as float32") as refused:
        torch.zeros(3, dtype=dtype).to(dev)
    assert str(dtype) in str(refused.value) and "Cast to torch.complex64" in str(refused.value)
    with pytest.raises(UnsupportedDtypeError, match=str(dtype)):
        torch.zeros(3, dtype=dtype, device=dev)


def test_complex128_stays_refused_under_the_float64_downcast_policy():
    code = """
        import warnings, torch, accelkit
        from accelkit.sdk import UnsupportedDtypeError
        warnings.simplefilter("ignore")
        dev = accelkit.select_device("neuron")
        assert torch.ones(2, dtype=torch.float64).to(dev).dtype == torch.float64
        try:
            torch.ones(2, dtype=torch.complex128).to(dev)
        except UnsupportedDtypeError as e:
            print("refused:", e)
    """
    done = run_python(code, env={"ACCELKIT_NEURON_FLOAT64": "downcast"})
    assert done.returncode == 0, done.stderr
    assert "refused: torch.complex128 is not supported on neuron:0" in done.stdout


def test_an_op_whose_complex_result_would_be_complex128_is_refused():
    code = """
        import warnings, torch, accelkit
        from accelkit.sdk import UnsupportedDtypeError
        warnings.simplefilter("ignore")
        dev = accelkit.select_device("neuron")
        z = torch.ones(2, dtype=torch.complex64).to(dev)
        wide = torch.ones(2, dtype=torch.float64).to(dev)  # stored under downcast
        try:
            torch.mul(z, wide)  # (the operator form turns a TypeError into NotImplemented)
        except UnsupportedDtypeError as e:
            print("refused:", e)
    """
    done = run_python(code, env={"ACCELKIT_NEURON_FLOAT64": "downcast"})
    assert done.returncode == 0, done.stderr
    assert "refused: torch.complex128 is not supported on neuron:0" in done.stdout


# ---------------------------------------------------------------------------------------------
# Views reinterpret the storage, as on the CPU
# ---------------------------------------------------------------------------------------------


def test_view_as_real_and_view_as_complex_alias_their_base(dev):
    base = torch.randn(4, 6, 2)
    real_dev = base.to(dev)
    z = torch.view_as_complex(real_dev)
    assert z.dtype == torch.complex64 and z.shape == (4, 6)
    assert z.untyped_storage().data_ptr() == real_dev.untyped_storage().data_ptr()
    # A write through the complex view shows in the real base, and the other way round.
    z[1, 2] = 5 - 7j
    real_dev[3, 0, 1] = 42.0
    expected = base.clone()
    expected_z = torch.view_as_complex(expected)
    expected_z[1, 2] = 5 - 7j
    expected[3, 0, 1] = 42.0
    assert torch.equal(real_dev.cpu(), expected)
    assert torch.equal(z.cpu(), expected_z)
    # view_as_real of a strided complex view addresses the same pairs.
    pairs = torch.view_as_real(z[:, ::2])
    pairs[..., 0].mul_(2)
    expected_z[:, ::2].real.mul_(2)
    assert torch.equal(real_dev.cpu(), expected)
    assert pairs.stride() == torch.view_as_real(expected_z[:, ::2]).stride()


def test_in_place_complex_ops_through_a_view_write_the_float_base(dev):
    base = torch.randn(3, 8)
    on_dev = base.to(dev)
    with accelkit.fallback_policy("deny"):
        z = torch.view_as_complex(on_dev.view(3, 4, 2))
        z.mul_(torch.tensor(0.5 + 2j))
        z[:, 1:].add_(1j)
    expected = base.clone()
    ez = torch.view_as_complex(expected.view(3, 4, 2))
    ez.mul_(torch.tensor(0.5 + 2j))
    ez[:, 1:].add_(1j)
    assert torch.equal(on_dev.cpu(), expected)


def test_conjugate_views_resolve_on_the_device(dev):
    z = torch.complex(torch.randn(5, 3), torch.randn(5, 3))
    with accelkit.fallback_policy("deny"):
        resolved = z.to(dev).conj().resolve_conj()
        into_conj = torch.empty(5, 3, dtype=torch.complex64, device=dev).conj()
        into_conj.copy_(z.to(dev))
    assert not resolved.is_conj() and torch.equal(resolved.cpu(), z.conj().resolve_conj())
    assert torch.equal(into_conj.cpu(), z) and torch.equal(into_conj.conj().resolve_conj().cpu(), z.conj())
    assert_native("aten._conj_physical.default")


# ---------------------------------------------------------------------------------------------
# Native complex programs against the CPU
# ---------------------------------------------------------------------------------------------


def _c(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.complex(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))


CASES = {
    "mul broadcast": (lambda a, b, r: a * b[0:1], "aten.mul.Tensor"),
    "mul real tensor": (lambda a, b, r: a * r, "aten.mul.Tensor"),
    "mul complex number": (lambda a, b, r: a * (0.25 - 3j), "aten.mul.Tensor"),
    "mul float number": (lambda a, b, r: a * 1.5, "aten.mul.Tensor"),
    "add": (lambda a, b, r: a + b, "aten.add.Tensor"),
    "add alpha": (lambda a, b, r: torch.add(a, b, alpha=2.5), "aten.add.Tensor"),
    "add complex alpha": (lambda a, b, r: torch.add(a, b, alpha=1 - 2j), "aten.add.Tensor"),
    "sub real": (lambda a, b, r: a - r, "aten.sub.Tensor"),
    "sub number": (lambda a, b, r: a - 2j, "aten.sub.Tensor"),
    "neg": (lambda a, b, r: -a, "aten.neg.default"),
    "conj_physical": (lambda a, b, r: torch.conj_physical(a), "aten._conj_physical.default"),
    "polar": (lambda a, b, r: torch.polar(r.abs(), b.real), "aten.polar.default"),
    "complex": (lambda a, b, r: torch.complex(r, b.imag.t().contiguous().t()), "aten.complex.default"),
    "float to complex": (lambda a, b, r: r.to(torch.complex64), None),
    "zeros": (lambda a, b, r: torch.zeros_like(a), "aten.zero_.default"),
    "fill complex": (lambda a, b, r: a.clone().fill_(2 - 1j), "aten.fill_.Scalar"),
    "strided operand": (lambda a, b, r: a.t() * b.t(), "aten.mul.Tensor"),
}


#: Where neuron and the CPU round apart (everything else is bit-exact): ``polar``'s cosine and
#: sine differ by up to 1 ulp (the Scalar engine's tables); a product's ``ad + bc`` is rounded
#: twice on the engines, as in the CPU's vectorised loop, but its scalar loops (a tail, a
#: broadcast operand) contract it into one fused multiply-add: 1 ulp of products of up to about
#: 16 (measured 4.9e-7).
TOLERANCES = {
    "aten.polar.default": dict(rtol=2.4e-7, atol=2.4e-7),
    "aten.mul.Tensor": dict(rtol=2.4e-7, atol=1e-6),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_complex_program_matches_the_cpu(dev, case):
    fn, op = case
    a, b, r = _c(130, 7, seed=1), _c(130, 7, seed=2), torch.randn(130, 7)
    expected = fn(a, b, r)
    with accelkit.fallback_policy("deny"):
        actual = fn(a.to(dev), b.to(dev), r.to(dev))
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected, **TOLERANCES.get(op, dict(rtol=0, atol=0)))
    if op is not None:
        assert_native(op)


def test_complex_multiply_is_four_multiplies_and_two_adds_each_rounded_to_fp32(dev):
    """Bit for bit the engines' arithmetic, written out on the host in float32 numpy."""
    a, b = _c(300, 5, seed=4), _c(1, 5, seed=5)
    actual = (a.to(dev) * b.to(dev)).cpu().numpy()
    ar, ai, br, bi = a.real.numpy(), a.imag.numpy(), b.real.numpy(), b.imag.numpy()
    assert (ar * br - ai * bi).dtype == "float32"
    assert (actual.real.view("int32") == (ar * br - ai * bi).view("int32")).all()
    assert (actual.imag.view("int32") == (ar * bi + ai * br).view("int32")).all()


def test_complex_programs_have_estimates(dev):
    a, b = _c(256, 64).to(dev), _c(256, 64, seed=3).to(dev)
    accelkit.reset_stats()
    a * b
    instances = accelkit.stats()["neuron"]["instances"]
    assert instances.get("mul.Tensor") == 1
    assert accelkit.stats()["estimate"]["seconds"] > 0


def test_an_op_without_a_complex_program_falls_back_and_is_counted(dev):
    z = _c(4, 5)
    with accelkit.fallback_policy("allow"):
        total = z.to(dev).sum()
        quotient = z.to(dev) / (1 + 1j)
    assert torch.equal(total.cpu(), z.sum())
    torch.testing.assert_close(quotient.cpu(), z / (1 + 1j), rtol=0, atol=0)
    ops = accelkit.stats()["ops"]
    assert ops["aten.sum.default"]["fallback"] == 1 and ops["aten.sum.default"]["native"] == 0
    assert ops["aten.div.Tensor"]["fallback"] == 1
    with accelkit.fallback_policy("deny"), pytest.raises(Exception, match="aten.sum.default"):
        z.to(dev).sum()


def test_a_fallback_that_flips_its_out_conjugate_bit_keeps_the_device_tensor_in_step(dev):
    """CPU's linalg_lu_solve with left=False solves the conjugate-transposed system and hands
    back its out= tensor with the conjugate bit flipped: the device tensor must follow, or its
    stored elements read conjugated."""
    g = torch.Generator().manual_seed(7)
    a = torch.complex(torch.randn(3, 3, generator=g), torch.randn(3, 3, generator=g))
    b = torch.complex(torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g))
    lu, pivots = torch.linalg.lu_factor(a)
    expected = torch.linalg.lu_solve(lu, pivots, b, left=False)
    with accelkit.fallback_policy("allow"):
        actual = torch.linalg.lu_solve(lu.to(dev), pivots.to(dev), b.to(dev), left=False)
    assert actual.is_conj() == expected.is_conj()
    assert torch.equal(actual.cpu(), expected)


def test_compiled_rope_equals_eager_bit_for_bit(dev):
    """torch.compile(backend="neuron"): the complex nodes run as the same pair programs inside
    the graph's program (the backward's conjugate view materialised by ``_conj_physical``)."""
    torch._dynamo.reset()
    with torch.device(dev):
        freqs = precompute_freqs_cis(HEAD_DIM, MAX_SEQ, 500000.0)
    g = torch.Generator().manual_seed(3)
    xq, xk = (torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g) for _ in range(2))
    compiled = torch.compile(apply_rotary_emb, backend="neuron")
    results = []
    with accelkit.fallback_policy("deny"):
        for fn in (apply_rotary_emb, compiled):
            q, k = xq.to(dev).requires_grad_(), xk.to(dev).requires_grad_()
            out_q, out_k = fn(q, k, freqs)
            (out_q.sum() + (out_k * 2).sum()).backward()
            results.append([t.detach().cpu() for t in (out_q, out_k, q.grad, k.grad)])
    for eager, program in zip(*results):
        assert torch.equal(eager, program)
    stats = accelkit.stats()["compile"]
    assert stats["graph_breaks"] == 0 and stats["program_segments"] == 2  # forward and backward


def test_a_compiled_complex_node_without_a_program_runs_eagerly(dev):
    torch._dynamo.reset()
    z = _c(6, 4)

    def f(x):
        return (x * (1 + 2j)).sum(dim=0) + 1

    with accelkit.fallback_policy("allow"):
        actual = torch.compile(f, backend="neuron")(z.to(dev))
    torch.testing.assert_close(actual.cpu(), f(z), **TOLERANCES["aten.mul.Tensor"])
    assert accelkit.stats()["ops"]["aten.sum.dim_IntList"]["fallback"] == 1
