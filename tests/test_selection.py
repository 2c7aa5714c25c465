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
#: How a plugin registered with accelkit.register_backend is named in messages.
RUNTIME_ORIGIN = "FakeBackend object (accelkit.register_backend)"


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
    def accelkit_probe(self):
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
    def accelkit_device_model(self):
        return DeviceModel(name=f"{self.name}-v1", vendor="accelkit tests", memory_bytes=1 << 30)

    @accelkit.hookimpl
    def accelkit_make_allocator(self, device_model):
        if self.activation_error is not None:
            raise self.activation_error
        from accelkit_backends.ref.buffers import RefAllocator

        return RefAllocator(f"{self.name}:0", device_model.memory_bytes)


class Broken(FakeBackend):
    """A FakeBackend whose hooks listed in ``hooks`` misbehave: they raise ``exc()`` or, without
    ``exc``, return ``answer``. The other hooks answer normally. ``calls`` records every hook
    the core called, with the ``name`` it passed."""

    def __init__(self, name, hooks, exc=None, answer=None, **kwargs):
        super().__init__(name, **kwargs)
        self.hooks = set(hooks)
        self.exc = exc
        self.answer = answer
        self.calls = []

    def _answer(self, hook, asked, normal=lambda: None):
        self.calls.append((hook, asked))
        if hook not in self.hooks:
            return normal()
        if self.exc is not None:
            raise self.exc()
        return self.answer

    @accelkit.hookimpl
    def accelkit_register_backend(self):
        return self._answer("register_backend", None, super().accelkit_register_backend)

    @accelkit.hookimpl
    def accelkit_probe(self, name):
        return self._answer("probe", name, super().accelkit_probe)

    @accelkit.hookimpl
    def accelkit_device_model(self, name):
        return self._answer("device_model", name, super().accelkit_device_model)

    @accelkit.hookimpl
    def accelkit_make_allocator(self, name, device_model):
        return self._answer(
            "make_allocator", name, lambda: super(Broken, self).accelkit_make_allocator(device_model)
        )

    @accelkit.hookimpl
    def accelkit_kernels(self, name):
        return self._answer("kernels", name)

    @accelkit.hookimpl
    def accelkit_decompositions(self, name):
        return self._answer("decompositions", name)

    @accelkit.hookimpl
    def accelkit_dtype_rules(self, name):
        return self._answer("dtype_rules", name)

    @accelkit.hookimpl
    def accelkit_autocast_policy(self, name):
        return self._answer("autocast_policy", name)

    @accelkit.hookimpl
    def accelkit_make_compiler(self, name):
        return self._answer("make_compiler", name)

    @accelkit.hookimpl
    def accelkit_backend_activated(self, name, device):
        return self._answer("backend_activated", name)

    @accelkit.hookimpl
    def accelkit_stats(self, name):
        return self._answer("stats", name, lambda: {"broken": {"name": name}})

    @accelkit.hookimpl
    def accelkit_reset_stats(self, name):
        return self._answer("reset_stats", name)

    @accelkit.hookimpl
    def accelkit_estimate(self, name):
        return self._answer("estimate", name)


class Abort(BaseException):
    """A plugin's own BaseException subclass."""


#: What a fresh interpreter needs to build FakeBackend and Broken plugins.
PRELUDE = (
    "import json\nimport torch\nimport accelkit\n"
    "from accelkit.sdk import BackendInfo, DeviceModel, DeviceProbe\n\n"
    + "\n\n".join(textwrap.dedent(inspect.getsource(c)) for c in (FakeBackend, Broken, Abort))
    + "\n"
)


