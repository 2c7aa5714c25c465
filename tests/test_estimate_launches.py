"""The launch half of an estimate (accelkit.sdk.LaunchLedger): the rule on synthetic runs, the
same for every backend, and the fields an Estimate carries."""

from __future__ import annotations

import random

import pytest

from accelkit.sdk import DeviceModel, Estimate, LaunchLedger, TargetComparison

LAUNCH = 100e-6


def run(segments: list[list[float]], launch: float = LAUNCH) -> dict:
    """Each segment's programs (device seconds each), a host wait after each segment."""
    ledger = LaunchLedger(launch)
    for programs in segments:
        for device in programs:
            ledger.launch(device)
        ledger.wait()
    return ledger.fields()


def test_a_program_waited_on_alone_costs_its_device_time_plus_one_launch():
    for device in (LAUNCH / 10, LAUNCH * 10):  # smaller and larger than a launch
        assert run([[device]])["launch_seconds"] == pytest.approx(LAUNCH)


def test_small_programs_in_a_row_are_launch_bound():
    device, n = LAUNCH / 50, 40
    fields = run([[device] * n])
    # The device idles while each launch is issued: n launches, less the device work they hide
    # (all but the last program's, which runs after the last launch).
    assert fields["launch_seconds"] == pytest.approx(n * LAUNCH - (n - 1) * device)
    assert fields["launch_seconds"] > 0.9 * n * LAUNCH
    assert fields["launches"] == n and fields["syncs"] == 1


def test_large_programs_in_a_row_hide_every_launch_but_the_first():
    fields = run([[LAUNCH * 3] * 10])
    assert fields["launch_seconds"] == pytest.approx(LAUNCH)


def test_every_host_wait_exposes_the_next_first_launch_again():
    one = run([[LAUNCH * 3] * 10])["launch_seconds"]
    split = run([[LAUNCH * 3] * 5, [LAUNCH * 3] * 5])
    assert split["launch_seconds"] == pytest.approx(2 * one) and split["syncs"] == 2


def test_a_wait_with_nothing_launched_costs_nothing_and_is_not_counted():
    ledger = LaunchLedger(LAUNCH)
    ledger.wait()
    ledger.launch(1e-6)
    ledger.wait()
    ledger.wait()
    assert ledger.fields()["syncs"] == 1


def test_launches_not_yet_waited_for_count_as_if_waited_for_now():
    ledger = LaunchLedger(LAUNCH)
    ledger.launch(1e-6)
    assert ledger.fields()["launch_seconds"] == pytest.approx(LAUNCH)
    assert ledger.fields()["syncs"] == 0


def test_reset_forgets_everything_but_the_launch_cost():
    ledger = LaunchLedger(LAUNCH)
    ledger.launch(1e-6)
    ledger.wait()
    ledger.reset()
    assert ledger.fields() == {"launch_seconds": 0.0, "launches": 0, "syncs": 0}
    ledger.launch(1e-6)
    assert ledger.fields()["launch_seconds"] == pytest.approx(LAUNCH)


@pytest.mark.parametrize("seed", range(3))
def test_launches_given_in_batches_add_up_exactly_as_one_by_one(seed):
    rng = random.Random(seed)
    one_by_one, batched = LaunchLedger(LAUNCH), LaunchLedger(LAUNCH)
    models = [DeviceModel(name=n, vendor="v", memory_bytes=1, launch_seconds=LAUNCH * k) for n, k in (("a", 1), ("b", 3))]
    compared_one_by_one, compared_batched = TargetComparison(models), TargetComparison(models)
    for _ in range(30):
        programs = [rng.choice([LAUNCH / 50, LAUNCH / 3, LAUNCH * 2, 0.0]) for _ in range(rng.randrange(0, 20))]
        for device in programs:
            one_by_one.launch(device)
            compared_one_by_one.launch((device, device / 2))
        batched.launch_all(programs)
        compared_batched.launch_all([(device, device / 2) for device in programs])
        if rng.random() < 0.7:
            for ledger in (one_by_one, batched, compared_one_by_one, compared_batched):
                ledger.wait()
        assert batched.fields() == one_by_one.fields()  # the same arithmetic, to the last bit
        assert compared_batched.by_target() == compared_one_by_one.by_target()
    assert one_by_one.fields()["launches"] > 100


def test_no_launch_cost_counts_launches_and_charges_nothing():
    fields = run([[1e-6] * 3], launch=0.0)
    assert fields == {"launch_seconds": 0.0, "launches": 3, "syncs": 1}


def test_the_estimate_carries_device_plus_launch_as_its_total():
    fields = run([[5e-6] * 4])
    estimate = Estimate(target="t", note="n", seconds=20e-6, **fields)
    as_dict = estimate.as_dict()
    assert as_dict["total_seconds"] == pytest.approx(20e-6 + fields["launch_seconds"])
    assert {k: as_dict[k] for k in fields} == fields
    with pytest.raises(ValueError):
        Estimate(target="t", note="n", seconds=0.0, launch_seconds=-1.0)


def test_a_device_model_rejects_a_negative_launch_cost():
    with pytest.raises(ValueError):
        DeviceModel(name="x", vendor="y", memory_bytes=1, launch_seconds=-1e-6)
    with pytest.raises(ValueError):
        LaunchLedger(-1e-6)
