"""The coverage audit (:func:`accelkit.sdk.op_coverage`) against what really runs.

The audit reads a backend's registrations without running anything; here every one-tensor
op it lists is run once on the device and the op counters must show the path the audit
named: ``native``/``derived`` as native, ``decomposed`` as decomposed, ``fallback`` and
``cpu_by_design`` (declared by the backend, with its reason) as the CPU fallback. An op the audit says ``runs as`` its ``out=`` form is counted under that form;
PyTorch's composite kernels are never counted (they are only their parts).

Device-generic (``--accelkit-device tpu|neuron`` runs it on another backend).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import accelkit
from accelkit.sdk import op_coverage
from accelkit.sdk.testing import device_under_test

DEVICE = device_under_test()
COUNTED_AS = {"native": "native", "derived": "native", "decomposed": "decomposed", "fallback": "fallback",
              "cpu_by_design": "fallback"}


def one_tensor_ops(coverage: dict[str, dict[str, str]]) -> list[tuple[torch._ops.OpOverload, dict[str, str]]]:
    """Functional overloads taking one tensor and nothing else required, returning one tensor."""
    found = []
    for name, row in coverage.items():
        _, base, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, base), overload)
        schema = op._schema
        required = [a for a in schema.arguments if not a.has_default_value()]
        if (len(required) == 1 and str(required[0].type) == "Tensor" and not required[0].kwarg_only
                and len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor"
                and not schema.is_mutable and row["path"] != "refused"):
            found.append((op, row))
    return found


def test_the_audit_covers_every_aten_overload_with_a_cpu_kernel_once():
    coverage = op_coverage()
    with_cpu_kernels = {
        name.removeprefix("aten::") for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")
    }
    listed = {name.removeprefix("aten.").removesuffix(".default") for name in coverage}
    assert listed == with_cpu_kernels
    assert {row["path"] for row in coverage.values()} <= {"native", "derived", "decomposed", "fallback",
                                                          "cpu_by_design", "refused"}
    assert all(row["detail"] for row in coverage.values())


def test_the_paths_the_audit_names_are_the_paths_ops_take():
    coverage = op_coverage()
    x = torch.linspace(0.1, 0.9, 6)
    checked, wrong = 0, []
    for op, row in one_tensor_ops(coverage):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                op(x.clone())
            except Exception:  # noqa: BLE001 - not defined for this input on the CPU either
                continue
            device_x = x.to(DEVICE)
            accelkit.reset_stats()
            with accelkit.fallback_policy("allow"):
                try:
                    op(device_x)
                except Exception:  # noqa: BLE001 - a refusal (a dtype rule) is not a path
                    continue
        counted_op = row["detail"].removeprefix("runs as ").split(":")[0] if row["detail"].startswith("runs as ") \
            else str(op)
        counts = accelkit.stats()["ops"].get(counted_op, {})
        got = sorted(kind for kind, n in counts.items() if n)
        expected = [] if row["detail"].endswith("PyTorch's composite kernel") else [COUNTED_AS[row["path"]]]
        checked += 1
        if got != expected:
            wrong.append(f"{op}: audit {row}, counted {counts}")
    assert checked >= 50
    assert wrong == []


def test_without_an_active_backend_the_audit_says_what_to_do():
    from accelkit import _runtime

    active = _runtime._active
    _runtime._active = None
    try:
        with pytest.raises(accelkit.AccelkitError, match="select_device"):
            op_coverage()
    finally:
        _runtime._active = active
