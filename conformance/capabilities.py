"""The capability table: which tests belong to which declared capability, and the table rows.

A backend declares its surface in ``[capabilities]`` of its ``conformance.toml`` (names and
meanings: :data:`accelkit.sdk.CAPABILITIES`; ``true``, or the reason it is not supported).
The ``capabilities`` suite probes each declared one first (``suites/test_capabilities.py``);
other suites' tests that exercise a capability are mapped to it by :func:`capability_of`, so
the report can say, per capability: declared or not, tests run, passed. The tests of a
capability that is not declared are declared skips with its reason.

Pure standard library, like the rest of the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The capabilities, in the table's order (the same names as ``accelkit.sdk.CAPABILITIES``).
NAMES = ("compile", "dynamic_shapes", "distributed", "device_generators", "pinned_memory", "multi_device",
         "streams_events", "sparse")
#: The reason shown for a capability the backend's file leaves out.
UNDECLARED = "not declared in the backend's conformance.toml [capabilities]"


def capability_of(suite: str, subject: str | None) -> str | None:
    """The capability a test of ``suite`` about ``subject`` exercises, if any."""
    subject = subject or ""
    if suite == "capabilities":  # the probes: capability[<name>]
        name = subject.removeprefix("capability[").removesuffix("]")
        return name if name in NAMES else None
    if suite == "distributed":
        return "distributed"
    if suite == "dynamic":
        if subject.endswith("compile_dynamic"):
            return "dynamic_shapes"
        if "compile_" in subject:
            return "compile"
        return None
    if suite in ("ops", "modules") and "sparse" in subject:
        return "sparse"
    return None


def declaration(declared: Mapping[str, Any], name: str) -> bool | str:
    """``True`` when ``name`` is declared, else the reason it is not supported (or not declared)."""
    value = declared.get(name)
    return True if value is True else value if isinstance(value, str) else UNDECLARED


def rows(declared: Mapping[str, Any], records: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per capability: its declaration, its probe's outcome, and the tests mapped to it that ran
    (not skipped) and passed. A declared capability whose tests fail is bad (``ok`` False)."""
    out = []
    for name in NAMES:
        mapped = [r for r in records if capability_of(r["suite"], r.get("op")) == name]
        probe = next((r["outcome"] for r in mapped if r["suite"] == "capabilities"), None)
        ran = [r for r in mapped if not r["outcome"].startswith("skip")]
        passed = sum(1 for r in ran if r["outcome"] in ("pass", "xfail"))
        value = declaration(declared, name)
        out.append({"capability": name, "declared": value is True, "reason": None if value is True else value,
                    "probe": probe, "ran": len(ran), "passed": passed,
                    "ok": value is not True or passed == len(ran)})
    return out
