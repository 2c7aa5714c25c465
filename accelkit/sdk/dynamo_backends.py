"""``torch.compile(model, backend="<name>")`` for every accelkit backend.

Dynamo finds compiler backends through the entry-point group ``torch_dynamo_backends``; a
backend's package declares ``<name> = "accelkit.sdk.dynamo_backends:<name>"`` there. The
attribute ``<name>`` of this module is a compiler function that hands each captured graph to
the active backend's ``accelkit_make_compiler`` answer, so nothing compile-related is imported
until a model is compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def __getattr__(name: str) -> Callable[..., Any]:
    if name.startswith("__"):
        raise AttributeError(name)
    from accelkit.sdk._runtime_link import compiler_for

    return compiler_for(name)
