"""neuron's estimate through the public API: device time plus launch time by the SDK's rule
(accelkit.sdk.LaunchLedger), with the target's sourced per-launch cost. The rule on any
backend's device: accelkit.sdk.testing.generic.test_estimates."""

from __future__ import annotations

import pytest

import accelkit
from accelkit.sdk import active_device_model
from accelkit_backends.neuron.device import device_model


def _estimate() -> dict:
    return accelkit.stats()["estimate"]


def test_the_default_targets_launch_cost_is_published_and_the_others_say_they_are_not():
    model = active_device_model()
    assert model.name == "trn2" and model.launch_seconds > 0
    assert "vllm-neuron" in model.sources["launch_seconds"]
    for other in ("trn1", "trn3"):
        flagged = device_model(other)
        assert flagged.launch_seconds == model.launch_seconds
        assert flagged.sources["launch_seconds"].startswith("no published figure")



#: The validation table's tolerance (docs/estimates.md): each estimate within 25% of the published
#: measurement, the issue's bar.
TABLE_TOLERANCE = 0.25


def test_the_validation_tables_points_are_estimated_within_its_tolerance(dev):
    """bench/validate_estimates.py's published points for this backend, run here through the
    public API; the 8192³ matmul (about a minute of CPU) is left to the script."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    try:
        from validate_estimates import published_points
    finally:
        sys.path.pop(0)
    rows = published_points(dev.type, dev, skip_large=True)
    assert rows
    for row in rows:
        ratio = row["total_s"] / row["published_s"]
        assert abs(ratio - 1) <= TABLE_TOLERANCE, (row["point"], ratio)
        assert row["total_s"] == pytest.approx(row["device_s"] + row["launch_s"])


TRN1_CHILD = """
import json, sys
sys.path.insert(0, {bench!r})
import accelkit
from validate_estimates import TRN1_ENCODERS, _encoder, per_layer_point
device = accelkit.select_device("neuron")
rows = [{{**_encoder(device, config), "table": "published", "published_s": published, "point": name}}
        for name, config, published in TRN1_ENCODERS[:2]]
print("ROWS " + json.dumps(rows + [per_layer_point(rows)]))
"""


@pytest.fixture(scope="module")
def trn1_encoders() -> list[dict]:
    """distilbert-base and bert-base, batch 1, seq 128, on trn1 (AWS's latency table), and the
    per-layer point their difference gives; in a child process: the target is chosen when the
    backend is activated."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parents[3] / "bench")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")} | {"ACCELKIT_NEURON_TARGET": "trn1"}
    result = subprocess.run([sys.executable, "-c", TRN1_CHILD.format(bench=bench)], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads([ln for ln in result.stdout.splitlines() if ln.startswith("ROWS ")][-1][5:])


def test_a_published_trn1_encoder_latency_is_estimated_within_the_tables_tolerance(trn1_encoders):
    """distilbert's whole call: device time and the per-call cost. The run itself must work; the
    ratio is a known gap (an xfail naming it) until the model is fixed."""
    row = trn1_encoders[0]
    assert row["target"] == "trn1" and row["launches"] == 1 and row["syncs"] == 1
    assert row["total_s"] == pytest.approx(row["device_s"] + row["launch_s"])
    ratio = row["total_s"] / row["published_s"]
    # 2.0x since next-fit SBUF, in-place reads of on-chip blocks and interleaved engine streams;
    # 3.2x before; 10.7x when every call transposed and cast the weights again: a regression of
    # any of those shows here.
    assert ratio < 2.5, f"estimated {ratio:.1f}x the published latency: are the weights prepared at every call?"
    if abs(ratio - 1) > TABLE_TOLERANCE:
        pytest.xfail(f"known gap (docs/estimates.md): estimated {ratio:.1f}x the published latency (3.2x before "
                     "next-fit SBUF, in-place reads and interleaved engine streams, 10.7x before weights were laid out and cast once per compiled "
                     "program): the per-call cost is trn2's 437 us (the table's own intercept is about 0.14 ms), and "
                     "each layer is estimated 1.6x its published time (the next test)")


def test_a_trn1_encoder_layer_is_estimated_within_the_tables_tolerance(trn1_encoders):
    """One encoder layer: the difference of two published latencies over the layers between them
    (the per-call cost cancels), against the difference of the two estimates' device times."""
    distilbert, bert_base, layer = trn1_encoders
    assert layer["launch_s"] == 0 and layer["device_s"] == pytest.approx(
        (bert_base["device_s"] - distilbert["device_s"]) / 6)
    ratio = layer["device_s"] / layer["published_s"]
    assert 1 - TABLE_TOLERANCE < ratio < 2.0, f"estimated {ratio:.2f}x the published time per layer"
    if abs(ratio - 1) > TABLE_TOLERANCE:
        pytest.xfail(f"known gap (docs/estimates.md): a layer is estimated {ratio:.2f}x its published time; its "
                     "ops run as programs in dependence order, where neuronx-cc fuses attention and layer norms into "
                     "the matmuls around them and hides them under the weights' streaming")
