"""The scaling projection (accelkit.project_scaling): its equations on the targets' interconnects
(docs/estimates.md, "At scale"), from a fixed single-device estimate."""

from __future__ import annotations

import pytest
import torch

from accelkit import ScalingPlan, project_scaling
from accelkit_backends.neuron.device import device_model as neuron_model
from accelkit_backends.tpu.device import device_model as tpu_model

V5E = tpu_model("v5e")
TRN1 = neuron_model("trn1")
#: One layer's step on one device: 10 ms of device time, 1 TFLOP.
RUN = {"target": "v5e", "seconds": 10e-3, "flops": 1e12, "launch_seconds": 1.0}
GB = 1e9


def _ring_all_reduce(nbytes: float, n: int, bandwidth: float) -> float:
    return 2 * (n - 1) / n * nbytes / bandwidth


def test_one_chip_is_the_run_repeated_and_mfu_its_flops_over_peak():
    plan = ScalingPlan(layers=32, batches=4)
    p = project_scaling(RUN, plan, parameter_bytes=1 * GB, device_model=V5E)
    assert p.chips == 1
    assert p.step_seconds == pytest.approx(32 * 4 * 10e-3)  # launch time left out
    assert p.mfu == pytest.approx(1e12 / (10e-3 * V5E.peak_flops[torch.bfloat16]))
    assert p.seconds["exposed"] == 0


def test_data_parallel_gradients_are_a_ring_all_reduce_hidden_under_compute_when_overlapped():
    small = project_scaling(RUN, ScalingPlan(data=8), parameter_bytes=0.1 * GB, device_model=V5E)
    expected = _ring_all_reduce(0.1 * GB, 8, V5E.interconnect.bandwidth)
    assert small.seconds["data"] == pytest.approx(expected)
    assert small.step_seconds == pytest.approx(10e-3)  # the all-reduce is shorter than compute
    big = project_scaling(RUN, ScalingPlan(data=8), parameter_bytes=10 * GB, device_model=V5E)
    assert big.seconds["data"] > 10e-3  # now the all-reduce is the longer
    assert big.step_seconds == pytest.approx(big.seconds["data"])
    serial = project_scaling(RUN, ScalingPlan(data=8, overlap=False), parameter_bytes=0.1 * GB, device_model=V5E)
    assert serial.step_seconds == pytest.approx(10e-3 + expected)


def test_fsdp_gathers_parameters_twice_and_reduce_scatters_gradients():
    p = project_scaling(RUN, ScalingPlan(fsdp=16, overlap=False), parameter_bytes=1 * GB, device_model=V5E)
    one_pass = 15 / 16 * 1 * GB / V5E.interconnect.bandwidth
    assert p.seconds["fsdp"] == pytest.approx(3 * one_pass)
    assert p.seconds["data"] == 0


def test_tensor_parallel_all_reduces_block_compute_four_per_layer_and_batch():
    plan = ScalingPlan(tensor=4, layers=2, batches=3)
    p = project_scaling(RUN, plan, parameter_bytes=1e6, activation_bytes=64e6, device_model=V5E)
    per = _ring_all_reduce(64e6, 4, V5E.interconnect.bandwidth)
    assert p.seconds["tensor"] == pytest.approx(4 * 2 * 3 * per)
    assert p.step_seconds == pytest.approx(2 * 3 * 10e-3 + p.seconds["tensor"])  # not overlapped
    with pytest.raises(ValueError, match="activation_bytes"):
        project_scaling(RUN, ScalingPlan(tensor=4), parameter_bytes=1e6, device_model=V5E)


def test_recompute_adds_the_forward_and_the_pipeline_its_1f1b_bubble():
    base = project_scaling(RUN, ScalingPlan(), parameter_bytes=1e6, device_model=V5E)
    remat = project_scaling(RUN, ScalingPlan(recompute=1.0), parameter_bytes=1e6, forward_seconds=3e-3,
                            device_model=V5E)
    assert remat.step_seconds == pytest.approx(base.step_seconds + 3e-3)
    assert remat.mfu < base.mfu  # the same model FLOPs in more time
    piped = project_scaling(RUN, ScalingPlan(pipeline=4, microbatches=12), parameter_bytes=1e6, device_model=V5E)
    assert piped.step_seconds == pytest.approx(10e-3 * (1 + 3 / 12))


def test_a_group_beyond_a_trainium_instance_crosses_efa():
    run = {**RUN, "target": "trn1"}
    cores = TRN1.extra["cores_per_chip"] * TRN1.interconnect.domain_chips  # 32 NeuronCores
    inside = project_scaling(run, ScalingPlan(data=cores, overlap=False), parameter_bytes=1 * GB, device_model=TRN1)
    # a core's share of its chip's NeuronLink
    assert inside.seconds["data"] == pytest.approx(
        _ring_all_reduce(1 * GB, cores, TRN1.interconnect.bandwidth / TRN1.extra["cores_per_chip"]))
    across = project_scaling(run, ScalingPlan(data=2 * cores, overlap=False), parameter_bytes=1 * GB,
                             device_model=TRN1)
    efa = TRN1.interconnect.scale_out.bandwidth / TRN1.extra["cores_per_chip"]
    assert across.seconds["data"] == pytest.approx(inside.seconds["data"] + _ring_all_reduce(1 * GB / cores, 2, efa))
    assert across.seconds["data"] > inside.seconds["data"]  # crossing instances costs more, though hierarchically


def test_a_tpu_group_past_one_pod_is_refused_as_dcn_is_not_modelled():
    with pytest.raises(ValueError, match="no scale-out"):
        project_scaling(RUN, ScalingPlan(data=512), parameter_bytes=1e6, device_model=V5E)


def test_the_plan_parses_the_cli_form_and_refuses_nonsense():
    plan = ScalingPlan.parse("dp=4,fsdp=8,tp=2,layers=32,recompute=1,overlap=0")
    assert (plan.data, plan.fsdp, plan.tensor, plan.chips, plan.layers, plan.overlap) == (4, 8, 2, 64, 32, False)
    with pytest.raises(ValueError, match="unknown plan field"):
        ScalingPlan.parse("dq=4")
    with pytest.raises(ValueError, match="must divide"):
        ScalingPlan(data=3, expert=2)
    with pytest.raises(ValueError, match="for 'v5e'"):
        project_scaling(RUN, ScalingPlan(), parameter_bytes=1, device_model=TRN1)


def test_expert_parallel_all_to_alls_block_compute_and_need_their_bytes():
    p = project_scaling(RUN, ScalingPlan(data=8, expert=8), parameter_bytes=1e6, expert_bytes=32e6,
                        device_model=V5E)
    assert p.seconds["expert"] == pytest.approx(4 * 7 / 8 * 32e6 / V5E.interconnect.bandwidth)
    assert p.step_seconds == pytest.approx(10e-3 + p.seconds["expert"])
    with pytest.raises(ValueError, match="expert_bytes"):
        project_scaling(RUN, ScalingPlan(data=8, expert=8), parameter_bytes=1e6, device_model=V5E)


def test_a_target_without_interconnect_projects_one_device_and_refuses_more():
    import dataclasses

    lone = dataclasses.replace(V5E, interconnect=None)
    assert project_scaling(RUN, ScalingPlan(layers=2), parameter_bytes=1e6, device_model=lone).step_seconds == \
        pytest.approx(20e-3)
    with pytest.raises(ValueError, match="no interconnect"):
        project_scaling(RUN, ScalingPlan(data=2), parameter_bytes=1e6, device_model=lone)
