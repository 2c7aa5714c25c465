"""accelkit.sdk.testing's pytest plugin, in fresh pytest processes: it activates the device it is
asked for, and nothing happens in a run that did not load it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accelkit.sdk.testing import device_under_test


def _pytest(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=300)


PROBE_TESTS = '''
import gc
from accelkit.sdk.testing import device_under_test

DEVICE = device_under_test()  # at import: the plugin activated it before collection


def test_device(dev, no_gc):
    assert dev is DEVICE and dev.type == "{expected}"
    assert not gc.isenabled()
'''


def test_the_plugin_activates_the_named_device_once_for_the_session(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE_TESTS.format(expected="ref"))
    run = _pytest(tmp_path, "-p", "accelkit.sdk.testing.plugin", "--accelkit-device", "ref", "test_probe.py",
                  env={"ACCELKIT_TEST_DEVICE": "nonesuch"})  # the option wins over the variable
    assert run.returncode == 0, run.stdout + run.stderr
    assert "accelkit device under test: ref" in run.stdout
    assert "1 passed" in run.stdout


def test_the_plugin_reads_the_device_from_the_environment_and_refuses_an_unknown_one(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE_TESTS.format(expected="ref"))
    run = _pytest(tmp_path, "-p", "accelkit.sdk.testing.plugin", "test_probe.py", env={"ACCELKIT_TEST_DEVICE": "nonesuch"})
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert "accelkit device under test ($ACCELKIT_TEST_DEVICE / default)" in run.stderr
    assert "nonesuch" in run.stderr


def test_without_the_plugin_nothing_is_activated_and_the_option_is_unknown(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE_TESTS.format(expected="ref"))
    run = _pytest(tmp_path, "test_probe.py")
    assert run.returncode == pytest.ExitCode.INTERRUPTED, run.stdout + run.stderr  # a collection error
    assert "no accelkit device under test: load the pytest plugin" in run.stdout
    run = _pytest(tmp_path, "--accelkit-device", "ref", "test_probe.py")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    assert "unrecognized arguments: --accelkit-device" in run.stderr


def test_this_session_runs_under_the_plugin(dev):
    assert device_under_test() is dev