def run_json(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` (after PRELUDE and VIEW) in a fresh interpreter; it prints one JSON object last."""
    proc = run_python(PRELUDE + VIEW + textwrap.dedent(code), env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def register():
    """Register fake backends in this process and remove them again after the test.

    Registrations are process-wide, so leaving them behind would change what every later
    test sees in ``accelkit.devices()``.
    """
    from accelkit._plugins import registry

    reg = registry()
    conflicts = {name: list(lines) for name, lines in reg.conflicts.items()}
    added = []

    def _register(plugin):
        added.append(plugin)
        return accelkit.register_backend(plugin)

    yield _register
    for plugin in added:
        reg.unregister(plugin)
    reg.conflicts.clear()
    reg.conflicts.update(conflicts)


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
    reason = f"plugin {RUNTIME_ORIGIN}: accelkit_probe raised RuntimeError: driver libflaky.so not found"

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
    reason = f"failed to initialise: plugin {RUNTIME_ORIGIN}: accelkit_make_allocator raised RuntimeError: firmware upload failed"
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
    assert (
        f"  not chosen: fw: backend 'fw' failed to initialise: plugin {RUNTIME_ORIGIN}: "
        "accelkit_make_allocator raised RuntimeError: firmware upload failed"
    ) in lines


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
        "plugin broken_accel_plugin (broken_accel_plugin) failed to import: ImportError: "
        "libbroken.so: cannot open shared object file"
    )
    broken = out["reports"]["brokenaccel"]
    assert (broken["kind"], broken["available"], broken["reason"]) == ("plugin", False, reason)
    assert out["reports"]["ref"]["available"], "one broken plugin must not hide the others"
    assert out["error"] == f"device 'brokenaccel' is unavailable: {reason}"
    row = next(line for line in out["table"].splitlines() if line.startswith("brokenaccel "))
    assert "unavailable" in row.split() and row.endswith(reason)


# -- plugins that raise anything -----------------------------------------------------------------

#: What a plugin raises (source for a fresh interpreter) and how accelkit names it. Only
#: KeyboardInterrupt passes through; ordinary exceptions are covered by the tests above.
BASE_EXCEPTIONS = [
    ("SystemExit(3)", "SystemExit: 3"),
    ("GeneratorExit()", "GeneratorExit"),
    ("Abort('firmware gone')", "Abort: firmware gone"),
]
KIND_IDS = ["SystemExit", "GeneratorExit", "BaseException-subclass"]

#: Helpers for a fresh interpreter: the process's view (reports, both `accelkit devices`
#: outputs) and an exception as "Type: message".
VIEW = """
import contextlib, io
from accelkit._cli import main as cli

def cli_out(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(list(args))
    return code, out.getvalue()

def view():
    code, text = cli_out("devices")
    json_code, listed = cli_out("devices", "--json")
    return {"reports": {r.name: r.as_dict() for r in accelkit.devices()}, "codes": [code, json_code],
            "table": text, "json": {d["name"]: d for d in json.loads(listed)}}

def error_of(call, *args):
    try:
        call(*args)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
"""

#: How a Broken plugin registered with accelkit.register_backend is named in messages.
BROKEN_ORIGIN = "Broken object (accelkit.register_backend)"


def row(table_text: str, name: str) -> str:
    return next(line for line in table_text.splitlines() if line.startswith(f"{name} "))


def assert_shown_unavailable(out: dict, name: str, reason: str) -> None:
    """``name`` is unavailable with ``reason`` in devices(), the table and the JSON."""
    assert (out["reports"][name]["available"], out["reports"][name]["reason"]) == (False, reason)
    assert (out["json"][name]["available"], out["json"][name]["reason"]) == (False, reason)
    line = row(out["table"], name)
    assert "unavailable" in line.split() and line.endswith(reason)
    assert out["codes"] == [0, 0]


def last_json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("raised, described", BASE_EXCEPTIONS, ids=KIND_IDS)
def test_a_plugin_raising_anything_at_import_or_while_loading_is_shown_and_torch_imports(
    tmp_path, raised, described
):
    install_entry_point(tmp_path, "importfail = import_fail_plugin", "import_fail_plugin",
                        f"{PRELUDE}\nraise {raised}\n")
    install_entry_point(
        tmp_path,
        "registerfail = hook_fail_plugins:registerfail\nprobefail = hook_fail_plugins:probefail",
        "hook_fail_plugins",
        f"{PRELUDE}\nregisterfail = Broken('registerfail', ['register_backend'], lambda: {raised})\n"
        f"probefail = Broken('probefail', ['probe'], lambda: {raised})\n",
    )
    # `import torch` runs accelkit's autoload, which loads every plugin and walks the list.
    proc = run_python(
        PRELUDE + VIEW + textwrap.dedent("""
        out = view()
        out["active"] = accelkit.active_backend()
        out["errors"] = {n: error_of(accelkit.select_device, n) for n in ("importfail", "registerfail", "probefail")}
        out["sum"] = (torch.arange(4.0, device=accelkit.select_device("ref")) * 2).sum().item()
        print(json.dumps(out))
        """),
        env=with_path(tmp_path, ACCELKIT_DEVICE="importfail,registerfail,probefail,ref"),
    )
    out = last_json(proc)
    assert proc.stderr == ""
    reasons = {
        "importfail": f"plugin import_fail_plugin (import_fail_plugin) failed to import: {described}",
        "registerfail": (
            "plugin hook_fail_plugins:registerfail (hook_fail_plugins): "
            f"accelkit_register_backend raised {described}"
        ),
        "probefail": f"plugin hook_fail_plugins:probefail (hook_fail_plugins): accelkit_probe raised {described}",
    }
    for name, reason in reasons.items():
        assert_shown_unavailable(out, name, reason)
        assert out["errors"][name] == f"DeviceUnavailableError: device {name!r} is unavailable: {reason}"
    assert out["active"] == "ref", "autoload passed over the broken backends"
    assert out["reports"]["ref"]["available"] and out["reports"]["tpu"]["origin"] == "accelkit_backends.tpu (accelkit)"
    assert out["sum"] == 12.0


#: The hooks the core calls while activating, before anything is installed.
ACTIVATION_HOOKS = [
    "device_model", "make_allocator", "decompositions", "kernels", "dtype_rules", "autocast_policy",
    "make_compiler",
]


@pytest.mark.parametrize("raised, described", BASE_EXCEPTIONS, ids=KIND_IDS)
def test_a_hook_raising_anything_fails_that_activation_and_the_process_stays_usable(raised, described):
    out = run_json(
        f"""
        RAISED = lambda: {raised}
        out = {{"register": error_of(accelkit.register_backend, Broken("regfail", ["register_backend"], RAISED)),
               "errors": {{}}}}
        for hook in {ACTIVATION_HOOKS!r}:
            accelkit.register_backend(Broken("bad" + hook.replace("_", ""), [hook], RAISED))
            out["errors"][hook] = error_of(accelkit.select_device, "bad" + hook.replace("_", ""))
        out.update(view())
        # Nothing was installed: another backend still activates, and its stats hooks may raise too.
        flaky_stats = Broken("statsfail", ["stats", "reset_stats"], RAISED)
        accelkit.register_backend(flaky_stats)
        dev = accelkit.select_device("statsfail")
        x = torch.arange(4.0, device=dev)
        out["sum"] = (x * 2).sum().item()
        out["stats"] = error_of(accelkit.stats)
        out["reset"] = error_of(accelkit.reset_stats)
        from accelkit import _runtime
        out["counted_after_reset"] = _runtime.active().counters.totals()
        out["after"] = (x + 1).cpu().tolist()
        out["active"] = accelkit.active_backend()
        out["asked"] = sorted({{name for _, name in flaky_stats.calls if name is not None}})
        print(json.dumps(out))
        """
    )
    assert out["register"] == f"PluginError: plugin {BROKEN_ORIGIN}: accelkit_register_backend raised {described}"
    assert "regfail" not in out["reports"]
    for hook in ACTIVATION_HOOKS:
        name = "bad" + hook.replace("_", "")
        reason = f"failed to initialise: plugin {BROKEN_ORIGIN}: accelkit_{hook} raised {described}"
        assert out["errors"][hook] == f"DeviceUnavailableError: backend {name!r} {reason}", hook
        assert_shown_unavailable(out, name, reason)
    assert (out["active"], out["sum"], out["after"]) == ("statsfail", 12.0, [1.0, 2.0, 3.0, 4.0])
    assert out["stats"] == f"PluginError: plugin {BROKEN_ORIGIN}: accelkit_stats raised {described}"
    assert out["reset"] == f"PluginError: plugin {BROKEN_ORIGIN}: accelkit_reset_stats raised {described}"
    assert sum(out["counted_after_reset"].values()) == 0, "the core's counters were reset before the hook"
    assert out["asked"] == ["statsfail"], "the active backend's hooks are asked about it only"


@pytest.mark.parametrize("raised, described", BASE_EXCEPTIONS, ids=KIND_IDS)
def test_a_failing_activated_hook_fails_the_activation_and_says_to_start_a_new_process(raised, described):
    out = run_json(
        f"""
        accelkit.register_backend(Broken("lateboom", ["backend_activated"], lambda: {raised}))
        out = {{"first": error_of(accelkit.select_device, "lateboom"),
               "again": error_of(accelkit.select_device, "lateboom"),
               "ref": error_of(accelkit.select_device, "ref"),
               "active": accelkit.active_backend(),
               "cpu": str(accelkit.select_device("cpu")), "cpu_sum": (torch.ones(3) * 2).sum().item()}}
        out.update(view())
        print(json.dumps(out))
        """
    )
    reason = f"failed to initialise: plugin {BROKEN_ORIGIN}: accelkit_backend_activated raised {described}"
    assert out["first"] == f"DeviceUnavailableError: backend 'lateboom' {reason}"
    assert out["again"] == f"DeviceUnavailableError: device 'lateboom' is unavailable: {reason}"
    assert out["ref"] == (
        "BackendConflictError: cannot activate 'ref': 'lateboom' was installed as PrivateUse1, then its "
        f"plugin failed (plugin {BROKEN_ORIGIN}: accelkit_backend_activated raised {described}). PyTorch "
        "registers PrivateUse1 once per process, so start a new process."
    )
    assert_shown_unavailable(out, "lateboom", reason)
    assert out["reports"]["ref"]["available"], "ref is not broken; this process is"
    assert (out["active"], out["cpu"], out["cpu_sum"]) == (None, "cpu", 6.0)


def test_keyboard_interrupt_from_a_plugin_is_not_swallowed(tmp_path):
    install_entry_point(tmp_path, "interrupted = interrupted_plugin", "interrupted_plugin",
                        "raise KeyboardInterrupt\n")
    out = run_json(
        """
        try:
            accelkit.devices()
            at_import = "not raised"
        except KeyboardInterrupt:
            at_import = "KeyboardInterrupt"
        try:
            accelkit.register_backend(Broken("kiprobe", ["probe"], KeyboardInterrupt))
            accelkit.devices()
            in_hook = "not raised"
        except KeyboardInterrupt:
            in_hook = "KeyboardInterrupt"
        print(json.dumps({"at_import": at_import, "in_hook": in_hook}))
        """,
        env=with_path(tmp_path, ACCELKIT_AUTOLOAD="0"),
    )
    assert out == {"at_import": "KeyboardInterrupt", "in_hook": "KeyboardInterrupt"}


WRONG_ANSWERS = [
    ("device_model", "{'memory': 1}", "dict", "DeviceModel"),
    ("make_allocator", "object()", "object", "DeviceAllocator"),
    ("kernels", "{}", "dict", "KernelTable"),
    ("decompositions", "[1]", "list", "Mapping"),
    ("make_compiler", "'inductor'", "str", "Callable"),
]


def test_a_hook_answering_with_the_wrong_type_is_named_and_nothing_is_installed():
    answers = "[" + ", ".join(f"({hook!r}, {answer})" for hook, answer, _, _ in WRONG_ANSWERS) + "]"
    out = run_json(
        f"""
        out = {{"register": error_of(accelkit.register_backend,
                                    Broken("badinfo", ["register_backend"], answer="badinfo"))}}
        accelkit.register_backend(Broken("badprobe", ["probe"], answer="yes"))
        for hook, answer in {answers}:
            accelkit.register_backend(Broken("bad" + hook.replace("_", ""), [hook], answer=answer))
            out[hook] = error_of(accelkit.select_device, "bad" + hook.replace("_", ""))
        out.update(view())
        out["sum"] = torch.ones(2, device=accelkit.select_device("ref")).sum().item()
        print(json.dumps(out))
        """
    )
    assert out["register"] == (
        f"PluginError: plugin {BROKEN_ORIGIN}: accelkit_register_backend returned str, not accelkit.sdk.BackendInfo"
    )
    assert_shown_unavailable(
        out, "badprobe", f"plugin {BROKEN_ORIGIN}: accelkit_probe returned str, not accelkit.sdk.DeviceProbe"
    )
    for hook, _, got, expected in WRONG_ANSWERS:
        name = "bad" + hook.replace("_", "")
        assert out[hook] == (
            f"DeviceUnavailableError: backend {name!r} failed to initialise: plugin {BROKEN_ORIGIN}: "
            f"accelkit_{hook} returned {got}, not {expected}"
        )
    assert out["sum"] == 2.0, "no failed activation installed anything"


# -- hooks go to the backend's own plugin only ---------------------------------------------------


def test_a_plugin_that_ignores_name_answers_for_its_own_backend_only():
    out = run_json(
        """
        class Greedy(FakeBackend):
            # Answers every hook whatever the name: before hooks were routed, it shadowed every backend.
            def __init__(self):
                super().__init__("greedy", priority=1000)
                self.asked = set()
            @accelkit.hookimpl
            def accelkit_probe(self, name):
                self.asked.add(name)
                return DeviceProbe(False, False, reason="greedy says no")
            @accelkit.hookimpl
            def accelkit_device_model(self, name):
                self.asked.add(name)
                return DeviceModel(name="greedy-v1", vendor="greedy", memory_bytes=1)
            @accelkit.hookimpl
            def accelkit_make_allocator(self, name, device_model):
                self.asked.add(name)
                raise RuntimeError("greedy allocator")
            @accelkit.hookimpl
            def accelkit_kernels(self, name):
                self.asked.add(name)
                return {}
            @accelkit.hookimpl
            def accelkit_autocast_policy(self, name):
                self.asked.add(name)
                return "greedy policy"
            @accelkit.hookimpl
            def accelkit_backend_activated(self, name, device):
                self.asked.add(name)
                raise RuntimeError("greedy activation")
            @accelkit.hookimpl
            def accelkit_stats(self, name):
                self.asked.add(name)
                return {"greedy": name}
            @accelkit.hookimpl
            def accelkit_reset_stats(self, name):
                self.asked.add(name)
                raise RuntimeError("greedy reset")
            @accelkit.hookimpl
            def accelkit_conformance_expectations(self, name):
                self.asked.add(name)
                raise RuntimeError("greedy expectations")

        greedy = Greedy()
        accelkit.register_backend(greedy)
        out = view()
        dev = accelkit.select_device("ref")
        out["sum"] = torch.ones(3, device=dev).sum().item()
        out["stats_keys"] = sorted(accelkit.stats())
        accelkit.reset_stats()
        from accelkit_conformance import expectations
        out["declared"] = expectations.load("ref").backend
        out["asked"] = sorted(greedy.asked)
        print(json.dumps(out))
        """
    )
    ref = out["reports"]["ref"]
    assert (ref["available"], ref["target"], ref["reason"]) == (True, "host", report("ref").reason)
    assert out["reports"]["greedy"]["reason"] == "greedy says no"
    assert out["sum"] == 3.0
    assert "greedy" not in out["stats_keys"]
    assert out["declared"] == "ref"
    assert out["asked"] == ["greedy"], "the core asked the greedy plugin about its own backend only"


# -- backend names are owned ---------------------------------------------------------------------


def test_an_in_tree_backend_cannot_be_replaced_by_an_installed_plugin(tmp_path):
    install_entry_point(tmp_path, "ref = evil_ref:plugin", "evil_ref",
                        f"{PRELUDE}\nplugin = Broken('ref', [], priority=99)\n")
    install_entry_point(tmp_path, "ref = broken_ref", "broken_ref", "raise SystemExit(2)\n")
    proc = run_python(
        PRELUDE + VIEW + textwrap.dedent("""
        import importlib.metadata
        out = view()
        out["order"] = [ep.dist.name for ep in importlib.metadata.entry_points(group="accelkit.backends")
                        if ep.name == "ref"]
        out["active"] = accelkit.active_backend()
        out["sum"] = (torch.arange(3.0, device=accelkit.select_device("ref")) + 1).sum().item()
        import evil_ref
        out["evil_calls"] = evil_ref.plugin.calls
        print(json.dumps(out))
        """),
        env=with_path(tmp_path, ACCELKIT_DEVICE="ref"),
        cwd=tmp_path,  # not the checkout, whose accelkit.egg-info would be found first
    )
    out = last_json(proc)
    assert proc.stderr == ""
    assert out["order"][-1] == "accelkit" and len(out["order"]) == 3, "the third parties are found first"
    ref = out["reports"]["ref"]
    assert (ref["available"], ref["active"], ref["origin"], ref["target"]) == (
        True, True, "accelkit_backends.ref (accelkit)", "host"
    )
    refused = sorted([
        "plugin evil_ref:plugin (evil_ref) announces 'ref', refused: 'ref' is accelkit's in-tree backend "
        "(accelkit_backends.ref (accelkit)), which a plugin cannot replace; rename the plugin's backend",
        "plugin broken_ref (broken_ref) failed to import: SystemExit: 2",
    ])
    assert sorted(ref["conflicts"]) == refused
    assert sorted(out["json"]["ref"]["conflicts"]) == refused
    section = out["table"].split("refused plugins (a backend name has one owner):\n", 1)[1]
    assert sorted(section.splitlines()) == [f"  ref: {line}" for line in refused]
    assert (out["active"], out["sum"]) == ("ref", 6.0)
    assert out["evil_calls"] == [["register_backend", None]], "none of the refused plugin's other hooks ran"


def test_two_installed_plugins_with_one_name_are_a_conflict_and_neither_is_used(tmp_path):
    for dist in ("twin_a", "twin_b"):
        install_entry_point(tmp_path, f"twinaccel = {dist}:plugin", dist,
                            f"{PRELUDE}\nplugin = FakeBackend('twinaccel', priority=5)\n")
    install_entry_point(tmp_path, "xla = xla_plugin:plugin", "xla_plugin",
                        f"{PRELUDE}\nplugin = FakeBackend('xla', priority=5)\n")
    proc = run_python(
        PRELUDE + VIEW + textwrap.dedent("""
        out = view()
        out["active"] = accelkit.active_backend()
        out["error"] = error_of(accelkit.select_device, "twinaccel")
        out["xla"] = error_of(accelkit.select_device, "xla")
        out["explanation"] = accelkit.explain_selection().splitlines()
        out["sum"] = torch.ones(4, device=accelkit.select_device("ref")).sum().item()
        print(json.dumps(out))
        """),
        env=with_path(tmp_path),
    )
    out = last_json(proc)
    assert proc.stderr == "", "autoload finds no unambiguous accelerator and says nothing"
    a, b = "twin_a:plugin (twin_a)", "twin_b:plugin (twin_b)"
    reason = (
        f"backend name 'twinaccel' is announced by 2 plugins, {a} and {b}; accelkit uses none of "
        "them. Uninstall all but one."
    )
    assert_shown_unavailable(out, "twinaccel", reason)
    conflicts = [
        f"plugin {a} announces 'twinaccel', refused: {b} announces 'twinaccel' too, and accelkit chooses neither",
        f"plugin {b} announces 'twinaccel', refused: {a} announces 'twinaccel' too, and accelkit chooses neither",
    ]
    assert out["json"]["twinaccel"]["conflicts"] == conflicts
    assert all(f"  twinaccel: {line}" in out["table"].splitlines() for line in conflicts)
    assert out["error"] == f"DeviceUnavailableError: device 'twinaccel' is unavailable: {reason}"
    assert f"  not chosen: twinaccel: {reason}" in out["explanation"]
    assert out["active"] is None
    xla = "plugin xla_plugin:plugin (xla_plugin) announces 'xla', refused: 'xla' is a PyTorch device type"
    assert_shown_unavailable(out, "xla", xla)
    assert out["xla"] == f"DeviceUnavailableError: device 'xla' is unavailable: {xla}"
    assert out["sum"] == 4.0


def test_registering_a_taken_name_is_refused_and_the_owner_keeps_it(register, dev):
    in_tree = (
        f"plugin {RUNTIME_ORIGIN} announces 'ref', refused: 'ref' is accelkit's in-tree backend "
        "(accelkit_backends.ref (accelkit)), which a plugin cannot replace"
    )
    with pytest.raises(accelkit.BackendConflictError) as err:
        register(FakeBackend("ref", priority=99))
    assert str(err.value) == f"{in_tree}. Give the backend another name."
    assert report("ref").conflicts == [in_tree]
    assert (report("ref").origin, report("ref").active) == ("accelkit_backends.ref (accelkit)", True)
    assert torch.equal((torch.ones(2, device=dev) + 1).cpu(), torch.full((2,), 2.0))

    assert register(FakeBackend("dupaccel")) == ["dupaccel"]
    with pytest.raises(accelkit.BackendConflictError) as err:
        register(FakeBackend("dupaccel", priority=7))
    assert str(err.value) == (
        f"plugin {RUNTIME_ORIGIN} announces 'dupaccel', refused: 'dupaccel' is already provided by "
        f"{RUNTIME_ORIGIN}. Give the backend another name."
    )
    assert (report("dupaccel").available, report("dupaccel").priority) == (True, 0), "the first one keeps it"

    for torch_name in ("cuda", "meta"):
        with pytest.raises(accelkit.BackendConflictError, match=f"'{torch_name}' is a PyTorch device type"):
            register(FakeBackend(torch_name))
    assert report("cuda").kind == "builtin" and report("cuda").conflicts == [
        f"plugin {RUNTIME_ORIGIN} announces 'cuda', refused: 'cuda' is a PyTorch device type"
    ]
    assert (report("meta").available, report("meta").reason) == (
        False, f"plugin {RUNTIME_ORIGIN} announces 'meta', refused: 'meta' is a PyTorch device type"
    )


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


def test_an_estimate_hook_that_raises_or_answers_wrongly_names_the_plugin():
    out = run_json(
        """
        from accelkit.sdk import Estimate
        out = {}
        def error_of(fn):
            try:
                fn()
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
        wrong = Broken("wrongestimate", ["estimate"], answer={"seconds": 1.0})
        accelkit.register_backend(wrong)
        dev = accelkit.select_device("wrongestimate")
        out["sum"] = torch.ones(2, device=dev).sum().item()
        out["wrong"] = error_of(accelkit.stats)
        wrong.answer = Estimate(target="x1", note="a test model", seconds=2.5, per_op={"aten.sum.default": (1, 2.5)})
        out["right"] = accelkit.stats()["estimate"]
        wrong.exc = lambda: RuntimeError("no model")
        out["raised"] = error_of(accelkit.stats)
        out["negative"] = error_of(lambda: Estimate(target="x1", note="n", seconds=-1.0))
        print(json.dumps(out))
        """
    )
    assert out["sum"] == 2.0
    assert out["wrong"] == f"PluginError: plugin {BROKEN_ORIGIN}: accelkit_estimate returned dict, not Estimate"
    assert out["right"] == {"target": "x1", "note": "a test model", "seconds": 2.5, "flops": None, "hbm_bytes": None,
                            "launch_seconds": 0.0, "total_seconds": 2.5, "launches": 0, "syncs": 0,
                            "by_target": {}, "not_estimated": {},
                            "per_op": {"aten.sum.default": {"calls": 1, "seconds": 2.5}}}
    assert out["raised"].startswith(f"PluginError: plugin {BROKEN_ORIGIN}: accelkit_estimate raised RuntimeError")
    assert out["negative"] == "ValueError: estimate for 'x1': seconds must not be negative"
