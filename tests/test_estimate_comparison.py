"""The tour's MLP step estimated on both backends (v5e, trn2): the factor between the two is the
one their launch counts and the chips' published per-launch costs give (docs/estimates.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

CHILD = """
import json, sys
sys.path.insert(0, {bench!r})
import accelkit
from accelkit.sdk import active_device_model
from validate_estimates import _mlp_step
row = _mlp_step(accelkit.select_device({backend!r}))
print("ROW " + json.dumps({{**row, "launch_cost": active_device_model().launch_seconds}}))
"""


def _mlp_step(backend: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    result = subprocess.run([sys.executable, "-c", CHILD.format(bench=str(BENCH), backend=backend)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads([ln for ln in result.stdout.splitlines() if ln.startswith("ROW ")][-1][4:])


def test_the_tour_steps_factor_between_v5e_and_trn2_is_their_launches_times_launch_cost():
    tpu, neuron = _mlp_step("tpu"), _mlp_step("neuron")
    assert (tpu["target"], neuron["target"]) == ("v5e", "trn2")
    for step in (tpu, neuron):
        # launch-bound on both: the device work of a step this small hides under its launches
        assert step["launch_s"] > 10 * step["device_s"]
        assert step["syncs"] == 1  # loss.item() once a step
    explained = (neuron["launches"] * neuron["launch_cost"]) / (tpu["launches"] * tpu["launch_cost"])
    assert neuron["total_s"] / tpu["total_s"] == pytest.approx(explained, rel=0.1)
