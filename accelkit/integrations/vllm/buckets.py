"""Bucketed batch shapes: each step's sizes rounded up to a few fixed values.

On tpu and neuron every distinct shape is one more compiled program, so a step with 13 tokens
after one with 12 would compile the whole model again. The model runner pads the step's token
count, and the attention metadata builder pads the number of requests, the query length and the
block-table width, each to a power of two (at least a floor, at most the configured limit), so a
server in steady state reuses programs it has already compiled.
"""

from __future__ import annotations

MIN_TOKENS = 16  # a step's token count (the model's batch dimension)
MIN_REQS = 8  # requests in a step (attention's batch dimension)


def bucket(n: int, lo: int, hi: int) -> int:
    """The smallest power of two >= ``n`` and >= ``lo``, but at most ``hi`` (``n <= hi``).

    ``hi`` itself is a bucket even when it is not a power of two.
    """
    if n > hi:
        raise ValueError(f"size {n} exceeds its limit {hi}")
    b = max(1, lo)
    while b < n:
        b *= 2
    return min(b, hi)


def buckets(lo: int, hi: int) -> list[int]:
    """Every value :func:`bucket` can return for ``1 <= n <= hi``."""
    return sorted({bucket(n, lo, hi) for n in (1 << i for i in range(hi.bit_length() + 1)) if n <= hi} | {bucket(hi, lo, hi)})
