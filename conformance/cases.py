"""What a conformance test is about, derived from its pytest node id alone.

The controller process never collects tests (xdist workers do), and a crashed worker sends no
report, so the suite, subject, dtype and variant of a test must be readable from the node id.
The suites build their parameter ids with :func:`param_id`; :func:`parse_nodeid` reads them.

Node ids are relative to the ``conformance`` package directory::

    suites/test_ops.py::test_op[nn.functional.relu-float32-forward]
    suites/test_modules.py::test_module[torch.nn.Linear-float32-backward]
    suites/test_contract.py::test_serialization_roundtrip
    suites/test_contract.py::test_transfer_roundtrip[bfloat16]      (dtype bfloat16)
    suites/test_contract.py::test_rng_reproduces[randn]             (subject rng_reproduces[randn])
    suites/test_dynamic.py::test_dynamic[mlp.compile_dynamic-float32]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUITE_FILES = {
    "ops": "test_ops.py",
    "modules": "test_modules.py",
    "contract": "test_contract.py",
    "dynamic": "test_dynamic.py",
    "distributed": "test_distributed.py",
}
_FILE_SUITES = {name: suite for suite, name in SUITE_FILES.items()}
DTYPE_NAMES = frozenset({
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
    "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
})
_NODEID = re.compile(r"^(?:.*/)?(?P<file>test_\w+\.py)::(?P<func>\w+)(?:\[(?P<param>.*)\])?$")


@dataclass(frozen=True)
class Case:
    """The identity of one conformance test (the record fields ``suite``, ``op``, ``dtype``,
    ``variant``)."""

    suite: str
    op: str | None
    dtype: str | None = None
    variant: str | None = None


def param_id(*parts: str) -> str:
    """The pytest parameter id for a test about ``parts`` (subject first, e.g. op, dtype, variant)."""
    for part in parts[1:]:
        if "-" in part:
            raise ValueError(f"id part {part!r} must not contain '-'")
    return "-".join(parts)


def parse_nodeid(nodeid: str) -> Case | None:
    """The :class:`Case` of a conformance node id, or None for a test outside the suites."""
    m = _NODEID.match(nodeid)
    if m is None or m["file"] not in _FILE_SUITES:
        return None
    suite, func, param = _FILE_SUITES[m["file"]], m["func"], m["param"]
    if suite in ("ops", "modules") and param:
        op, dtype, variant = param.rsplit("-", 2)
        return Case(suite, op, dtype, variant)
    if suite == "dynamic" and param:
        op, dtype = param.rsplit("-", 1)
        return Case(suite, op, dtype)
    subject = func.removeprefix("test_")
    if param and param not in DTYPE_NAMES:
        return Case(suite, f"{subject}[{param}]")
    return Case(suite, subject, param or None)
