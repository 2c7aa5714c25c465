"""``accelkit conformance coverage`` and ``coverage-diff``, run as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import accelkit
from accelkit import _runtime
from accelkit_conformance.coverage import PATHS, diff_audits, families_left


def conformance(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    return subprocess.run([sys.executable, "-m", "accelkit", "conformance", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("coverage")
    done = conformance("coverage", "--backend", "ref", "--out", str(out), cwd=out)
    assert done.returncode == 0, done.stderr
    assert "accelkit native coverage — ref" in done.stdout
    return out


def test_the_audit_counts_equal_the_kernel_table_and_the_registrations(audited, dev):
    doc = json.loads((audited / "ref.json").read_text())
    assert doc["schema"] == "accelkit-coverage/1" and doc["backend"] == "ref" and doc["target"] == "host"
    ops = doc["ops"]
    assert sum(doc["counts"].values()) == doc["total"] == len(ops)
    assert doc["counts"] == {p: sum(1 for r in ops.values() if r["path"] == p) for p in PATHS}
    # ref's kernel table, as activated in this process: each of its ops that has a CPU kernel
    # is a native kernel in the audit, and nothing else is.
    table = {str(entry.op) for entry in _runtime.active().kernels}
    kernels = {op for op, row in ops.items() if row["detail"] == "ref's kernel"}
    assert kernels == table & set(ops)
    derived = {op for op, row in ops.items() if row["path"] == "derived"}
    assert derived == {str(op) for op, kind in _runtime.registered.items() if kind == "derived"} & set(ops)
    assert doc["families_left"] == families_left(ops)
    assert all(f["fallback"] > 0 for f in doc["families_left"])


def test_the_audit_renders_as_markdown_and_html(audited):
    markdown = (audited / "coverage.md").read_text()
    page = (audited / "coverage.html").read_text()
    doc = json.loads((audited / "ref.json").read_text())
    first = doc["families_left"][0]["family"]
    assert "# accelkit native coverage" in markdown and f"| {first} |" in markdown
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and first in page


def test_coverage_diff_flags_an_op_that_moved_to_a_worse_path(audited, tmp_path):
    base = json.loads((audited / "ref.json").read_text())
    native = next(op for op, row in base["ops"].items() if row["path"] == "native")
    fallback = next(op for op, row in base["ops"].items() if row["path"] == "fallback")
    worse = json.loads(json.dumps(base))
    worse["ops"][native]["path"] = "fallback"
    worse["ops"][fallback]["path"] = "decomposed"
    (tmp_path / "worse.json").write_text(json.dumps(worse))

    same = conformance("coverage-diff", str(audited / "ref.json"), str(audited / "ref.json"), cwd=tmp_path)
    assert same.returncode == 0 and "no overload changed path" in same.stdout
    moved = conformance("coverage-diff", str(audited / "ref.json"), str(tmp_path / "worse.json"), cwd=tmp_path)
    assert moved.returncode == 1
    assert f"{native}: native -> fallback" in moved.stdout and f"{fallback}: fallback -> decomposed" in moved.stdout
    text, code = diff_audits(worse, base)  # backwards: native again, but decomposed went back to the CPU
    assert int(code) == 1
    better, worse_part = text.split("moved to a better path")[1], text.split("moved to a better path")[0]
    assert f"{native}: fallback -> native" in better and f"{fallback}: decomposed -> fallback" in worse_part


def test_an_unusable_audit_or_backend_is_named(tmp_path):
    (tmp_path / "bad.json").write_text('{"schema": "something else"}')
    bad = conformance("coverage-diff", str(tmp_path / "bad.json"), str(tmp_path / "bad.json"), cwd=tmp_path)
    assert bad.returncode == 2 and "bad.json: not a coverage audit" in bad.stderr
    unknown = conformance("coverage", "--backend", "nosuchbackend", cwd=tmp_path)
    assert unknown.returncode == 2 and "could not audit 'nosuchbackend'" in unknown.stderr
    assert accelkit.active_backend() == "ref"
