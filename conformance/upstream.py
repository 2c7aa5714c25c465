"""What PyTorch's own OpInfo and ModuleInfo entries say about comparing with the CPU.

PyTorch decorates its device-vs-CPU comparisons (``TestCommon.test_compare_cpu`` for ops,
``TestModule.test_cpu_gpu_parity`` for modules) with skips, expected failures and tolerances
that hold on every device. The suites honour the ones that are not specific to a device type:
a skip or expected failure becomes a ``skip-other`` with PyTorch's reason, a tolerance widens
the default.
"""

from __future__ import annotations

import unittest
from typing import Any, NamedTuple

import torch
from torch.testing._internal.common_device_type import (
    precisionOverride,
    toleranceOverride,
)
from torch.testing._internal.opinfo.core import DecorateInfo

from accelkit_conformance.compare import tolerance_for

OP_TEST = ("TestCommon", "test_compare_cpu")
MODULE_TEST = ("TestModule", "test_cpu_gpu_parity")


class Tol(NamedTuple):
    atol: float
    rtol: float


def _active(decorators: Any, test: tuple[str, str], dtype: torch.dtype):
    for info in decorators:
        if (
            isinstance(info, DecorateInfo)
            and info.test_name == test[1]
            and info.cls_name in (None, test[0])
            and info.device_type is None
            and info.is_active(test[0], test[1], None, dtype, {})
        ):
            yield from info.decorators


def skip_reason(decorators: Any, test: tuple[str, str], dtype: torch.dtype, subject: str) -> str | None:
    """PyTorch's reason to skip comparing ``subject`` with the CPU in ``dtype``, if it has one."""
    for decorator in _active(decorators, test, dtype):
        if decorator is unittest.expectedFailure:
            return f"PyTorch expects comparing {subject} with the CPU to fail ({test[0]}.{test[1]})"
        closure = getattr(decorator, "__closure__", None) or ()
        reasons = [c.cell_contents for c in closure if isinstance(c.cell_contents, str)]
        if reasons:
            return f"PyTorch skips comparing {subject} with the CPU: {reasons[0]}"
    return None


def tolerance(decorators: Any, test: tuple[str, str], dtype: torch.dtype) -> Tol | None:
    """PyTorch's tolerance override for the comparison in ``dtype``, widened to at least the
    suite's default, or None when it has none."""
    atol, rtol = tolerance_for(dtype)
    found = False
    for decorator in _active(decorators, test, dtype):
        if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
            found = True
            atol, rtol = max(atol, decorator.d[dtype].atol), max(rtol, decorator.d[dtype].rtol)
        elif isinstance(decorator, precisionOverride) and dtype in decorator.d:
            found = True
            atol = max(atol, decorator.d[dtype])
    return Tol(atol, rtol) if found else None


def skip_test_fn_lookup() -> None:
    """Stop PyTorch's sample generators from crawling the stack for a unittest test method.

    ``op.sample_inputs`` calls ``extract_test_fn()`` twice, which runs ``inspect.stack()``
    (source context for every frame: about 0.3 s under pytest) to find a
    ``unittest.TestCase`` method carrying per-sample skips. The suites' tests are plain
    functions, so the crawl always returns None; answering None directly is the same
    behaviour without the cost.
    """
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    common_utils.extract_test_fn = core.extract_test_fn = lambda: None
