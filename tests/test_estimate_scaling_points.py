"""Published MFU at scale against the scaling projection of a one-device run (docs/estimates.md,
"At scale"; bench/scaling_points.py has the points and their sources).

Each point runs one decoder layer at its per-chip widths on the simulated TPU (a child process
per target), then projects it with accelkit.project_scaling. The quick point runs always; the
others take minutes of CPU each here (a 16B-64B layer's matmuls at 512 tokens), so they run with
ACCELKIT_SCALING_ALL=1 (and in ``python bench/scaling_points.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from accelkit import ScalingPlan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from scaling_points import POINTS, run_points  # noqa: E402

#: Points whose estimate misses by more than 25%, with the cause (docs/estimates.md).
KNOWN_GAPS = {
    "MaxText 128B, v5e-256, fsdp 16 x tp 16": (
        "unfused elementwise ops: the run is eager, so each norm, activation and residual op is a "
        "program of its own that round-trips HBM (about half the layer's device time), where XLA on "
        "a TPU fuses them; with tensor parallelism 16 the matmuls per chip shrink 16x and these ops "
        "do not. Also qkv_proj_offloaded is counted as full rematerialisation"),
    "tpu-recipes Llama3.1-8B, v6e-8, fsdp 8": (
        "attention over 1024 tokens in the run against 8192 published (its FLOPs grow with the "
        "sequence) and the output layer (vocabulary 128256) are not in the one-layer run, so MFU's "
        "numerator misses them, and unfused elementwise ops (as for 128B) add time; the step time is "
        "within 25% only because the errors partly cancel"),
}
ALL = os.environ.get("ACCELKIT_SCALING_ALL") == "1"
CHOSEN = [p for p in POINTS if p.fast or ALL]


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    return {r["point"]: r for r in run_points(CHOSEN)}


@pytest.mark.parametrize("point", CHOSEN, ids=[p.name for p in CHOSEN])
def test_projected_mfu_against_the_published_one(point, rows):
    row = rows[point.name]
    plan = ScalingPlan.parse(point.plan)
    assert (row["target"], row["chips"]) == (point.target, plan.chips)
    # the model FLOPs are the run's, repeated over the layers and the chip's tokens: about 6 per
    # parameter and token (bf16 parameters: 2 bytes each), plus the attention's
    copies = plan.layers * point.chip_tokens / point.run_tokens
    assert row["model_flops"] == pytest.approx(row["run_flops"] * copies)
    assert row["run_flops"] >= 6 * row["run_parameter_bytes"] / 2 * point.run_tokens
    assert row["seconds"]["compute"] <= row["step_seconds"]
    ratio = row["mfu"] / point.published_mfu
    if point.name in KNOWN_GAPS and not 0.75 <= ratio <= 1.25:
        pytest.xfail(f"MFU ratio {ratio:.3f}: {KNOWN_GAPS[point.name]}")
    assert 0.75 <= ratio <= 1.25, f"{point.name}: estimated MFU {row['mfu']:.3f}, published {point.published_mfu:.3f}"

