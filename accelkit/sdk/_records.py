"""Plain records a backend hands to the core: who it is, whether it can run, what it runs as."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

FALLBACK_POLICIES = ("deny", "warn", "allow")


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What a plugin says about its backend when it is loaded (see ``accelkit_register_backend``).

    :ivar name: the device type users write (``"tpu"``); becomes the PrivateUse1 name.
    :ivar priority: order among *real* accelerators in automatic selection; higher wins.
    :ivar description: one line for ``accelkit devices``.
    :ivar default_fallback: CPU-fallback policy when ``ACCELKIT_FALLBACK`` is unset:
        ``"deny"``, ``"warn"`` or ``"allow"``.
    """

    name: str
    priority: int = 0
    description: str = ""
    default_fallback: str = "warn"

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or not self.name.islower():
            raise ValueError(
                f"backend name {self.name!r} must be a lower-case identifier, e.g. 'tpu'"
            )
        if self.default_fallback not in FALLBACK_POLICIES:
            raise ValueError(
                f"backend {self.name!r}: default_fallback must be one of {FALLBACK_POLICIES}, "
                f"not {self.default_fallback!r}"
            )


@dataclass(frozen=True, slots=True)
class DeviceProbe:
    """The answer to "can this backend run here?" (see ``accelkit_probe``).

    :ivar available: the backend can be activated in this process.
    :ivar simulated: it runs on a model of the hardware, not the hardware. Automatic selection
        never picks a simulated backend; it must be named.
    :ivar device_count: devices visible to this process.
    :ivar target: the hardware generation it runs as (``"v5e"``, ``"trn2"``), if any.
    :ivar reason: why it is unavailable (required when ``available`` is False), or a note.
    """

    available: bool
    simulated: bool
    device_count: int = 0
    target: str | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        if not self.available and not self.reason:
            raise ValueError("an unavailable DeviceProbe must say why (reason=...)")


