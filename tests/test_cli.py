"""The ``accelkit`` command, run as a user runs it: in a fresh process, without ACCELKIT_* settings."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BUILTIN_ORDER = ["cuda", "xpu", "mps", "cpu"]
REPORT_FIELDS = {
    "name", "kind", "available", "simulated", "device_count", "target", "priority", "active", "reason", "origin",
}


def accelkit_cli(*args: str, env: dict[str, str] | None = None, command: list[str] | None = None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full_env.update(env or {})
    return subprocess.run(
        [*(command or [sys.executable, "-m", "accelkit"]), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def table(stdout: str) -> dict[str, dict[str, str]]:
    """``accelkit devices`` output as {device: {column: cell}} (columns are 2+ spaces apart)."""
    table_part, _, _ = stdout.partition("\n\n")  # notes follow the table after a blank line
    header, *rows = table_part.splitlines()
    columns = re.split(r"\s{2,}", header.strip())
    parsed = {}
    for row in rows:
        cells = re.split(r"\s{2,}", row.strip())
        parsed[cells[0]] = dict(zip(columns, cells + [""] * (len(columns) - len(cells))))
    return parsed


# -- accelkit devices ----------------------------------------------------------------------------


def test_devices_table_shows_ref_as_an_available_simulated_plugin_and_the_cpu():
    proc = accelkit_cli("devices")
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0].split()
    assert header[:6] == ["DEVICE", "KIND", "STATUS", "MODE", "COUNT", "TARGET"] and header[-1] == "NOTE"
    rows = table(proc.stdout)
    ref = rows["ref"]
    assert (ref["KIND"], ref["STATUS"], ref["MODE"], ref["COUNT"], ref["TARGET"]) == (
        "plugin", "available", "simulated", "1", "host"
    )
    assert ref["NOTE"] == "select by name: select_device('ref')"
    cpu = rows["cpu"]
    assert (cpu["KIND"], cpu["STATUS"], cpu["MODE"], cpu["COUNT"]) == ("builtin", "available", "real", "1")
    assert list(rows)[-4:] == BUILTIN_ORDER
    assert "torch.distributed" in proc.stdout and "host-staged" in proc.stdout



def test_devices_json_lists_every_device_with_its_state():
    proc = accelkit_cli("devices", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert all(REPORT_FIELDS <= set(entry) for entry in listed)
    by_name = {entry["name"]: entry for entry in listed}
    assert [e["name"] for e in listed if e["kind"] == "builtin"] == BUILTIN_ORDER
    assert [e["kind"] for e in listed] == sorted((e["kind"] for e in listed), key=lambda k: k != "plugin")

    ref = by_name["ref"]
    assert ref["kind"] == "plugin"
    assert ref["available"] is True and ref["simulated"] is True and ref["active"] is False
    assert (ref["device_count"], ref["target"], ref["priority"]) == (1, "host", 0)
    assert ref["origin"].startswith("accelkit_backends.ref")

    cpu = by_name["cpu"]
    assert (cpu["kind"], cpu["available"], cpu["simulated"], cpu["device_count"], cpu["reason"]) == (
        "builtin", True, False, 1, None
    )
    unavailable = [e for e in listed if not e["available"]]
    assert all(e["reason"] for e in unavailable), "an unavailable device always says why"


def test_devices_marks_the_backend_autoloaded_from_the_env_as_active():
    proc = accelkit_cli("devices", "--json", env={"ACCELKIT_DEVICE": "ref"})
    assert proc.returncode == 0, proc.stderr
    assert {e["name"]: e["active"] for e in json.loads(proc.stdout)}["ref"] is True

    proc = accelkit_cli("devices", env={"ACCELKIT_DEVICE": "ref"})
    assert table(proc.stdout)["ref"]["STATUS"] == "active"


def _install(site: Path, dist: str, entry: str, source: str) -> None:
    """An ``accelkit.backends`` entry point ``entry`` of distribution ``dist`` (module ``dist``)."""
    (site / f"{dist}.py").write_text(source)
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[accelkit.backends]\n{entry}\n")


ANNOUNCE = "from accelkit.sdk import BackendInfo, hookimpl\n\n@hookimpl\ndef accelkit_register_backend():\n    return BackendInfo(name={!r})\n"


def test_devices_shows_broken_and_refused_plugins_with_their_origins(tmp_path):
    _install(tmp_path, "exits_at_import", "exiting = exits_at_import", "raise SystemExit('no driver')\n")
    _install(tmp_path, "fake_ref", "ref = fake_ref", ANNOUNCE.format("ref"))
    _install(tmp_path, "twin_one", "twin = twin_one", ANNOUNCE.format("twin"))
    _install(tmp_path, "twin_two", "twin = twin_two", ANNOUNCE.format("twin"))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)}
    exiting = "plugin exits_at_import (exits_at_import) failed to import: SystemExit: no driver"
    fake_ref = (
        "plugin fake_ref (fake_ref) announces 'ref', refused: 'ref' is accelkit's in-tree backend "
        "(accelkit_backends.ref (accelkit)), which a plugin cannot replace; rename the plugin's backend"
    )
    twin = (
        "backend name 'twin' is announced by 2 plugins, twin_one (twin_one) and twin_two (twin_two); "
        "accelkit uses none of them. Uninstall all but one."
    )

    proc = accelkit_cli("devices", env=env)
    assert (proc.returncode, proc.stderr) == (0, "")
    listing, refused = proc.stdout.split("\n\nrefused plugins (a backend name has one owner):\n")
    rows = table(listing)
    assert (rows["exiting"]["STATUS"], rows["exiting"]["NOTE"]) == ("unavailable", exiting)
    assert (rows["twin"]["STATUS"], rows["twin"]["NOTE"]) == ("unavailable", twin)
    assert (rows["ref"]["STATUS"], rows["ref"]["NOTE"]) == ("available", "select by name: select_device('ref')")
    assert sorted(refused.splitlines()) == [  # in the table's order, which the probes decide
        f"  ref: {fake_ref}",
        "  twin: plugin twin_one (twin_one) announces 'twin', refused: twin_two (twin_two) announces 'twin' "
        "too, and accelkit chooses neither",
        "  twin: plugin twin_two (twin_two) announces 'twin', refused: twin_one (twin_one) announces 'twin' "
        "too, and accelkit chooses neither",
    ]

    proc = accelkit_cli("devices", "--json", env=env)
    assert (proc.returncode, proc.stderr) == (0, "")
    listed = {e["name"]: e for e in json.loads(proc.stdout)}
    assert (listed["exiting"]["available"], listed["exiting"]["reason"]) == (False, exiting)
    assert (listed["ref"]["available"], listed["ref"]["origin"], listed["ref"]["conflicts"]) == (
        True, "accelkit_backends.ref (accelkit)", [fake_ref]
    )
    assert (listed["twin"]["available"], listed["twin"]["reason"], len(listed["twin"]["conflicts"])) == (
        False, twin, 2
    )
    assert listed["twin"]["origin"] == "twin_one (twin_one), twin_two (twin_two)"

    proc = accelkit_cli("select", "twin", env=env)
    assert (proc.returncode, proc.stderr) == (2, f"accelkit: error: device 'twin' is unavailable: {twin}\n")
    proc = accelkit_cli("select", "ref", env=env)
    assert (proc.returncode, proc.stdout) == (0, "selected ref:0\n")


# -- accelkit select -----------------------------------------------------------------------------


def test_select_ref_prints_the_selected_device():
    proc = accelkit_cli("select", "ref")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "selected ref:0\n", "")


def test_select_with_a_preference_list_explains_skipped_devices():
    proc = accelkit_cli("select", "ref:1,cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "selected cpu",
        "  not chosen: ref: ref:1 does not exist: 1 ref device(s) visible",
    ]


def test_select_without_a_spec_explains_why_ref_was_passed_over():
    proc = accelkit_cli("select")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("selected ") and lines[0] != "selected ref:0"
    assert "  not chosen: ref: simulated; chosen only by name (select_device('ref'))" in lines


def test_select_without_a_spec_uses_the_env():
    proc = accelkit_cli("select", env={"ACCELKIT_DEVICE": "ref"})
    assert (proc.returncode, proc.stdout) == (0, "selected ref:0\n")


def test_select_unknown_device_exits_2_with_the_error_on_stderr():
    proc = accelkit_cli("select", "nosuch")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("accelkit: error: unknown device 'nosuch'. Known devices: ")
    known = proc.stderr.strip().split("Known devices: ", 1)[1].rstrip(".").split(", ")
    assert {"ref", *BUILTIN_ORDER} <= set(known)


def test_select_misspelled_device_suggests_the_right_name():
    proc = accelkit_cli("select", "rf")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("accelkit: error: unknown device 'rf'. Did you mean 'ref'? Known devices: ")


def test_select_an_unavailable_device_exits_2_with_the_reason():
    proc = accelkit_cli("select", "ref:1")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "accelkit: error: ref:1 does not exist: 1 ref device(s) visible\n"


def test_a_bad_fallback_setting_is_reported_as_itself_not_as_a_broken_backend():
    proc = accelkit_cli("select", "ref", env={"ACCELKIT_FALLBACK": "sometimes"})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "accelkit: error: ACCELKIT_FALLBACK='sometimes' is not a fallback policy; use one of deny, warn, allow\n"
    )


@pytest.mark.parametrize("args", [[], ["frobnicate"]], ids=["no-command", "unknown-command"])
def test_a_missing_or_unknown_command_is_a_usage_error(args):
    proc = accelkit_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: accelkit ")


def test_the_installed_console_script_runs_the_same_cli():
    script = shutil.which("accelkit", path=str(Path(sys.executable).parent))
    assert script is not None, "the accelkit console script is installed next to this python"
    proc = accelkit_cli("select", "ref", command=[script])
    assert (proc.returncode, proc.stdout) == (0, "selected ref:0\n")
