"""Run profiles: how much of each suite a run covers.

``quick`` is for CI (a few minutes per backend): every OpInfo in float32 on its first samples,
forward and backward, module forward passes, and all contract and dynamic-shape cases.
``full`` runs every sample of every OpInfo and module in the default dtypes, forward and
backward. Both are deterministic: the same profile selects the same tests on every run.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DTYPES = ("float32", "bfloat16", "int64", "bool")


@dataclass(frozen=True)
class Profile:
    """How much of each suite to run.

    :ivar dtypes: dtypes the ops and modules suites run in (``--dtypes`` overrides).
    :ivar op_samples: sample inputs per op test (None: all of them). Tests declared as
        expected failures always run every sample, so a pass (xpass) means the op passes.
    :ivar op_backward: run the backward variant of ops that support autograd.
    :ivar module_inputs: module inputs per module test (None: all of them).
    :ivar module_backward: run the backward variant of modules.
    :ivar timeout: default per-test timeout in seconds.
    :ivar fast_compile: ask the backend to compile quickly rather than well
        (``ACCELKIT_FAST_COMPILE=1``, see :func:`accelkit.sdk.fast_compile`): each program runs
        once or twice, so compiling is most of a run on a backend that compiles per op.
    """

    name: str
    dtypes: tuple[str, ...]
    op_samples: int | None
    op_backward: bool
    module_inputs: int | None
    module_backward: bool
    timeout: float
    fast_compile: bool = False


PROFILES = {
    "quick": Profile("quick", ("float32",), op_samples=2, op_backward=True, module_inputs=2,
                     module_backward=False, timeout=120.0, fast_compile=True),
    "full": Profile("full", DEFAULT_DTYPES, op_samples=None, op_backward=True, module_inputs=None,
                    module_backward=True, timeout=600.0),
}


def get(name: str) -> Profile:
    """The profile called ``name``; raises ValueError naming the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; use one of {', '.join(PROFILES)}") from None