def _frozen(mapping: Mapping | None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Interconnect:
    """The device-to-device network collectives cross, as data for their time estimates.

    :ivar name: e.g. ``"ICI"``, ``"NeuronLink-v3"``.
    :ivar bandwidth: bytes per second one device moves in each direction, all its links together
        (half a vendor's bidirectional per-chip figure).
    :ivar links: links per device, if known.
    :ivar topology: e.g. ``"2D torus"``.
    :ivar latency: seconds per ring step, if known; ``None`` leaves latency out of estimates.
    :ivar sources: where each figure comes from, keyed by field name.
    :ivar domain_chips: chips this network joins directly (a TPU slice, a Trainium instance), if
        bounded; a group of more chips crosses ``scale_out`` (the scaling projection,
        :func:`accelkit.project_scaling`).
    :ivar scale_out: the network between domains (EFA between Trainium instances), its
        ``bandwidth`` per chip (the domain's share divided among its chips), if known.
    """

    name: str
    bandwidth: float
    links: int | None = None
    topology: str = ""
    latency: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    domain_chips: int | None = None
    scale_out: Interconnect | None = None

    def __post_init__(self) -> None:
        if self.bandwidth <= 0:
            raise ValueError(f"interconnect {self.name!r}: bandwidth must be positive")
        object.__setattr__(self, "sources", _frozen(self.sources))


@dataclass(frozen=True)
class DeviceModel:
    """A target generation as data: every figure the simulators and estimates read.

    :ivar name: target name, e.g. ``"v5e"`` or ``"host"``.
    :ivar vendor: who makes it.
    :ivar memory_bytes: device memory per device; the allocator's capacity.
    :ivar memory_bandwidth: bytes per second, if known.
    :ivar peak_flops: peak FLOP/s per dtype.
    :ivar dtypes: dtypes the device holds natively.
    :ivar simulated: whether this process runs a model of the target rather than the target.
    :ivar sources: where each figure comes from, keyed by field name.
    :ivar extra: further figures (MXU shape, SBUF size, ...), also with sources.
    :ivar interconnect: the device-to-device network, for collective estimates, if known.
    :ivar product: the hardware's name as the vendor's own software reports it (JAX's
        ``"TPU v5e"``, Neuron's ``"trn2"``): ``get_device_properties().name``, which tools such
        as TorchTitan look up to find the peak FLOP/s. Default: ``"<vendor> <name>"``.
    :ivar launch_seconds: host time per program execution (handing an XLA executable or a NEFF
        to the device), which estimates add as launch time (:class:`accelkit.sdk.LaunchLedger`);
        its source under ``sources["launch_seconds"]``. 0: not modelled.
    """

    name: str
    vendor: str
    memory_bytes: int
    memory_bandwidth: float | None = None
    peak_flops: Mapping[torch.dtype, float] = field(default_factory=dict)
    dtypes: frozenset[torch.dtype] = frozenset()
    simulated: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    interconnect: Interconnect | None = None
    product: str = ""
    launch_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.launch_seconds < 0:
            raise ValueError(f"device model {self.name!r}: launch_seconds must not be negative")
        if self.memory_bytes <= 0:
            raise ValueError(f"device model {self.name!r}: memory_bytes must be positive")
        object.__setattr__(self, "peak_flops", _frozen(self.peak_flops))
        object.__setattr__(self, "sources", _frozen(self.sources))
        object.__setattr__(self, "extra", _frozen(self.extra))
        object.__setattr__(self, "dtypes", frozenset(self.dtypes))
        if not self.product:
            object.__setattr__(self, "product", f"{self.vendor} {self.name}")


@dataclass(frozen=True)
class Estimate:
    """What the work since the last ``reset_stats()`` would take on the backend's target: the
    answer to ``accelkit_estimate``, shown as ``accelkit.stats()["estimate"]`` and in the
    ``accelkit run`` report. Always a model, never a measurement; ``note`` says which.

    :ivar target: the hardware generation estimated for (``"v5e"``, ``"trn2"``).
    :ivar note: how the figures were obtained (model and sources), shown next to them.
    :ivar seconds: estimated device seconds of all the work: how long the chip is busy.
    :ivar per_op: ``{op: (calls, seconds)}`` with ``op`` an aten overload
        (``"aten.mm.default"``) or a backend's label for work that is several ops (a fused
        kernel, a compiled program). The seconds are each op's own estimate; where ops overlap
        on the device they may sum to more than ``seconds``.
    :ivar flops: floating-point operations, if the model counts them.
    :ivar hbm_bytes: bytes moved to and from device memory, if the model counts them.
    :ivar launch_seconds: estimated seconds the device waits on the host to launch programs
        (the rule: :class:`accelkit.sdk.LaunchLedger`); 0 where the backend models no launch cost.
    :ivar launches: program executions counted (XLA executables, NEFFs).
    :ivar syncs: host waits that ended a run of launches (reads to the host, ``synchronize()``).
    :ivar by_target: the same run on each target asked for (``ACCELKIT_ESTIMATE_ON``, ``accelkit
        run --estimate-on``) that the backend can estimate: ``{target: {"seconds",
        "launch_seconds", "total_seconds", "launches", "syncs"}}``
        (:class:`accelkit.sdk.TargetComparison`); empty when none were asked for.
    :ivar not_estimated: targets asked for that this run cannot estimate: ``{target: why}``.
    """

    target: str
    note: str
    seconds: float
    per_op: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    flops: float | None = None
    hbm_bytes: float | None = None
    launch_seconds: float = 0.0
    launches: int = 0
    syncs: int = 0
    by_target: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    not_estimated: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.seconds < 0 or self.launch_seconds < 0:
            raise ValueError(f"estimate for {self.target!r}: seconds must not be negative")
        object.__setattr__(self, "per_op", _frozen(self.per_op))

    @property
    def total_seconds(self) -> float:
        """Device time plus launch time: the estimated wall time of the work on the target."""
        return self.seconds + self.launch_seconds

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready form ``accelkit.stats()["estimate"]`` holds."""
        return {
            "target": self.target, "note": self.note, "seconds": self.seconds,
            "launch_seconds": self.launch_seconds, "total_seconds": self.total_seconds,
            "launches": self.launches, "syncs": self.syncs,
            "flops": self.flops, "hbm_bytes": self.hbm_bytes,
            "by_target": {name: dict(row) for name, row in self.by_target.items()},
            "not_estimated": dict(self.not_estimated),
            "per_op": {op: {"calls": int(calls), "seconds": float(seconds)}
                       for op, (calls, seconds) in sorted(self.per_op.items())},
        }


class UnsupportedDtypeError(TypeError):
    """A dtype the device cannot hold was asked for; the message names it and the way out.

    :ivar dtype: the refused dtype, when known.
    """

    def __init__(self, message: str, dtype: torch.dtype | None = None):
        super().__init__(message)
        self.dtype = dtype


@dataclass(frozen=True)
class DtypeRules:
    """Which dtypes a device holds, and the policy for the rest (see ``accelkit_dtype_rules``).

    :ivar supported: dtypes device memory may hold.
    :ivar hint: the fix to print when another dtype is asked for, e.g. "cast to float32 first".
    :ivar hints: a more specific fix for particular dtypes (used instead of ``hint``).
    """

    supported: frozenset[torch.dtype]
    hint: str = ""
    hints: Mapping[torch.dtype, str] = field(default_factory=dict, hash=False)

    def check(self, dtype: torch.dtype, device: str) -> None:
        """Raise :class:`UnsupportedDtypeError` unless ``dtype`` is supported on ``device``."""
        if dtype not in self.supported:
            hint = self.hints.get(dtype, self.hint)
            raise UnsupportedDtypeError(f"{dtype} is not supported on {device}. {hint}".rstrip(), dtype)


EXPECTATION_SUITES = ("capabilities", "ops", "modules", "contract", "dynamic", "upstream")
EXPECTATION_VARIANTS = ("forward", "backward")
#: What a backend may declare in ``[capabilities]``: name -> what declaring it promises. The
#: conformance suite probes each declared one first and reports every one in a table.
CAPABILITIES = {
    "compile": "torch.compile(backend=NAME) compiles graphs for the device",
    "dynamic_shapes": "torch.compile(dynamic=True) serves several input sizes",
    "distributed": "init_process_group(NAME) runs collectives on device tensors",
    "device_generators": "torch.Generator(device=...) draws on the device",
    "pinned_memory": "Tensor.pin_memory() gives page-locked host memory",
    "multi_device": "several devices in one process (NAME:1, set_device)",
    "streams_events": "torch.NAME.Stream and Event, in order",
    "sparse": "sparse layouts on the device",
}


@dataclass(frozen=True)
class ExpectationRule:
    """One declared gap: tests matching it are skipped (``kind="skip"``) or expected to fail.

    :ivar kind: ``"skip"`` (the test is not run; reported as a declared skip) or ``"xfail"``
        (run; a failure is expected, a pass is reported as a fix to remove this entry).
    :ivar match: ``"<suite>/<subject>"`` or ``"<subject>"`` (any suite), where subject is a
        glob over the test's subject: an OpInfo name (``"fft.*"``), a module class
        (``"torch.nn.LSTM"``), a contract check (``"serialization*"``) or a dynamic case.
    :ivar reason: why; shown with every test the rule covers.
    :ivar dtypes: dtype names the rule is limited to (empty: all).
    :ivar variants: ``"forward"``/``"backward"`` the rule is limited to (empty: all).
    :ivar key: where the rule was declared, for reports (e.g. ``'known_failures "ops/neg"'``).
    """

    kind: str
    match: str
    reason: str
    dtypes: frozenset[str] = frozenset()
    variants: frozenset[str] = frozenset()
    key: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("skip", "xfail"):
            raise ValueError(f"expectation kind must be 'skip' or 'xfail', not {self.kind!r}")
        _check_match(self.match, self.key or self.match)
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError(f"expectation {self.key or self.match!r} needs a reason")
        object.__setattr__(self, "dtypes", _dtype_names(self.dtypes, self.key or self.match))
        object.__setattr__(self, "variants", _variant_names(self.variants, self.key or self.match))
        if not self.key:
            object.__setattr__(self, "key", f'{self.kind} "{self.match}"')

    def covers(self, suite: str, subject: str | None, dtype: str | None, variant: str | None) -> bool:
        """Whether a test of ``suite`` about ``subject`` in ``dtype``/``variant`` matches."""
        return (
            _match_subject(self.match, suite, subject)
            and (not self.dtypes or dtype in self.dtypes)
            and (not self.variants or variant in self.variants)
        )


@dataclass(frozen=True)
class Tolerance:
    """Comparison tolerance for matching tests (see :class:`ExpectationRule` for ``match``).

    A result passes when ``|device - cpu| <= atol + rtol * |cpu|`` elementwise; ``reason``
    says why the default is not enough.
    """

    match: str
    atol: float
    rtol: float
    dtypes: frozenset[str] = frozenset()
    variants: frozenset[str] = frozenset()
    reason: str = ""

    def __post_init__(self) -> None:
        _check_match(self.match, self.match)
        if not (self.atol >= 0 and self.rtol >= 0):
            raise ValueError(f"tolerance {self.match!r}: atol and rtol must be >= 0")
        object.__setattr__(self, "dtypes", _dtype_names(self.dtypes, self.match))
        object.__setattr__(self, "variants", _variant_names(self.variants, self.match))

    def covers(self, suite: str, subject: str | None, dtype: str | None, variant: str | None) -> bool:
        return (
            _match_subject(self.match, suite, subject)
            and (not self.dtypes or dtype in self.dtypes)
            and (not self.variants or variant in self.variants)
        )


def _check_match(match: str, where: str) -> None:
    if not isinstance(match, str) or not match.strip():
        raise ValueError(f"expectation {where!r}: match must be a non-empty string")
    if "/" in match:
        suite = match.split("/", 1)[0]
        if suite not in EXPECTATION_SUITES:
            raise ValueError(
                f"expectation {where!r}: unknown suite {suite!r}; use one of {EXPECTATION_SUITES} "
                "as '<suite>/<subject>', or a bare subject for every suite"
            )


def _match_subject(match: str, suite: str, subject: str | None) -> bool:
    from fnmatch import fnmatchcase

    if subject is None:
        return False
    if "/" in match:
        want_suite, pattern = match.split("/", 1)
        return want_suite == suite and fnmatchcase(subject, pattern)
    return fnmatchcase(subject, match)


def _dtype_names(names: Any, where: str) -> frozenset[str]:
    names = frozenset([names] if isinstance(names, str) else names or ())
    for name in names:
        if not isinstance(getattr(torch, str(name), None), torch.dtype):
            raise ValueError(f"expectation {where!r}: {name!r} is not a torch dtype name (e.g. 'float32')")
    return names


def _variant_names(names: Any, where: str) -> frozenset[str]:
    names = frozenset([names] if isinstance(names, str) else names or ())
    if not names <= set(EXPECTATION_VARIANTS):
        raise ValueError(f"expectation {where!r}: variant must be one of {EXPECTATION_VARIANTS}")
    return names


@dataclass(frozen=True)
class Expectations:
    """A backend's declared gaps; each value is the reason (see ``accelkit_conformance_expectations``).

    Keys of the three mappings are ``"<suite>/<subject>"`` or ``"<subject>"`` globs (see
    :class:`ExpectationRule`); ``unsupported_dtypes`` is keyed by dtype name.

    :ivar unsupported: ops or features the backend will not support (declared skips).
    :ivar known_failures: ops or features that fail today and should (expected failures).
    :ivar unsupported_dtypes: dtypes, by name, that the device cannot hold (declared skips of
        every test in that dtype).
    :ivar rules: finer entries, limited to dtypes and/or variants; checked after the mappings.
    :ivar tolerances: comparison tolerances overriding the suite's defaults; first match wins.
    :ivar source: the file the expectations were read from, if any (named in reports).
    :ivar capabilities: the backend's surface (:data:`CAPABILITIES`): ``True`` for what it
        supports, a reason for what it does not; a capability left out is undeclared, and its
        tests are declared skips.

    Build one in code, or read the TOML file next to the plugin with :meth:`from_toml`.
    """

    unsupported: Mapping[str, str] = field(default_factory=dict)
    known_failures: Mapping[str, str] = field(default_factory=dict)
    unsupported_dtypes: Mapping[str, str] = field(default_factory=dict)
    rules: tuple[ExpectationRule, ...] = ()
    tolerances: tuple[Tolerance, ...] = ()
    source: str | None = None
    capabilities: Mapping[str, bool | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _dtype_names(self.unsupported_dtypes, "unsupported_dtypes")
        for name, value in dict(self.capabilities).items():
            if name not in CAPABILITIES:
                raise ValueError(f"[capabilities] {name!r} is not a capability; declare some of {sorted(CAPABILITIES)}")
            if value is not True and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"[capabilities] {name}: true, or the reason it is not supported (a string)")
        object.__setattr__(self, "capabilities", _frozen(self.capabilities))
        for name in ("unsupported", "known_failures", "unsupported_dtypes"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        object.__setattr__(self, "rules", tuple(self.rules))
        object.__setattr__(self, "tolerances", tuple(self.tolerances))
        # The mappings as rules, in the order lookup() consults them (validates them, too).
        object.__setattr__(self, "_ordered", (
            *(ExpectationRule("skip", m, r, key=f'unsupported "{m}"') for m, r in self.unsupported.items()),
            *(ExpectationRule("xfail", m, r, key=f'known_failures "{m}"') for m, r in self.known_failures.items()),
            *self.rules,
        ))

    def lookup(
        self, suite: str, subject: str | None, dtype: str | None = None, variant: str | None = None
    ) -> ExpectationRule | None:
        """The entry that decides a test's expectation, or None when it must pass.

        Unsupported dtypes come first, then skips, then expected failures; within each, the
        first declared entry wins.
        """
        if dtype is not None and dtype in self.unsupported_dtypes:
            return ExpectationRule(
                "skip", "*", self.unsupported_dtypes[dtype], key=f'unsupported_dtypes "{dtype}"'
            )
        for kind in ("skip", "xfail"):
            for rule in self._ordered:
                if rule.kind == kind and rule.covers(suite, subject, dtype, variant):
                    return rule
        return None

    def tolerance(
        self, suite: str, subject: str | None, dtype: str | None = None, variant: str | None = None
    ) -> Tolerance | None:
        """The first declared tolerance covering the test, or None for the suite's default."""
        return next((t for t in self.tolerances if t.covers(suite, subject, dtype, variant)), None)

    @classmethod
    def from_toml(cls, path: Any) -> Expectations:
        """Read a backend's expectations file.

        Format (every table optional; every entry needs a reason)::

            [unsupported_dtypes]            # dtype name = reason (declared skips)
            float64 = "no 64-bit floats on this device"

            [unsupported]                   # "<suite>/<subject glob>" = reason (declared skips)
            "ops/fft.*" = "complex FFT is not implemented"

            [known_failures]                # expected failures; a pass is reported as xpass
            "ops/linalg.svd" = "sign convention differs (issue #12)"

            [[skip]]                        # or [[xfail]]: limited to dtypes and/or a variant
            match = "ops/nn.functional.conv2d"
            dtypes = ["bfloat16"]
            variants = ["backward"]
            reason = "..."

            [capabilities]                  # see CAPABILITIES: true, or why not
            compile = true
            sparse = "dense strided storage only"

            [[tolerance]]
            match = "ops/nn.functional.gelu"
            dtypes = ["bfloat16"]
            atol = 1e-2
            rtol = 1.6e-2
            reason = "the kernel rounds intermediates to bfloat16"

        :raises ValueError: the file is not valid TOML or an entry is malformed; the message
            names the file and the entry.
        """
        import tomllib
        from pathlib import Path

        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read conformance expectations {path}: {exc}") from exc
        known = {"unsupported_dtypes", "unsupported", "known_failures", "skip", "xfail", "tolerance", "capabilities"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown table(s) {unknown}; expected some of {sorted(known)}")
        try:
            for table in ("unsupported_dtypes", "unsupported", "known_failures"):
                entries = data.get(table, {})
                if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
                    raise ValueError(f"[{table}] must map names to reason strings")
            rules = []
            for kind in ("skip", "xfail"):
                for i, entry in enumerate(data.get(kind, [])):
                    extra = set(entry) - {"match", "reason", "dtypes", "variants"}
                    if extra:
                        raise ValueError(f"[[{kind}]] #{i + 1}: unknown keys {sorted(extra)}")
                    if "match" not in entry:
                        raise ValueError(f"[[{kind}]] #{i + 1}: needs match = \"<suite>/<subject>\"")
                    qualifiers = "".join(
                        f" ({k}: {', '.join(sorted(entry[k]))})" for k in ("dtypes", "variants") if entry.get(k)
                    )
                    rules.append(ExpectationRule(
                        kind, entry["match"], entry.get("reason", ""), entry.get("dtypes", ()),
                        entry.get("variants", ()), key=f'{kind} "{entry["match"]}"{qualifiers}',
                    ))
            tolerances = []
            for i, entry in enumerate(data.get("tolerance", [])):
                extra = set(entry) - {"match", "atol", "rtol", "dtypes", "variants", "reason"}
                if extra or not {"match", "atol", "rtol", "reason"} <= set(entry):
                    raise ValueError(
                        f"[[tolerance]] #{i + 1}: needs match, atol, rtol and reason (and optional dtypes, variants)"
                    )
                tolerances.append(Tolerance(
                    entry["match"], float(entry["atol"]), float(entry["rtol"]),
                    entry.get("dtypes", ()), entry.get("variants", ()), entry["reason"],
                ))
            return cls(
                unsupported=data.get("unsupported", {}),
                known_failures=data.get("known_failures", {}),
                unsupported_dtypes=data.get("unsupported_dtypes", {}),
                rules=tuple(rules),
                tolerances=tuple(tolerances),
                source=str(path),
                capabilities=data.get("capabilities", {}),
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
