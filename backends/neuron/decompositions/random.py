"""Random ops built from neuron's native random kernels (``kernels/random.py``) and native
arithmetic. ``multinomial``, drawn as the device stream defines it
(:func:`accelkit.sdk.random_stream.multinomial`), from the same counters:

* with replacement, sample ``s`` of row ``r`` is the first category whose cumulative weight
  exceeds ``u * total``, ``u`` the stream's uniform of counter ``r * samples + s`` (one
  ``uniform_`` of ``[rows, samples]``); a target that rounding pushes past the last positive
  category takes that category;
* without, the exponential race: each category's key ``weight / E``, ``E`` the stream's
  exponential of counter ``r * categories + c`` (one ``exponential_``), and the ``samples``
  largest keys' categories in order (a stable descending sort: zero weights rank last, so with
  fewer positive weights than samples the zero-weight categories follow in index order).

And ``rrelu_with_noise``: training, each element ``x <= 0`` is multiplied by a slope uniform
in ``[lower, upper)`` (the stream's ``uniform_`` over the whole tensor, one counter per element),
which ``noise`` records (1 for the others); not training, the fixed slope ``(lower + upper) / 2``
for ``x < 0``, ``noise`` untouched, as the CPU's kernel.

``_standard_gamma`` (and ``_sample_dirichlet``, gamma samples over their row's sum) is
Marsaglia and Tsang's method on the stream's normal and uniform draws, every element at once:
a round draws ``z`` and ``u`` for all, and accepts ``d v`` (``d = α - 1/3``, ``v = (1 + z / sqrt(9 d))^3``)
where ``ln u < z^2 / 2 + d - d v + d ln v``; elements not yet accepted take the next round
(each round accepts at least 95%: after eight, whether any is left is read back, a host sync,
and another eight run if so). ``α < 1`` samples ``α + 1`` and scales by ``u^(1/α)``. Results
are at least float32's smallest normal, as the CPU's are. The values are the device's, not
the CPU generator's: the distribution is what they share.

``poisson``: below rate 10, Knuth's count of uniforms whose running product stays above
``exp(-λ)``; from 10, Hörmann's transformed rejection (PTRS), both in rounds over every element
as the gamma sampler (a readback every eight rounds; the count method's rounds advance its
product). Rate 0 gives 0.

``binomial``: with ``q = min(p, 1 - p)`` (a count of failures when ``p > 1/2``, flipped back),
inversion below ``n q = 10`` (the running probability ``P(k)`` walked up from ``(1 - q)^n``
until the cumulative passes ``u``), Hörmann's BTRS from 10; in rounds as above.

The CPU's argument checks (negative, infinite or NaN weights, a zero row) read two flags back
from the device: a host sync, as the CPU's kernel inspects the weights too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _check(weights: torch.Tensor, samples: int, replacement: bool) -> None:
    categories = weights.shape[-1]
    if not replacement and samples > categories:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    bad_entry = (~torch.isfinite(weights) | (weights < 0)).any()
    zero_row = (weights.sum(-1) <= 0).any()
    flags = torch.stack([bad_entry, zero_row]).tolist()  # the host sync the module docstring names
    if flags[0]:
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")  # the CPU's words
    if flags[1]:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


def _multinomial(self, num_samples, replacement=False, *, generator=None):
    if self.dim() not in (1, 2) or not self.is_floating_point() or num_samples <= 0 or self.shape[-1] == 0:
        return NotImplemented  # the CPU's errors and empty results
    _check(self, num_samples, replacement)
    weights = self.reshape(-1, self.shape[-1]).float()
    rows, categories = weights.shape
    if replacement:
        cumulative = torch.cumsum(weights, dim=-1)
        u = torch.empty((rows, num_samples), dtype=torch.float32, device=self.device)
        u = u.uniform_(0, 1, generator=generator)
        target = u * cumulative[:, -1:]
        chosen = (cumulative.unsqueeze(1) <= target.unsqueeze(2)).to(torch.int64).sum(-1)
        positions = torch.arange(categories, device=self.device)
        last_positive = torch.where(weights > 0, positions, 0).amax(-1, keepdim=True)
        drawn = torch.minimum(chosen, last_positive)
    else:
        race = torch.empty((rows, categories), dtype=torch.float32, device=self.device)
        race = race.exponential_(1.0, generator=generator)
        keys = weights / race
        drawn = torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :num_samples]
    return drawn.reshape(self.shape[:-1] + (num_samples,))


def _rrelu_with_noise(self, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    if not self.is_floating_point():
        return NotImplemented  # the CPU's error
    if not training:
        return torch.where(self < 0, self * ((lower + upper) / 2), self)
    slope = torch.empty(self.shape, dtype=torch.float32, device=self.device).uniform_(lower, upper,
                                                                                     generator=generator)
    negative = self <= 0
    one = torch.ones((), dtype=slope.dtype, device=self.device)
    noise.copy_(torch.where(negative, slope, one).to(noise.dtype))
    return torch.where(negative, (self.float() * slope).to(self.dtype), self)


#: Marsaglia–Tsang rounds run between two checks for elements still to accept.
_GAMMA_ROUNDS = 8


def _uniform(like: torch.Tensor, generator) -> torch.Tensor:
    return torch.empty(like.shape, dtype=torch.float32, device=like.device).uniform_(0, 1, generator=generator)


def _gamma(alpha: torch.Tensor, generator) -> torch.Tensor:
    """Gamma(α, 1) samples in float32 (see the module docstring)."""
    a = alpha.float()
    small = a < 1
    d = torch.where(small, a + 1, a) - 1.0 / 3.0
    c = torch.rsqrt(9 * d)
    result = torch.zeros_like(a)
    pending = torch.ones(a.shape, dtype=torch.bool, device=a.device)
    while True:
        for _ in range(_GAMMA_ROUNDS):
            z = torch.empty(a.shape, dtype=torch.float32, device=a.device).normal_(0, 1, generator=generator)
            u = _uniform(a, generator)
            t = 1 + c * z
            v = t * t * t
            accept = pending & (t > 0) & (torch.log(u) < 0.5 * z * z + d - d * v + d * torch.log(v))
            result = torch.where(accept, d * v, result)
            pending = pending & ~accept
        if not bool(pending.any().item()):  # the host sync the module docstring names
            break
    shrink = torch.pow(_uniform(a, generator), 1 / a)
    result = torch.where(small, result * shrink, result)
    return result.clamp(min=torch.finfo(torch.float32).tiny)


def _standard_gamma(self, generator=None):
    if not self.is_floating_point() or self.numel() == 0:
        return NotImplemented  # the CPU's error; its empty result
    return _gamma(self, generator).to(self.dtype)


def _sample_dirichlet(self, generator=None):
    if not self.is_floating_point() or self.numel() == 0:
        return NotImplemented
    samples = _gamma(self, generator)
    return (samples / samples.sum(-1, keepdim=True)).to(self.dtype)


def _poisson_small(rate: torch.Tensor, generator) -> torch.Tensor:
    """Knuth: the number of uniforms multiplied before the product falls to ``exp(-rate)``."""
    limit = torch.exp(-rate)
    product = torch.ones_like(rate)
    count = torch.zeros_like(rate)
    while True:
        for _ in range(_GAMMA_ROUNDS):
            product = product * _uniform(rate, generator)
            going = product > limit
            count = count + going.to(count.dtype)
        if not bool((product > limit).any().item()):
            return count


def _poisson_large(rate: torch.Tensor, generator) -> torch.Tensor:
    """Hörmann's PTRS (transformed rejection with squeeze) for rates of 10 and more."""
    root, log_rate = torch.sqrt(rate), torch.log(rate)
    b = 0.931 + 2.53 * root
    a = -0.059 + 0.02483 * b
    log_inverse_alpha = torch.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2)
    result = torch.zeros_like(rate)
    pending = torch.ones(rate.shape, dtype=torch.bool, device=rate.device)
    while True:
        for _ in range(_GAMMA_ROUNDS):
            u = _uniform(rate, generator) - 0.5
            v = _uniform(rate, generator)
            us = 0.5 - u.abs()
            k = torch.floor((2 * a / us + b) * u + rate + 0.43)
            quick = (us >= 0.07) & (v <= vr)
            rejected = (k < 0) | ((us < 0.013) & (v > us))
            bound = -rate + k * log_rate - torch.lgamma(k + 1)
            slow = ~rejected & (torch.log(v) + log_inverse_alpha - torch.log(a / (us * us) + b) <= bound)
            accept = pending & (quick | slow)
            result = torch.where(accept, k, result)
            pending = pending & ~accept
        if not bool(pending.any().item()):
            return result


