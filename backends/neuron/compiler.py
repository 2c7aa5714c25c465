"""neuron's ``torch.compile`` backend: each functional aten graph becomes one program of the
eager tile kernels (see :mod:`.graph_lowering`). Dynamo, AOTAutograd, input mutations,
splitting at ops without a kernel, statistics and bucketing are the runtime's, reached through
:func:`accelkit.sdk.graph_compiler`."""

from __future__ import annotations

from typing import Any

from accelkit.sdk import graph_compiler, hookimpl


def _lowering() -> Any:
    from accelkit_backends.neuron.graph_lowering import NeuronGraphLowering

    return NeuronGraphLowering()


@hookimpl
def accelkit_make_compiler() -> Any:
    return graph_compiler(_lowering)
