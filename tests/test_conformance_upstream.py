"""The ``upstream`` suite: PyTorch-style device-generic test files (``tests/upstream_style``, as
CI has no PyTorch checkout) run through ``accelkit conformance run`` for a backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelkit_conformance.cases import parse_nodeid, upstream_case

FILES = Path(__file__).resolve().parent / "upstream_style"
TINY = "upstream/test_tiny_device.py::TestTiny::"


def conformance_run(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "accelkit", "conformance", "run", "--backend", "ref",
                           "--out", str(tmp_path / "out"), *args], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=600)


def records(tmp_path: Path) -> dict[str, dict]:
    doc = json.loads((tmp_path / "out" / "ref" / "results.json").read_text())
    return {r["id"]: r for r in doc["results"]}


@pytest.fixture(scope="module")
def crashing_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    tmp = tmp_path_factory.mktemp("upstream")
    declared = tmp / "mine.toml"
    declared.write_text('[known_failures]\n"upstream/test_tiny_device.py::TestTiny::test_declared_gap" = '
                        '"zeros are not ones: a declared gap"\n')
    done = conformance_run(tmp, "--suite", "upstream", "--pytorch-tests", str(FILES), "--expectations", str(declared),
                           "-j", "2", env={"ACCELKIT_TINY_CRASH": "1"})
    return done, tmp


def test_each_instantiated_test_gets_a_record_under_its_normalised_name(crashing_run):
    done, tmp = crashing_run
    assert done.returncode == 1, done.stderr  # a failure and a crash: results, not an error
    found = records(tmp)
    assert set(found) == {TINY + name for name in (
        "test_add", "test_mul[float32]", "test_mul[int64]", "test_wrong_answer", "test_declared_gap", "test_crash",
        "test_cuda_only")}
    outcomes = {rid.removeprefix(TINY): r["outcome"] for rid, r in found.items()}
    assert outcomes == {"test_add": "pass", "test_mul[float32]": "pass", "test_mul[int64]": "pass",
                        "test_wrong_answer": "fail", "test_declared_gap": "xfail", "test_crash": "crash",
                        "test_cuda_only": "skip-other"}
    mul = found[TINY + "test_mul[int64]"]
    assert (mul["suite"], mul["op"], mul["dtype"]) == ("upstream", "test_tiny_device.py::TestTiny::test_mul", "int64")
    assert found[TINY + "test_add"]["paths"]["native"] > 0  # the ops that ran, by path
    assert "declared gap" in found[TINY + "test_declared_gap"]["reason"]
    assert "Aborted" in found[TINY + "test_crash"]["reason"]
    assert "Expected 3.0 but got 2.0" in found[TINY + "test_wrong_answer"]["reason"]
    report = (tmp / "out" / "ref" / "report.md").read_text()
    assert "upstream — PyTorch's own device-generic test files" in report


def test_device_restrictions_can_be_bypassed(tmp_path):
    done = conformance_run(tmp_path, "--suite", "upstream", "--pytorch-tests", str(FILES), "--files",
                           "test_tiny_device.py", "--bypass-device-restrictions", "-k", "cuda_only or test_add", "-j", "1")
    assert done.returncode == 0, done.stderr
    assert {rid: r["outcome"] for rid, r in records(tmp_path).items()} == {
        TINY + "test_add": "pass", TINY + "test_cuda_only": "pass"}


@pytest.mark.parametrize("args, message", [
    (["--suite", "upstream"], "--suite upstream needs --pytorch-tests DIR"),
    (["--suite", "upstream", "--pytorch-tests", "nowhere"], "no such directory"),
    (["--suite", "upstream", "--pytorch-tests", str(FILES), "--files", "test_missing.py"], "no such test file"),
])
def test_an_unusable_upstream_request_is_refused_before_running(tmp_path, args, message):
    done = conformance_run(tmp_path, *args)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("nodeid", [
    "test_ops.py::TestCommonPRIVATEUSE1::test_out_add_privateuse1_float32",
    "test_ops.py::TestCommonTPU::test_out_add_tpu_float32",
    "../x/test_ops.py::TestCommonPRIVATEUSE1::test_out_add_tpu_float32",
])
def test_instantiated_names_normalise_whatever_ran_before(nodeid):
    case = upstream_case(nodeid, "tpu")
    assert (case.suite, case.op, case.dtype) == ("upstream", "test_ops.py::TestCommon::test_out_add", "float32")
    assert parse_nodeid(nodeid, "tpu") == case
    assert parse_nodeid("suites/test_ops.py::test_op[add-float32-forward]", "tpu").suite == "ops"