def _poisson(self, generator=None):
    if not self.is_floating_point() or self.numel() == 0:
        return NotImplemented  # the CPU's error; its empty result
    rate = self.float()
    large = rate >= 10
    small_rate = torch.where(large, torch.zeros_like(rate), rate)
    counts = _poisson_small(small_rate, generator)
    if bool(large.any().item()):
        counts = torch.where(large, _poisson_large(torch.where(large, rate, 10.0), generator), counts)
    return counts.to(self.dtype)


def _binomial_inversion(n: torch.Tensor, q: torch.Tensor, generator) -> torch.Tensor:
    u = _uniform(n, generator)
    ratio = q / (1 - q)
    term = torch.exp(n * torch.log1p(-q))  # P(0)
    cumulative = term
    k = torch.zeros_like(n)
    while True:
        for _ in range(_GAMMA_ROUNDS):
            going = (cumulative < u) & (k < n)
            term = term * (n - k) / (k + 1) * ratio
            k = k + going.to(k.dtype)
            cumulative = torch.where(going, cumulative + term, cumulative)
        if not bool(((cumulative < u) & (k < n)).any().item()):
            return k


def _binomial_btrs(n: torch.Tensor, q: torch.Tensor, generator) -> torch.Tensor:
    spq = torch.sqrt(n * q * (1 - q))
    b = 1.15 + 2.53 * spq
    a = -0.0873 + 0.0248 * b + 0.01 * q
    c = n * q + 0.5
    vr = 0.92 - 4.2 / b
    alpha = (2.83 + 5.1 / b) * spq
    log_odds = torch.log(q / (1 - q))
    m = torch.floor((n + 1) * q)
    h = torch.lgamma(m + 1) + torch.lgamma(n - m + 1)
    result = torch.zeros_like(n)
    pending = torch.ones(n.shape, dtype=torch.bool, device=n.device)
    while True:
        for _ in range(_GAMMA_ROUNDS):
            u = _uniform(n, generator) - 0.5
            v = _uniform(n, generator)
            us = 0.5 - u.abs()
            k = torch.floor((2 * a / us + b) * u + c)
            inside = (k >= 0) & (k <= n)
            quick = (us >= 0.07) & (v <= vr)
            bound = h - torch.lgamma(k + 1) - torch.lgamma(n - k + 1) + (k - m) * log_odds
            slow = torch.log(v * alpha / (a / (us * us) + b)) <= bound
            accept = pending & inside & (quick | slow)
            result = torch.where(accept, k, result)
            pending = pending & ~accept
        if not bool(pending.any().item()):
            return result


def _binomial(count, prob, generator=None):
    if not count.is_floating_point() or count.numel() == 0:
        return NotImplemented  # the CPU's error; its empty result
    n, p = torch.broadcast_tensors(count.float(), prob.float())
    flipped = p > 0.5
    q = torch.where(flipped, 1 - p, p)
    large = n * q >= 10
    safe_q = torch.where(q > 0, q, 0.5)  # q = 0 draws nothing; kept finite for the formulas
    k = _binomial_inversion(torch.where(large, 0.0, n), safe_q, generator)
    if bool(large.any().item()):
        drawn = _binomial_btrs(torch.where(large, n, 100.0), torch.where(large, safe_q, 0.5), generator)
        k = torch.where(large, drawn, k)
    k = torch.where(q > 0, k, 0.0)
    return torch.where(flipped, n - k, k).to(count.dtype)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` and in-place forms follow)."""
    return {aten.multinomial.default: _multinomial, aten.rrelu_with_noise.default: _rrelu_with_noise,
            aten._standard_gamma.default: _standard_gamma, aten._sample_dirichlet.default: _sample_dirichlet,
            aten.poisson.default: _poisson, aten.binomial.default: _binomial}
