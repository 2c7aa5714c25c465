"""The estimate's launch half on the device under test: every backend whose device model has a
per-launch cost (``DeviceModel.launch_seconds``) charges it by the SDK's one rule
(:class:`accelkit.sdk.LaunchLedger`): a program the host waits on alone costs its device time plus
one launch; many small programs before one read are launch-bound."""

from __future__ import annotations

import pytest
import torch

import accelkit
from accelkit.sdk import active_device_model


@pytest.fixture(autouse=True)
def _launch_cost(dev):
    if not active_device_model().launch_seconds:
        pytest.skip(f"{dev.type}'s device model has no per-launch cost")


def _estimate() -> dict:
    return accelkit.stats()["estimate"]


def test_synchronous_calls_each_cost_their_device_time_plus_one_launch(dev):
    a = torch.ones(256, 256, dtype=torch.bfloat16, device=dev)
    b = torch.ones(256, 256, dtype=torch.bfloat16, device=dev)
    (a @ b).cpu()
    accelkit.reset_stats()
    calls = 3
    for _ in range(calls):
        c = a @ b
        getattr(torch, dev.type).synchronize()
    e = _estimate()
    assert e["launches"] == e["syncs"] == calls
    assert e["launch_seconds"] == pytest.approx(calls * active_device_model().launch_seconds)
    assert e["total_seconds"] == pytest.approx(e["seconds"] + e["launch_seconds"])
    del c


def test_small_ops_before_one_read_are_launch_bound(dev):
    x = torch.ones(64, device=dev)
    x.cpu()
    accelkit.reset_stats()
    for _ in range(10):
        x = x * 1.5 + 1.0
    x.sum().item()
    e = _estimate()
    launch = active_device_model().launch_seconds
    assert e["syncs"] == 1 and e["launches"] >= 1
    # every launch but the work it hides: each program here is far shorter than a launch
    assert e["launches"] * launch - e["seconds"] <= e["launch_seconds"] <= e["launches"] * launch
    assert e["launch_seconds"] > e["seconds"]
