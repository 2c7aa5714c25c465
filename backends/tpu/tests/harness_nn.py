"""The forward-and-backward check of the nn-family tests (conv, attention, pooling, losses,
embedding, normalization): ``compare`` runs one functional call on CPU leaf tensors and on tpu
copies under ``fallback_policy("deny")``, compares outputs, back-propagates one random cotangent
on both and compares every input gradient, and asserts the named ops ran as tpu lowerings."""

from __future__ import annotations

import torch

import accelkit


F32 = {"rtol": 1e-5, "atol": 1e-5}
BF16 = {"rtol": 2e-2, "atol": 2e-2}


def sample(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def compare(dev, fn, inputs, native=(), differentiable=None, tol=F32, reference=None):
    """Run ``fn`` on CPU and tpu copies of ``inputs``; compare outputs and the gradients of the
    floating inputs listed in ``differentiable`` (all floating inputs by default).

    ``reference``: a dtype the CPU computes in instead of the inputs' (results rounded back),
    where CPU's own low-precision kernel depends on the machine (its bfloat16 convolution
    accumulates differently with and without AVX-512).
    """
    if differentiable is None:
        differentiable = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    tpu = [t.detach().to(dev).requires_grad_(i in differentiable) if isinstance(t, torch.Tensor) else t
           for i, t in enumerate(inputs)]
    if reference is not None:
        inputs = [t.to(reference) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    cpu = [t.clone().requires_grad_(i in differentiable) if isinstance(t, torch.Tensor) else t
           for i, t in enumerate(inputs)]
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        expected, actual = fn(*cpu), fn(*tpu)
        expected = expected if isinstance(expected, tuple) else (expected,)
        actual = actual if isinstance(actual, tuple) else (actual,)
        rounded = (lambda e, like: e.to(like.dtype)) if reference is not None else (lambda e, like: e)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.cpu(), rounded(e, a), equal_nan=True, **tol)
        if differentiable:
            cotangent = sample(actual[0].shape, actual[0].dtype, seed=1)
            expected[0].backward(cotangent.to(expected[0].dtype))
            actual[0].backward(cotangent.to(dev))
            for i in differentiable:
                torch.testing.assert_close(tpu[i].grad.cpu(), rounded(cpu[i].grad, tpu[i]), **tol,
                                           msg=f"gradient of input {i}")
    counts = accelkit.stats()["ops"]
    for op in native:
        assert counts.get(op, {}).get("native", 0) > 0, f"{op} did not run natively: {counts.get(op)}"
    return tpu
