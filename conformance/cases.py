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

#: In the order a run starts them: the capability probes first (they say what the suites can rely
#: on), then the suites whose tests take longest, so that no worker is left with them at the end.
SUITE_FILES = {
    "capabilities": "test_capabilities.py",
    "distributed": "test_distributed.py",
    "dynamic": "test_dynamic.py",
    "ops": "test_ops.py",
    "modules": "test_modules.py",
    "contract": "test_contract.py",
}
_FILE_SUITES = {name: suite for suite, name in SUITE_FILES.items()}
DTYPE_NAMES = frozenset({
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
    "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
})
_NODEID = re.compile(r"^(?:.*/)?(?P<file>test_\w+\.py)::(?P<func>\w+)(?:\[(?P<param>.*)\])?$")
#: A test of a PyTorch-style file outside the suites: ``path/test_x.py::TestClassDEVICE::test_name``.
_UPSTREAM = re.compile(r"^(?P<path>(?:.*/)?(?P<file>test_\w+\.py))::(?P<cls>\w+)::(?P<func>\w+)$")
#: Device-type suffixes ``instantiate_device_type_tests`` gives class and test names.
_DEVICE_WORDS = ("PRIVATEUSE1", "privateuse1")


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


def parse_nodeid(nodeid: str, backend: str | None = None) -> Case | None:
    """The :class:`Case` of a conformance node id, or None for a test outside the suites.

    A class-based test in a file outside ``suites/`` is an ``upstream`` test (see
    :func:`upstream_case`); ``backend`` names the device its instantiated names carry.
    """
    if not nodeid.startswith("suites/"):
        upstream = upstream_case(nodeid, backend)
        if upstream is not None:
            return upstream
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


def upstream_case(nodeid: str, backend: str | None = None) -> Case | None:
    """The :class:`Case` of a test of PyTorch's own device-generic files, with its names
    normalised: ``instantiate_device_type_tests`` names the class ``TestFooPRIVATEUSE1`` or
    ``TestFooTPU`` and the test ``test_bar_privateuse1_float32`` or ``test_bar_tpu_float32``
    depending on what ran before, so the device suffixes are dropped and a trailing dtype
    becomes the record's dtype: ``upstream/test_x.py::TestFoo::test_bar`` in ``float32``.
    """
    m = _UPSTREAM.match(nodeid)
    if m is None:
        return None
    words = [*_DEVICE_WORDS, *((backend.upper(), backend) if backend else ())]
    cls = m["cls"]
    for word in words:
        if cls.endswith(word) and len(cls) > len(word):
            cls = cls[: -len(word)]
            break
    func, dtype = m["func"], None
    head, _, last = func.rpartition("_")
    if last in DTYPE_NAMES and head:
        func, dtype = head, last
    for word in words:
        if func.endswith("_" + word):
            func = func[: -len(word) - 1]
            break
    return Case("upstream", f"{m['file']}::{cls}::{func}", dtype)
