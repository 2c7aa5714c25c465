"""``accelkit project`` (issue #41 item 4 on the command line): a saved ``accelkit run`` report
projected to N chips, per target, equal to :func:`accelkit.project_scaling` on the same figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import accelkit
from accelkit._run.project import parse_bytes

STEP = """
import torch, accelkit
d = accelkit.select_device()
layer = torch.nn.Linear(256, 512, dtype=torch.bfloat16, device=d)
x = torch.randn(128, 256, dtype=torch.bfloat16, device=d)
layer(x).float().square().mean().backward()
torch.tpu.synchronize()
"""


def _accelkit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELKIT_DEVICE", "ACCELKIT_ESTIMATE_ON")}
    return subprocess.run([sys.executable, "-m", "accelkit", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=900)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """A real report: one bf16 layer's step on tpu, estimated on v5e and v6e."""
    where = tmp_path_factory.mktemp("project")
    (where / "step.py").write_text(STEP)
    done = _accelkit("run", "--device", "tpu", "--estimate-on", "v5e,v6e", "--report", str(where / "rep"),
                     "step.py", cwd=where)
    assert done.returncode == 0, done.stderr[-3000:]
    return where / "rep"


def test_each_target_is_project_scaling_of_the_reports_figures(report):
    from accelkit_backends.tpu.device import device_model

    done = _accelkit("project", str(report), "--plan", "fsdp=16,tp=4,layers=24", "--parameter-bytes", "256Ki",
                     "--activation-bytes", "128Ki", "--json", cwd=report)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    estimate = json.loads((report / "report.json").read_text())["estimate"]
    assert [row["target"] for row in rows] == ["v5e", "v6e"]
    plan = accelkit.ScalingPlan(fsdp=16, tensor=4, layers=24)
    for row in rows:
        seconds = estimate["seconds"] if row["target"] == estimate["target"] else estimate["by_target"][row["target"]]["seconds"]
        expected = accelkit.project_scaling(
            {"target": row["target"], "seconds": seconds, "flops": estimate["flops"]}, plan,
            parameter_bytes=256 * 1024, activation_bytes=128 * 1024, device_model=device_model(row["target"]))
        assert row["chips"] == 64
        assert row["step_seconds"] == pytest.approx(expected.step_seconds)
        assert row["mfu"] == pytest.approx(expected.mfu)
        assert row["seconds"] == pytest.approx(dict(expected.seconds))
    # v6e has the faster chip and links: each part of its step is shorter
    assert rows[1]["seconds"]["compute"] < rows[0]["seconds"]["compute"]
    assert rows[1]["step_seconds"] < rows[0]["step_seconds"]


def test_the_table_names_the_plan_every_target_and_what_the_model_leaves_out(report):
    done = _accelkit("project", str(report), "--plan", "dp=8,layers=12", "--parameter-bytes", "1M", cwd=report)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "plan: data=8, layers=12 (8 chips)" in out
    assert "\nv5e " in out and "\nv6e " in out and "MFU" in out
    assert "Estimated, not measured." in out and "left out:" in out


@pytest.mark.parametrize("args, culprit", [
    (("--plan", "tp=4", "--parameter-bytes", "1M"), "v5e: tensor parallelism needs activation_bytes"),
    (("--plan", "fsdp=512", "--parameter-bytes", "1M"), "more than one ICI domain"),
    (("--plan", "fsdp=4", "--parameter-bytes", "1Q"), "'1Q' is not a size in bytes"),
    (("--plan", "fsdp=4,zz=3", "--parameter-bytes", "1M"), "unknown plan field 'zz'"),
    (("--plan", "fsdp=4", "--parameter-bytes", "1M", "--dtype", "int3"), "'int3' is not one of"),
])
def test_bad_input_is_refused_naming_the_culprit(report, args, culprit):
    done = _accelkit("project", str(report), *args, cwd=report)
    assert done.returncode == 2 and culprit in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_target_its_backend_does_not_know_is_named(report, tmp_path):
    saved = json.loads((report / "report.json").read_text())
    saved["estimate"]["by_target"]["v9z"] = dict(saved["estimate"]["by_target"]["v6e"])
    (tmp_path / "report.json").write_text(json.dumps(saved))
    done = _accelkit("project", str(tmp_path), "--plan", "fsdp=4", "--parameter-bytes", "1M", cwd=tmp_path)
    assert done.returncode == 2 and "backend 'tpu' does not know the report's target 'v9z'" in done.stderr


def test_missing_report_is_refused(tmp_path):
    done = _accelkit("project", str(tmp_path / "none"), "--plan", "fsdp=4", "--parameter-bytes", "1M", cwd=tmp_path)
    assert done.returncode == 2 and "accelkit project: no report at" in done.stderr


def test_neuron_describes_its_generations_by_name_without_activation():
    from accelkit_backends.neuron.device import accelkit_target_model

    model = accelkit_target_model("TRN1")
    assert model is not None and model.name == "trn1" and model.interconnect is not None
    assert accelkit_target_model("v5e") is None
    assert model.peak_flops[torch.bfloat16] > 0


@pytest.mark.parametrize("text, value", [("4096", 4096), ("1.5G", 1.5e9), ("512Mi", 512 * 2**20), ("2KiB", 2048),
                                         ("1e3", 1000), ("3 T", 3e12)])
def test_sizes_in_bytes(text, value):
    assert parse_bytes(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "-1", "1X", "G"])
def test_not_a_size(text):
    with pytest.raises(ValueError, match="not a size in bytes"):
        parse_bytes(text)
