"""Device selection: names, preference lists, ACCELKIT_DEVICE, automatic order, broken backends,
the one-backend-per-process rule and autoload during ``import torch``.

This process already runs ``ref`` (conftest). Fake backends that only need to be *seen* are
registered here and removed afterwards; anything that must activate a backend other than ref
runs in a fresh interpreter.
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import run_python

import accelkit
from accelkit._cli import main as cli_main
from accelkit.sdk import BackendInfo, DeviceModel, DeviceProbe

BUILTIN_ORDER = ["cuda", "xpu", "mps", "cpu"]


class FakeBackend:
    """A backend plugin built from the SDK records; its memory is ref's host allocator.

    ``available=False`` makes the probe decline with ``reason``; ``probe_error`` makes the probe
    raise; ``activation_error`` makes activation (the allocator hook) raise.
    """

    def __init__(self, name, *, priority=0, simulated=False, available=True, reason=None,
                 probe_error=None, activation_error=None):
        self.name = name
        self.priority = priority
        self.simulated = simulated
        self.available = available
        self.reason = reason
        self.probe_error = probe_error
        self.activation_error = activation_error

    @accelkit.hookimpl
    def accelkit_register_backend(self):
        return BackendInfo(name=self.name, priority=self.priority, description=f"test backend {self.name}")

    @accelkit.hookimpl
    def accelkit_probe(self, name):
        if name != self.name:
            return None
        if self.probe_error is not None:
            raise self.probe_error
        return DeviceProbe(
            available=self.available,
            simulated=self.simulated,
            device_count=1 if self.available else 0,
            target=f"{self.name}-v1",
            reason=self.reason,
        )

    @accelkit.hookimpl
    def accelkit_device_model(self, name):
        if name == self.name:
            return DeviceModel(name=f"{self.name}-v1", vendor="accelkit tests", memory_bytes=1 << 30)

    @accelkit.hookimpl
    def accelkit_make_allocator(self, name, device_model):
        if name != self.name:
            return None
        if self.activation_error is not None:
            raise self.activation_error
        from accelkit_backends.ref.buffers import RefAllocator

        return RefAllocator(f"{name}:0", device_model.memory_bytes)


#: What a fresh interpreter needs to build FakeBackend plugins.
PRELUDE = (
    "import json\nimport torch\nimport accelkit\n"
    "from accelkit.sdk import BackendInfo, DeviceModel, DeviceProbe\n\n"
    + textwrap.dedent(inspect.getsource(FakeBackend))
    + "\n"
)


def run_json(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` (after PRELUDE) in a fresh interpreter; it prints one JSON object last."""
    proc = run_python(PRELUDE + textwrap.dedent(code), env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def register():
    """Register fake backends in this process and remove them again after the test.

    Registrations are process-wide, so leaving them behind would change what every later
    test sees in ``accelkit.devices()``.
    """
    from accelkit._plugins import registry

    added = []

    def _register(plugin):
        names = accelkit.register_backend(plugin)
        added.append((plugin, names))
        return names

    yield _register
    reg = registry()
    for plugin, names in added:
        reg.pm.unregister(plugin)
        for name in names:
            reg.backends.pop(name, None)


def report(name: str) -> accelkit.DeviceReport:
    return {r.name: r for r in accelkit.devices()}[name]


def first_available_builtin() -> torch.device:
    """What automatic selection must fall back to here, from torch's own answers."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def install_entry_point(site: Path, entry: str, module: str, source: str) -> None:
    """Make ``module`` (written from ``source``) an ``accelkit.backends`` entry point in ``site``."""
    (site / f"{module}.py").write_text(source)
    dist = site / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[accelkit.backends]\n{entry}\n")


def with_path(site: Path, **env: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, **env}


# -- names, indices and preference lists ---------------------------------------------------------


def test_cpu_selects_the_cpu_device():
    assert accelkit.select_device("cpu") == torch.device("cpu")


def test_name_with_index_selects_that_device():
    assert accelkit.select_device("cpu:0") == torch.device("cpu", 0)
    assert accelkit.select_device("ref:0") == torch.device("ref", 0)
    assert accelkit.select_device(torch.device("ref", 0)) == torch.device("ref", 0)
    assert accelkit.select_device(" REF ") == torch.device("ref", 0)


def test_index_must_be_a_number():
    with pytest.raises(accelkit.UnknownDeviceError, match=r"the index after ':' must be a number, e\.g\. ref:0"):
        accelkit.select_device("ref:x")


def test_index_beyond_the_visible_devices_is_unavailable():
    with pytest.raises(accelkit.DeviceUnavailableError, match=r"ref:1 does not exist: 1 ref device\(s\) visible"):
        accelkit.select_device("ref:1")


@pytest.mark.parametrize(
    "spec, expected",
    [
        (["offline", "ref", "cpu"], torch.device("ref", 0)),
        ("offline,ref,cpu", torch.device("ref", 0)),
        ("offline, cpu", torch.device("cpu")),
        ([torch.device("cpu"), "ref"], torch.device("cpu")),
    ],
    ids=["list", "comma-string", "comma-string-spaces", "devices-first-wins"],
)
def test_preference_list_chooses_the_first_available(register, spec, expected):
    register(FakeBackend("offline", available=False, reason="no offline card on the bus"))
    assert accelkit.select_device(spec) == expected


def test_explanation_gives_the_reason_each_earlier_preference_was_skipped(register):
    register(FakeBackend("offline", available=False, reason="no offline card on the bus"))
    assert accelkit.explain_selection("offline,cpu").splitlines() == [
        "selected cpu",
        "  not chosen: offline: no offline card on the bus",
    ]


def test_a_single_unavailable_name_raises_with_its_reason(register):
    register(FakeBackend("offline", available=False, reason="no offline card on the bus"))
    with pytest.raises(accelkit.DeviceUnavailableError) as err:
        accelkit.select_device("offline")
    assert str(err.value) == "device 'offline' is unavailable: no offline card on the bus"


def test_a_list_with_nothing_available_lists_every_reason(register):
    register(FakeBackend("offline", available=False, reason="no offline card on the bus"))
    register(FakeBackend("dark", available=False, reason="dark card has no power"))
    with pytest.raises(accelkit.DeviceUnavailableError) as err:
        accelkit.select_device(["offline", "dark"])
    assert str(err.value) == (
        "none of the requested devices is available:\n"
        "  offline: no offline card on the bus\n"
        "  dark: dark card has no power"
    )


# -- ACCELKIT_DEVICE -----------------------------------------------------------------------------


def test_env_preference_applies_when_no_spec_is_given(register, monkeypatch):
    register(FakeBackend("offline", available=False, reason="no offline card on the bus"))
    monkeypatch.setenv("ACCELKIT_DEVICE", "offline,cpu")
    assert accelkit.select_device() == torch.device("cpu")
    assert "not chosen: offline: no offline card on the bus" in accelkit.explain_selection()
    monkeypatch.setenv("ACCELKIT_DEVICE", "ref")
    assert accelkit.select_device() == torch.device("ref", 0)


def test_an_explicit_spec_overrides_the_env(monkeypatch):
    monkeypatch.setenv("ACCELKIT_DEVICE", "nosuch")
    assert accelkit.select_device("cpu") == torch.device("cpu")
    with pytest.raises(accelkit.UnknownDeviceError, match="unknown device 'nosuch'"):
        accelkit.select_device()  # proves the env is read when no spec is given


# -- automatic selection -------------------------------------------------------------------------


def test_automatic_selection_passes_over_simulated_ref_and_says_why(monkeypatch):
    monkeypatch.delenv("ACCELKIT_DEVICE", raising=False)
    assert accelkit.select_device() == first_available_builtin()
    explanation = accelkit.explain_selection()
    assert explanation.splitlines()[0] == f"selected {first_available_builtin()}"
    assert "  not chosen: ref: simulated; chosen only by name (select_device('ref'))" in explanation.splitlines()


def test_devices_are_listed_plugins_first_then_cuda_xpu_mps_cpu():
    reports = accelkit.devices()
    kinds = [r.kind for r in reports]
    assert kinds == sorted(kinds, key=lambda k: k != "plugin"), "plugins come before built-ins"
    assert [r.name for r in reports if r.kind == "builtin"] == BUILTIN_ORDER
    cpu = report("cpu")
    assert (cpu.available, cpu.device_count, cpu.reason) == (True, 1, None)
    ref = report("ref")
    assert (ref.kind, ref.available, ref.simulated, ref.device_count, ref.target, ref.active) == (
        "plugin", True, True, 1, "host", True
    )


def test_a_real_plugin_wins_by_priority_over_builtins_and_simulated_backends():
    out = run_json(
        """
        accelkit.register_backend(FakeBackend("lowaccel", priority=1))
        accelkit.register_backend(FakeBackend("highaccel", priority=9))
        accelkit.register_backend(FakeBackend("bestaccel", priority=50, available=False,
                                              reason="bestaccel card is powered off"))
        order = [r.name for r in accelkit.devices()]
        explanation = accelkit.explain_selection()
        dev = accelkit.select_device()
        x = torch.arange(6.0, device=dev).reshape(2, 3)
        print(json.dumps({
            "order": order, "explanation": explanation, "device": str(dev),
            "active": accelkit.active_backend(), "result": (x * 2 + 1).sum(0).cpu().tolist(),
            "expected": (torch.arange(6.0).reshape(2, 3) * 2 + 1).sum(0).tolist(),
        }))
        """
    )
    installed = [r.name for r in accelkit.devices() if r.kind == "plugin"]  # all simulated here
    assert out["order"] == ["bestaccel", "highaccel", "lowaccel", *installed, *BUILTIN_ORDER]
    assert out["explanation"].splitlines() == [
        "selected highaccel:0",
        "  not chosen: bestaccel: bestaccel card is powered off",
    ]
    assert (out["device"], out["active"]) == ("highaccel:0", "highaccel")
    assert out["result"] == out["expected"]


# -- unknown names -------------------------------------------------------------------------------


@pytest.mark.parametrize("typo, suggestion", [("rf", "ref"), ("cdua", "cuda"), ("cpux", "cpu")])
def test_unknown_name_suggests_the_closest_known_device(typo, suggestion):
    with pytest.raises(accelkit.UnknownDeviceError) as err:
        accelkit.select_device(typo)
    message = str(err.value)
    assert message.startswith(f"unknown device {typo!r}. Did you mean {suggestion!r}? Known devices: ")
    known = message.split("Known devices: ", 1)[1].rstrip(".").split(", ")
    assert {"ref", *BUILTIN_ORDER} <= set(known)
    assert isinstance(err.value, ValueError)


def test_unknown_name_without_a_close_match_has_no_suggestion():
    with pytest.raises(accelkit.UnknownDeviceError) as err:
        accelkit.select_device("zzzzzz")
    assert "Did you mean" not in str(err.value)
    assert str(err.value).startswith("unknown device 'zzzzzz'. Known devices: ")


def test_a_typo_in_a_preference_list_is_an_error_not_skipped():
    with pytest.raises(accelkit.UnknownDeviceError, match="Did you mean 'ref'"):
        accelkit.select_device("rf,cpu")


# -- backends that cannot run --------------------------------------------------------------------


def test_a_probe_that_raises_makes_the_backend_unavailable_with_the_error_as_reason(register, capsys):
    register(FakeBackend("flaky", probe_error=RuntimeError("driver libflaky.so not found")))
    reason = "probe failed: RuntimeError: driver libflaky.so not found"

    flaky = report("flaky")
    assert (flaky.available, flaky.device_count, flaky.reason) == (False, 0, reason)

    with pytest.raises(accelkit.DeviceUnavailableError) as err:
        accelkit.select_device("flaky")
    assert str(err.value) == f"device 'flaky' is unavailable: {reason}"

    assert f"not chosen: flaky: {reason}" in accelkit.explain_selection("flaky,cpu")

    assert cli_main(["devices"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("flaky "))
    assert "unavailable" in row.split() and row.endswith(reason)

    assert cli_main(["devices", "--json"]) == 0
    listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert (listed["flaky"]["available"], listed["flaky"]["reason"]) == (False, reason)


def test_a_failed_activation_keeps_its_reason_and_leaves_the_process_usable():
    out = run_json(
        """
        accelkit.register_backend(FakeBackend("fw", priority=5,
                                              activation_error=RuntimeError("firmware upload failed")))
        try:
            accelkit.select_device("fw")
        except accelkit.DeviceUnavailableError as exc:
            first = str(exc)
        fw = {r.name: r for r in accelkit.devices()}["fw"]
        try:
            accelkit.select_device("fw")
        except accelkit.DeviceUnavailableError as exc:
            second = str(exc)
        explanation = accelkit.explain_selection()
        import contextlib, io
        table = io.StringIO()
        with contextlib.redirect_stdout(table):
            from accelkit._cli import main
            main(["devices"])
        ref = accelkit.select_device("ref")
        print(json.dumps({
            "first": first, "second": second, "available": fw.available, "reason": fw.reason,
            "explanation": explanation, "table": table.getvalue(), "ref": str(ref),
            "sum": torch.ones(3, device=ref).sum().item(),
        }))
        """
    )
    reason = "failed to initialise: RuntimeError: firmware upload failed"
    assert out["first"] == f"backend 'fw' {reason}"
    assert (out["available"], out["reason"]) == (False, reason)
    assert out["second"] == f"device 'fw' is unavailable: {reason}"
    assert f"  not chosen: fw: {reason}" in out["explanation"].splitlines()
    row = next(line for line in out["table"].splitlines() if line.startswith("fw "))
    assert "unavailable" in row.split() and row.endswith(reason)
    assert (out["ref"], out["sum"]) == ("ref:0", 3.0)


def test_automatic_selection_skips_a_real_backend_whose_activation_fails():
    out = run_json(
        """
        accelkit.register_backend(FakeBackend("fw", priority=5,
                                              activation_error=RuntimeError("firmware upload failed")))
        print(json.dumps({"explanation": accelkit.explain_selection(),
                          "active": accelkit.active_backend()}))
        """
    )
    lines = out["explanation"].splitlines()
    assert lines[0] != "selected fw:0" and out["active"] is None
    assert "  not chosen: fw: backend 'fw' failed to initialise: RuntimeError: firmware upload failed" in lines


BROKEN_PLUGIN = 'raise ImportError("libbroken.so: cannot open shared object file")\n'


def test_a_plugin_that_fails_to_import_is_listed_unavailable_with_the_import_error(tmp_path):
    install_entry_point(tmp_path, "brokenaccel = broken_accel_plugin", "broken_accel_plugin", BROKEN_PLUGIN)
    out = run_json(
        """
        import contextlib, io
        from accelkit._cli import main
        reports = {r.name: r.as_dict() for r in accelkit.devices()}
        try:
            accelkit.select_device("brokenaccel")
        except accelkit.DeviceUnavailableError as exc:
            error = str(exc)
        table = io.StringIO()
        with contextlib.redirect_stdout(table):
            main(["devices"])
        print(json.dumps({"reports": reports, "error": error, "table": table.getvalue()}))
        """,
        env=with_path(tmp_path),
    )
    reason = (
        "plugin broken_accel_plugin failed to import: ImportError: "
        "libbroken.so: cannot open shared object file"
    )
    broken = out["reports"]["brokenaccel"]
    assert (broken["kind"], broken["available"], broken["reason"]) == ("plugin", False, reason)
    assert out["reports"]["ref"]["available"], "one broken plugin must not hide the others"
    assert out["error"] == f"device 'brokenaccel' is unavailable: {reason}"
    row = next(line for line in out["table"].splitlines() if line.startswith("brokenaccel "))
    assert "unavailable" in row.split() and row.endswith(reason)


# -- one backend per process ---------------------------------------------------------------------


def test_reselecting_the_active_backend_is_a_no_op(dev):
    x = torch.ones(4, device=dev)
    y = x + x
    assert accelkit.select_device("ref") == dev
    assert accelkit.select_device(["ref", "cpu"]) == dev
    assert accelkit.active_backend() == "ref"
    assert accelkit.stats()["ops"]["aten.add.Tensor"]["native"] == 1, "counters survive reselection"
    torch.testing.assert_close((x + y).cpu(), torch.full((4,), 3.0))


def test_selecting_a_second_backend_in_this_process_raises_a_conflict(register, dev):
    register(FakeBackend("twin", simulated=True))
    with pytest.raises(accelkit.BackendConflictError) as err:
        accelkit.select_device("twin")
    message = str(err.value)
    assert message.startswith("cannot activate 'twin': this process already runs 'ref'.")
    assert "one custom device type (PrivateUse1) per process" in message
    assert "accelkit activates one backend per process" in message
    assert "start a new process with ACCELKIT_DEVICE=twin" in message
    assert accelkit.active_backend() == "ref"
    twin = report("twin")
    assert (twin.available, twin.reason) == (True, None), "a conflict is not the backend's failure"


def test_two_backends_in_a_fresh_process_conflict_whichever_came_first():
    out = run_json(
        """
        accelkit.register_backend(FakeBackend("otheraccel", priority=3))
        ref = accelkit.select_device("ref")
        try:
            accelkit.select_device("otheraccel")
        except accelkit.BackendConflictError as exc:
            error = str(exc)
        other = {r.name: r for r in accelkit.devices()}["otheraccel"]
        print(json.dumps({
            "error": error, "active": accelkit.active_backend(), "again": str(accelkit.select_device("ref")),
            "other_available": other.available, "sum": (torch.ones(2, device=ref) * 3).sum().item(),
        }))
        """
    )
    assert out["error"] == (
        "cannot activate 'otheraccel': this process already runs 'ref'. PyTorch offers one custom "
        "device type (PrivateUse1) per process, so accelkit activates one backend per process. "
        "Use 'ref' here, or start a new process with ACCELKIT_DEVICE=otheraccel (one process per "
        "backend, e.g. with subprocess or torch.multiprocessing)."
    )
    assert (out["active"], out["again"], out["other_available"], out["sum"]) == ("ref", "ref:0", True, 6.0)


def test_privateuse1_taken_outside_accelkit_is_a_conflict():
    out = run_json(
        """
        torch.utils.rename_privateuse1_backend("npu")
        try:
            accelkit.select_device("ref")
        except accelkit.BackendConflictError as exc:
            error = str(exc)
        print(json.dumps({"error": error, "active": accelkit.active_backend(),
                          "ref_available": {r.name: r for r in accelkit.devices()}["ref"].available}))
        """
    )
    assert out["error"].startswith(
        "PrivateUse1 is already taken by 'npu', registered outside accelkit, so 'ref' cannot be "
        "activated in this process."
    )
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in out["error"]
    assert (out["active"], out["ref_available"]) == (None, True)


# -- autoload during `import torch` --------------------------------------------------------------

CURRENT_ACCELERATOR = "import torch; print(torch.accelerator.current_accelerator())"


def test_autoload_activates_the_backend_named_in_the_env():
    proc = run_python(CURRENT_ACCELERATOR, env={"ACCELKIT_DEVICE": "ref"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ref"
    assert proc.stderr == ""


def test_autoload_with_a_preference_list_activates_the_first_available_plugin():
    proc = run_python(
        "import torch, accelkit; print(accelkit.active_backend())", env={"ACCELKIT_DEVICE": "ref,cpu"}
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ref"


def test_without_env_autoload_activates_nothing():
    proc = run_python(CURRENT_ACCELERATOR + "; import accelkit; print(accelkit.active_backend())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "None"]
    assert proc.stderr == ""


def test_env_naming_a_builtin_device_activates_nothing():
    proc = run_python(CURRENT_ACCELERATOR, env={"ACCELKIT_DEVICE": "cpu"})
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "None", "")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("nosuch", "UnknownDeviceError: unknown device 'nosuch'. Known devices: "),
        ("rf", "UnknownDeviceError: unknown device 'rf'. Did you mean 'ref'? Known devices: "),
    ],
)
def test_an_unknown_env_device_warns_but_import_torch_succeeds(value, expected):
    proc = run_python(CURRENT_ACCELERATOR, env={"ACCELKIT_DEVICE": value})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"
    assert "RuntimeWarning: accelkit did not activate a device while torch was imported: " + expected in proc.stderr
    assert "Call accelkit.select_device() to see the full error, or set ACCELKIT_AUTOLOAD=0." in proc.stderr


def test_autoload_can_be_disabled_and_explicit_selection_still_reads_the_env():
    proc = run_python(
        CURRENT_ACCELERATOR + "; import accelkit; print(accelkit.select_device())",
        env={"ACCELKIT_DEVICE": "ref", "ACCELKIT_AUTOLOAD": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "ref:0"]


def test_autoload_disabled_also_silences_a_bad_env_device():
    proc = run_python(CURRENT_ACCELERATOR, env={"ACCELKIT_DEVICE": "nosuch", "ACCELKIT_AUTOLOAD": "0"})
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "None", "")


def _installed_fake(site: Path, *plugins: str) -> None:
    """Install FakeBackend objects ``name=priority`` as entry points of one distribution."""
    lines = [PRELUDE]
    entries = []
    for spec in plugins:
        name, priority = spec.split("=")
        lines.append(f"{name} = FakeBackend({name!r}, priority={priority})\n")
        entries.append(f"{name} = fake_accel_plugins:{name}")
    install_entry_point(site, "\n".join(entries), "fake_accel_plugins", "".join(lines))


def test_autoload_activates_the_only_real_accelerator_installed(tmp_path):
    _installed_fake(tmp_path, "fakeaccel=5")
    proc = run_python(
        CURRENT_ACCELERATOR + "; x = torch.arange(4.0, device='fakeaccel'); print((x * x).sum().item())",
        env=with_path(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fakeaccel", str((torch.arange(4.0) ** 2).sum().item())]


def test_autoload_activates_nothing_when_two_real_accelerators_are_installed(tmp_path):
    _installed_fake(tmp_path, "fakeaccel=5", "otheraccel=7")
    proc = run_python(
        CURRENT_ACCELERATOR + "; import accelkit; print(accelkit.select_device())", env=with_path(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "otheraccel:0"], "ambiguous at import; priority decides on request"
