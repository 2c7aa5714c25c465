"""Errors a tile program raises when it breaks a NeuronCore rule (never a silent success)."""

from __future__ import annotations


class NeuronKernelError(RuntimeError):
    """A tile program asked for something the NeuronCore cannot do; the message names the
    kernel, the rule and the limit."""


class TileShapeError(NeuronKernelError):
    """A tile breaks a shape rule: more than 128 partitions, or a matmul operand over its limit."""


class SbufOverflowError(NeuronKernelError):
    """The tiles alive at once need more SBUF than a partition has."""


class PsumOverflowError(NeuronKernelError):
    """The accumulators alive at once need more PSUM banks than the core has."""


class NeuronDtypeError(RuntimeError):
    """A value or dtype the NeuronCore cannot hold under the active dtype policy.

    A RuntimeError, not a TypeError: torch turns a TypeError raised inside `x + y` into
    NotImplemented, which would hide the message.
    """
