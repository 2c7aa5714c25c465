"""One run's estimate on several targets (issue #41 item 3): ``ACCELKIT_ESTIMATE_ON`` /
``accelkit run --estimate-on``, :class:`accelkit.sdk.TargetComparison`, ``accelkit compare``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelkit.sdk import ESTIMATE_ON_ENV, DeviceModel, LaunchLedger, TargetComparison, requested_targets


def _model(name: str, launch_seconds: float) -> DeviceModel:
    return DeviceModel(name=name, vendor="test", memory_bytes=1 << 30, memory_bandwidth=1e12,
                       peak_flops={torch.float32: 1e12}, launch_seconds=launch_seconds)


def test_requested_targets_are_the_variables_names_in_order_without_repeats(monkeypatch):
    monkeypatch.setenv(ESTIMATE_ON_ENV, " V5E, v6e,,trn2 ,v5e")
    assert requested_targets() == ["v5e", "v6e", "trn2"]
    monkeypatch.delenv(ESTIMATE_ON_ENV)
    assert requested_targets() == []


def test_each_target_follows_the_launch_rule_with_its_own_launch_cost_and_device_times():
    slow_host, fast_host = _model("a", 400e-6), _model("b", 100e-6)
    comparison = TargetComparison([slow_host, fast_host], {"x": "elsewhere"})
    alone = [LaunchLedger(400e-6), LaunchLedger(100e-6)]
    # a launch-bound run of small programs, a wait, then device-bound big ones, left unwaited
    events = [(1e-6, 2e-6)] * 10 + ["wait"] + [(900e-6, 300e-6)] * 3
    for event in events:
        if event == "wait":
            comparison.wait()
            for ledger in alone:
                ledger.wait()
        else:
            comparison.launch(event)
            for ledger, seconds in zip(alone, event):
                ledger.launch(seconds)
    rows = comparison.by_target()
    assert list(rows) == ["a", "b"] and comparison.not_estimated == {"x": "elsewhere"}
    for name, ledger, i in (("a", alone[0], 0), ("b", alone[1], 1)):
        expected = ledger.fields()
        device = sum(e[i] for e in events if e != "wait")
        assert rows[name]["seconds"] == pytest.approx(device)
        assert rows[name]["launch_seconds"] == pytest.approx(expected["launch_seconds"])
        assert rows[name]["total_seconds"] == pytest.approx(device + expected["launch_seconds"])
        assert (rows[name]["launches"], rows[name]["syncs"]) == (13, 1)
    # the host-bound target waits longer on its launches
    assert rows["a"]["launch_seconds"] > rows["b"]["launch_seconds"]
    comparison.reset()
    assert all(row["launches"] == 0 and row["total_seconds"] == 0 for row in comparison.by_target().values())


TPU_CHILD = """
import json, torch, accelkit
from accelkit_backends.tpu.device import device_model
d = accelkit.select_device("tpu")
a = torch.ones(4096, 4096, dtype=torch.bfloat16, device=d)
(a @ a).cpu()
accelkit.reset_stats()
(a @ a).cpu()
e = accelkit.stats()["estimate"]
peaks = {n: device_model(n).peak_flops[torch.bfloat16] for n in ("v5e", "v6e")}
print("ROW " + json.dumps({"estimate": e, "peaks": peaks}))
"""

NEURON_CHILD = """
import json, torch, accelkit
d = accelkit.select_device("neuron")
x = torch.ones(128, 512, device=d)
(x + 1).cpu()
print("ROW " + json.dumps(accelkit.stats()["estimate"]))
"""


def _child(code: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    result = subprocess.run([sys.executable, "-c", code], env=base | env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads([ln for ln in result.stdout.splitlines() if ln.startswith("ROW ")][-1][4:])


def test_tpu_estimates_every_asked_generation_from_the_same_programs():
    row = _child(TPU_CHILD, **{ESTIMATE_ON_ENV: "v6e,trn2"})
    e, peaks = row["estimate"], row["peaks"]
    assert list(e["by_target"]) == ["v5e", "v6e"]  # the active target first
    v5e, v6e = e["by_target"]["v5e"], e["by_target"]["v6e"]
    for key in ("seconds", "launch_seconds", "total_seconds", "launches", "syncs"):
        assert v5e[key] == e[key]
    assert (v6e["launches"], v6e["syncs"]) == (e["launches"], e["syncs"])
    # a 4096³ bf16 matmul is compute-bound on both: device times in the ratio of their peaks
    assert v6e["seconds"] / v5e["seconds"] == pytest.approx(peaks["v5e"] / peaks["v6e"], rel=0.02)
    assert "not a tpu generation" in e["not_estimated"]["trn2"]
    assert "accelkit compare" in e["not_estimated"]["trn2"]


def test_neuron_estimates_its_active_generation_and_says_why_not_the_others():
    e = _child(NEURON_CHILD, **{ESTIMATE_ON_ENV: "trn2,trn1,v5e"})
    assert list(e["by_target"]) == ["trn2"]
    assert e["by_target"]["trn2"]["total_seconds"] == e["total_seconds"]
    assert set(e["not_estimated"]) == {"trn1", "v5e"}
    assert "ACCELKIT_NEURON_TARGET=trn1" in e["not_estimated"]["trn1"]
    assert "not a neuron generation" in e["not_estimated"]["v5e"]


def test_run_estimate_on_and_compare_put_two_backends_runs_in_one_table(tmp_path):
    script = tmp_path / "work.py"
    script.write_text("import torch, accelkit\nd = accelkit.select_device()\n"
                      "x = torch.ones(256, 256, device=d)\nprint(float((x @ x).sum()))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    reports = {}
    for backend, targets in (("tpu", "v5e,7x,trn2"), ("neuron", "trn2")):
        reports[backend] = tmp_path / backend
        ran = subprocess.run([sys.executable, "-m", "accelkit", "run", "--device", backend, "--estimate-on", targets,
                              "--report", str(reports[backend]), str(script)],
                             env=env, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stderr[-2000:]
    tpu_report = json.loads((reports["tpu"] / "report.json").read_text())
    assert list(tpu_report["estimate"]["by_target"]) == ["v5e", "7x"]
    assert list(tpu_report["estimate"]["not_estimated"]) == ["trn2"]
    html = (reports["tpu"] / "report.html").read_text()
    assert 'id="estimate-targets"' in html and "<td>7x</td>" in html
    compared = subprocess.run([sys.executable, "-m", "accelkit", "compare", str(reports["tpu"]), str(reports["neuron"])],
                              env=env, capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0, compared.stderr
    table = [line.split() for line in compared.stdout.splitlines()[1:4]]
    assert [(row[1], row[2]) for row in table] == [("tpu", "v5e"), ("tpu", "7x"), ("neuron", "trn2")]
    assert table[0][-1] == "1.00×"
    missing = subprocess.run([sys.executable, "-m", "accelkit", "compare", str(tmp_path / "nowhere")],
                             env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no report at" in missing.stderr
