"""Declared capabilities: the TOML declarations, the probes that catch a false one, and the
report's capability table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelkit.sdk import CAPABILITIES
from accelkit_conformance.capabilities import NAMES, UNDECLARED, capability_of, rows


def test_the_table_knows_every_capability_of_the_sdk():
    assert set(NAMES) == set(CAPABILITIES)


@pytest.mark.parametrize("suite, subject, capability", [
    ("capabilities", "capability[compile]", "compile"),
    ("dynamic", "mlp.compile_dynamic", "dynamic_shapes"),
    ("dynamic", "mlp.compile_static", "compile"),
    ("dynamic", "mlp.eager", None),
    ("distributed", "all_reduce[2]", "distributed"),
    ("contract", "rng_manual_seed_reproduces", None),  # the default generator: every backend has it
    ("ops", "to_sparse", "sparse"),
    ("ops", "add", None),
])
def test_tests_map_to_the_capability_they_exercise(suite, subject, capability):
    assert capability_of(suite, subject) == capability


def test_rows_count_the_tests_and_fail_a_declared_capability_with_failures():
    records = [
        {"suite": "capabilities", "op": "capability[compile]", "outcome": "pass"},
        {"suite": "dynamic", "op": "mlp.compile_static", "outcome": "fail"},
        {"suite": "capabilities", "op": "capability[sparse]", "outcome": "skip-declared"},
    ]
    table = {r["capability"]: r for r in rows({"compile": True, "sparse": "no sparse here"}, records)}
    assert table["compile"] == {"capability": "compile", "declared": True, "reason": None, "probe": "pass",
                                 "ran": 2, "passed": 1, "ok": False}
    assert (table["sparse"]["declared"], table["sparse"]["reason"], table["sparse"]["ran"]) == (False, "no sparse here", 0)
    assert table["streams_events"]["reason"] == UNDECLARED


def run_capabilities(tmp_path: Path, declarations: str) -> dict[str, dict]:
    mine = tmp_path / "mine.toml"
    mine.write_text(declarations)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    done = subprocess.run([sys.executable, "-m", "accelkit", "conformance", "run", "--backend", "ref",
                           "--suite", "capabilities", "--expectations", str(mine), "--out", str(tmp_path / "out"),
                           "-j", "2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads((tmp_path / "out" / "ref" / "results.json").read_text())
    return {r["op"]: r for r in doc["results"]}, (tmp_path / "out" / "ref" / "report.md").read_text()


def test_a_false_declaration_is_caught_by_its_probe_and_an_undeclared_one_is_skipped(tmp_path):
    found, report = run_capabilities(tmp_path, '[capabilities]\nsparse = true\ncompile = "not today"\n')
    sparse = found["capability[sparse]"]
    assert sparse["outcome"] == "fail" and sparse["reason"].startswith("AssertionError: ref declares sparse, but the probe raised")
    compiled = found["capability[compile]"]
    assert (compiled["outcome"], compiled["reason"]) == ("skip-declared", "capability compile: not today")
    assert found["capability[pinned_memory]"]["outcome"] == "pass"
    assert "| sparse | FAILING · declared · probe fail · 0/1 tests passed |" in report
    assert "| compile | not declared: not today |" in report
