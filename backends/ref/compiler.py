"""ref's torch.compile backend: AOT-traced aten graphs, run op by op on the device.

It compiles nothing — the graph's ops go through the same dispatch pipeline as eager code —
but it exercises the whole path a real compiler plugs into (Dynamo capture, AOT autograd's
forward and backward aten graphs on device tensors).
"""

from __future__ import annotations

from typing import Any

from accelkit.sdk import hookimpl


def compile_graph(gm: Any, example_inputs: list) -> Any:
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def run_eagerly(graph: Any, inputs: list) -> Any:
        return make_boxed_func(graph.forward)

    return aot_autograd(fw_compiler=run_eagerly, bw_compiler=run_eagerly)(gm, example_inputs)


@hookimpl
def accelkit_make_compiler() -> Any:
    return compile_graph
