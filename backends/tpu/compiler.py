"""tpu's ``torch.compile`` backend: each functional aten graph becomes one XLA program.

The graph is interpreted, node by node, with the same lowerings the eager kernels run
(:mod:`.lowering`; plus :mod:`.graph_ops` for the views, factories and copies the runtime owns
eagerly), inside one traced JAX function that is jitted: one op library for both paths, so
whatever runs eagerly compiles, and XLA fuses across op boundaries. What surrounds it (Dynamo,
AOTAutograd, input mutations, splitting, statistics) is the runtime's, reached through
:func:`accelkit.sdk.graph_compiler`.

- **inputs** arrive as the device arrays of the tensors with their geometry (a view is read
  inside the program, as eagerly); outputs leave as device arrays adopted by new tensors: no
  host copies.
- **shapes**: a program is specialised to its inputs' shapes and views; symbolic sizes
  (``dynamic=True``) arrive as Python ints and are static, so each new concrete shape compiles
  one more XLA executable of the same graph — counted in ``stats()["compile"]``.
- **random ops** compute the device stream from the draw the runtime reserved for each random
  node at the call (the counters the same op draws eagerly), so compiled and eager values agree.
- **device-side checks** (an index out of range) are folded into one status per program and
  raised as eagerly: at the call in debug mode, at the next synchronisation in strict mode.
- **persistent cache**: JAX's compilation cache in the directory the user names.
"""

from __future__ import annotations

from typing import Any

from accelkit.sdk import graph_compiler, hookimpl


def _lowering() -> Any:
    from accelkit_backends.tpu.graph_lowering import TpuGraphLowering

    return TpuGraphLowering()


@hookimpl
def accelkit_make_compiler() -> Any:
    return graph_compiler(_lowering)
