"""One line per failing test: its likely cause and what to do about it.

Read from the record alone (outcome, reason, dtype, the ops that ran on the CPU fallback), so
the report can say it for any backend, old results included. The first rule that fits wins;
every failure gets a line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .schema import CRASH, TIMEOUT


def _where(record: Mapping[str, Any]) -> str:
    subject = record.get("op") or record["id"]
    return f"{record['suite']}/{subject}"


def remedy(record: Mapping[str, Any]) -> str:
    """The likely cause of ``record``'s failure and the fix, in one line."""
    reason = record.get("reason") or ""
    dtype = record.get("dtype")
    where = _where(record)
    fallback = record.get("fallback_ops") or []
    if record["outcome"] == CRASH:
        return ("the backend died in native code (or was killed): rerun this test alone with "
                f"-k to reproduce; declare it in conformance.toml (\"{where}\") until fixed")
    if record["outcome"] == TIMEOUT:
        return ("hung or too slow for the profile's timeout: rerun it alone; if only slow, raise --timeout, "
                "if hung, look for a wait that never ends (a collective, a lock)")
    if "UnsupportedDtypeError" in reason or "NeuronDtypeError" in reason or "does not support dtype" in reason:
        return (f"the device refused a dtype: declare it in [unsupported_dtypes] of conformance.toml, "
                "or support it in the kernel")
    if "FallbackDeniedError" in reason:
        ops = ", ".join(fallback[:3]) if fallback else "the op the reason names"
        return f"an op needed the CPU fallback under policy deny: implement {ops} in the kernel table"
    if "not close" in reason or "Mismatched elements" in reason:
        tail = f" for {dtype}" if dtype else ""
        return (f"numbers differ from the CPU's: fix the kernel, or if the difference is the device's "
                f"rounding, declare a [[tolerance]] for \"{where}\"{tail} with the reason")
    if "NotImplementedError" in reason or "not implemented" in reason.lower():
        return "an op or feature is missing: implement it, or declare it in [unsupported] with the reason"
    if "same device" in reason:
        return "a host tensor met device tensors in one op: keep operands on the device, or check the kernel's inputs"
    if "OutOfMemoryError" in reason or "out of memory" in reason:
        return "the device ran out of memory: a smaller case, a larger target, or a leak in the allocator"
    if "dtype" in reason.lower() and dtype:
        return f"the result or an argument has another dtype than on the CPU: check the kernel's {dtype} promotion"
    if "AssertionError" in reason:
        return "the test's check failed (see the reason): compare the kernel with the CPU kernel on this case"
    return (f"the test raised where the CPU does not: rerun it alone (-k) for the traceback; declare it as a "
            f"known failure (\"{where}\") if it is a known gap")
