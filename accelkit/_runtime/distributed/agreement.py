"""Agreement between ranks before a collective moves a byte.

Gloo aborts the whole process (``terminate called ... EnforceNotMet``) when two ranks pass
tensors of different sizes to one collective, and hangs until the timeout when they call
different collectives. So every collective of a host-staged group first all-gathers one small
fingerprint per rank: whether the rank's own arguments are valid, a hash of what must be equal on
every rank (the collective, reduce op, root, dtype and sizes), and for all-to-all the element
counts it sends to and expects from each peer. Every rank sees the same gathered fingerprints, so
on any disagreement every rank raises the same :class:`CollectiveMismatchError`, after swapping
full descriptions through the group's store to name each rank's arguments.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from accelkit._errors import AccelkitError

#: A dtype's position here is its code in the fingerprints and send/recv headers.
DTYPE_CODES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
    torch.uint64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
)


class CollectiveError(AccelkitError, dist.DistBackendError):
    """A collective failed: a rank timed out, died, or the transport broke. The message names
    the collective, the group, this rank and what to check."""


class CollectiveMismatchError(CollectiveError, ValueError):
    """The ranks called one collective with arguments that do not fit together (different
    collectives, sizes, dtypes, roots or reduce ops; all-to-all splits that do not match). Raised
    on every rank, before any data moves, with every rank's arguments."""


def describe_tensor(tensor: torch.Tensor) -> str:
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype}{list(tensor.shape)}"


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPE_CODES.index(dtype) if dtype in DTYPE_CODES else len(DTYPE_CODES)


@dataclass
class Fingerprint:
    """What one rank brings to a collective.

    :ivar summary: human-readable arguments, shown when ranks disagree.
    :ivar same: what must be identical on every rank (hashed).
    :ivar sends: for all-to-all, elements sent to each rank; else empty.
    :ivar receives: for all-to-all, elements expected from each rank; else empty.
    :ivar problem: why this rank's own arguments are invalid, if they are.
    """

    summary: str
    same: tuple = ()
    sends: Sequence[int] = ()
    receives: Sequence[int] = ()
    problem: str | None = None

    def packed(self, world: int) -> bytes:
        """This rank's row of the gathered table: int64 ``[valid, digest, sends..., receives...]``
        (``2 + 2 * world`` numbers). Rows of fingerprints seen before are remembered: a training
        loop repeats the same few collectives."""
        sends = tuple(self.sends) or (0,) * world
        receives = tuple(self.receives) or (0,) * world
        if len(sends) != world or len(receives) != world:
            sends, receives = (0,) * world, (0,) * world
            self.problem = self.problem or f"splits must have {world} entries, one per rank"
        key = (repr(self.same), sends, receives, not self.problem)
        row = _ROWS.get(key)
        if row is None:
            if len(_ROWS) >= _ROWS_KEPT:
                _ROWS.clear()
            row = _ROWS[key] = _row(*key)
        return row

    def agrees_with(self, rows: Sequence[bytes], mine: bytes) -> bool:
        """Whether gathered ``rows`` show agreement at a glance: every row is ``mine``, which is
        valid and sends nothing per peer (every collective but all-to-all). False means: read
        the table with :func:`disagreement`."""
        return not self.problem and not self.sends and not self.receives and all(row == mine for row in rows)


#: Packed rows by fingerprint (see :meth:`Fingerprint.packed`); cleared when full.
_ROWS: dict[tuple, bytes] = {}
_ROWS_KEPT = 1024


def _row(same: str, sends: tuple, receives: tuple, valid: bool) -> bytes:
    digest = hashlib.blake2b(same.encode(), digest_size=8).digest()
    head = (1 if valid else 0, int.from_bytes(digest, "little") >> 1)
    return struct.pack(f"<{len(head) + len(sends) + len(receives)}q", *head, *sends, *receives)


@dataclass
class Disagreement:
    """Which ranks stand out in a gathered fingerprint table."""

    invalid: list[int] = field(default_factory=list)
    differing: list[int] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.invalid or self.differing or self.splits)


def disagreement(table: torch.Tensor) -> Disagreement:
    """Read the gathered ``[world, 2 + 2 * world]`` fingerprints (identical on every rank)."""
    world = table.shape[0]
    rows = table.tolist()
    found = Disagreement()
    found.invalid = [r for r in range(world) if rows[r][0] != 1]
    found.differing = [r for r in range(world) if rows[r][1] != rows[0][1]]
    for sender in range(world):
        for receiver in range(world):
            sent = rows[sender][2 + receiver]
            expected = rows[receiver][2 + world + sender]
            if sent != expected:
                found.splits.append(
                    f"rank {sender} sends {sent} elements to rank {receiver}, which expects {expected}"
                )
    return found


def mismatch_message(what: str, group: str, found: Disagreement, summaries: Sequence[Any]) -> str:
    """The error every rank raises; ``summaries`` are the ranks' ``(summary, problem)``."""
    lines = [f"{what} on process group {group!r}: the ranks' arguments do not fit together, so "
             "nothing was sent (gloo would abort the process on mismatched sizes)."]
    for rank, (summary, problem) in enumerate(summaries):
        note = f"  <- {problem}" if problem else ""
        lines.append(f"  rank {rank}: {summary}{note}")
    if found.differing and not found.invalid:
        lines.append("  every rank must call the same collective with the same dtype, sizes, root and reduce op")
    lines.extend(f"  {line}" for line in found.splits[:8])
    return "\n".join(lines)


def exchange_summaries(store: Any, key: str, rank: int, world: int, mine: Fingerprint) -> list[Any]:
    """Swap every rank's ``(summary, problem)`` through the store (on the error path only)."""
    store.set(f"{key}/{rank}", json.dumps([mine.summary, mine.problem]))
    return [json.loads(store.get(f"{key}/{r}")) for r in range(world)]
