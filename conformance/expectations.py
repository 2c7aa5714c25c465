"""A backend's declared expectations, as the suite applies them.

Two sources, both available without activating the backend (so the controller process, which
never runs tests, decides exactly as the workers do):

- the backend's ``accelkit_conformance_expectations`` hook (usually :meth:`Expectations.from_toml`
  on a ``conformance.toml`` next to the plugin);
- optional contract hooks the backend leaves out: without ``accelkit_make_compiler`` every
  ``torch.compile`` case is a declared skip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accelkit.sdk import ExpectationRule, Expectations, Tolerance
from accelkit_conformance.capabilities import capability_of, declaration
from accelkit_conformance.cases import Case

#: Dynamic cases that need ``torch.compile`` have subjects ending in one of these.
COMPILE_MODES = ("compile_static", "compile_auto", "compile_dynamic", "compile_bucketed")


@dataclass(frozen=True)
class Declared:
    """The expectations of one backend for one run."""

    backend: str
    expectations: Expectations
    has_compiler: bool

    def lookup(self, case: Case) -> ExpectationRule | None:
        """The declared entry deciding ``case`` (skip or xfail), or None if it must pass."""
        rule = self.expectations.lookup(case.suite, case.op, case.dtype, case.variant)
        if rule is not None and rule.kind == "skip":
            return rule
        capability = capability_of(case.suite, case.op)
        if capability is not None:
            value = declaration(self.expectations.capabilities, capability)
            if value is not True:
                return ExpectationRule("skip", f"{case.suite}/*", f"capability {capability}: {value}",
                                       key=f"[capabilities] {capability}")
        if not self.has_compiler and case.suite == "dynamic" and (case.op or "").endswith(COMPILE_MODES):
            return ExpectationRule(
                "skip", "dynamic/*", f"{self.backend} provides no torch.compile backend "
                "(no accelkit_make_compiler hook)", key="hook accelkit_make_compiler",
            )
        return rule

    def tolerance(self, case: Case) -> Tolerance | None:
        return self.expectations.tolerance(case.suite, case.op, case.dtype, case.variant)


def load(backend: str, extra: str | None = None) -> Declared:
    """Gather ``backend``'s declarations from its plugin, and those of the TOML file ``extra``
    (a user's own, e.g. for upstream tests) after them.

    :raises LookupError: no installed plugin provides ``backend``.
    :raises ValueError: the plugin's expectations are malformed (the message names the file),
        or its ``accelkit_conformance_expectations`` hook raised.
    """
    from accelkit import PluginError
    from accelkit.sdk import backends

    found = backends()
    view = found.get(backend)
    if view is None or view.info is None:
        known = sorted(name for name, v in found.items() if v.info is not None)
        why = f": {view.load_error}" if view is not None and view.load_error else ""
        raise LookupError(f"no accelkit backend named {backend!r}{why} (installed: {', '.join(known) or 'none'})")
    try:
        answer = view.expectations()
    except PluginError as exc:
        raise ValueError(str(exc)) from exc
    if extra is not None:
        answer = _merged(answer, Expectations.from_toml(extra))
    return Declared(backend, answer, view.implements("accelkit_make_compiler"))


def _merged(own: Expectations | None, extra: Expectations) -> Expectations:
    """``own``'s entries, then ``extra``'s (an entry of both keeps ``own``'s reason); a capability
    ``extra`` declares replaces ``own``'s declaration."""
    if own is None:
        return extra

    def then(first: Mapping[str, str], second: Mapping[str, str]) -> dict[str, str]:
        return {**first, **{k: v for k, v in second.items() if k not in first}}

    return Expectations(
        unsupported=then(own.unsupported, extra.unsupported),
        known_failures=then(own.known_failures, extra.known_failures),
        unsupported_dtypes=then(own.unsupported_dtypes, extra.unsupported_dtypes),
        rules=(*own.rules, *extra.rules), tolerances=(*own.tolerances, *extra.tolerances),
        source=" + ".join(s for s in (own.source, extra.source) if s) or None,
        capabilities={**own.capabilities, **extra.capabilities},  # the user's file decides
    )
