"""torch.distributed on accelkit devices: real processes on 127.0.0.1, real gloo underneath.

Each test starts fresh ranks (``accelkit.sdk.testing.distributed.run_ranks``) that compare,
per rank, against an independent reference in the same process: gloo on CPU tensors for every
collective, a single-process full-batch CPU run for training. A rank that hangs is killed at the
deadline and fails the test.

The DDP example under torchrun runs in strict mode in CI; ``make launchers``
(``ACCELKIT_LAUNCHERS=full``) runs it in fused mode too (fused DDP itself runs in CI, under
``run_ranks``: ``test_ddp_in_fused_mode_matches_one_process``).
"""

from __future__ import annotations

import os

import pytest

from accelkit.sdk.testing.distributed import run_ranks

DEVICES = ["tpu", "neuron"]
LAUNCHERS_FULL = os.environ.get("ACCELKIT_LAUNCHERS") == "full"


def _findings(device: str, scenario: str, **kwargs):
    ranks = run_ranks(device, scenario, **kwargs)
    for rank in ranks:
        assert "scenario_error" not in rank.findings, rank.findings.get("scenario_error")
    return ranks


def _ok(ranks) -> None:
    for rank in ranks:
        assert rank.returncode == 0, rank.describe()


def test_every_collective_matches_gloo_on_cpu():
    # neuron and ref run the same scenario in the conformance suite's distributed tests.
    ranks = _findings("tpu", "collectives")
    _ok(ranks)
    for rank in ranks:
        stats = rank.findings.pop("stats")
        failed = {name: outcome for name, outcome in rank.findings.items() if outcome != "ok"}
        assert not failed, f"rank {rank.rank}: {failed}"
        assert len(rank.findings) >= 25
        assert "host-staged" in stats["transport"]
        # XLA's CPU platform lends tpu memory: in-place collectives skip the staging copies.
        assert stats["device_tensors"]["lent"] >= 10, stats["device_tensors"]
        assert stats["device_tensors"]["copied"] > 0, stats["device_tensors"]
        all_reduce = stats["collectives"]["all_reduce"]
        assert all_reduce["calls"] >= 10 and all_reduce["bytes"] > 0
        assert all_reduce["estimated_seconds"] > 0
        assert stats["interconnect"]["name"] == "ICI"
        assert set(stats["agreement_checks"]) == {"sockets"}, stats["agreement_checks"]


def test_a_group_bound_to_the_device_with_device_id():
    ranks = _findings("tpu", "ddp", env={"ACCELKIT_TEST_DEVICE_ID": "1"})
    _ok(ranks)
    assert all(r.findings["parameters_close"] for r in ranks)


def test_ddp_in_fused_mode_matches_one_process():
    ranks = _findings("tpu", "ddp", env={"ACCELKIT_TPU_MODE": "fused"})
    _ok(ranks)
    assert all(r.findings["parameters_close"] for r in ranks)


@pytest.mark.parametrize("mode", ["strict", pytest.param("fused", marks=pytest.mark.skipif(
    not LAUNCHERS_FULL, reason="runs under `make launchers` (ACCELKIT_LAUNCHERS=full): CI's budget"))])
def test_the_ddp_example_under_torchrun_matches_one_process(tmp_path, mode):
    import subprocess
    import sys
    from pathlib import Path

    from accelkit.sdk.testing.distributed import free_port

    example = Path(__file__).parents[1] / "examples" / "train_ddp.py"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port()), str(example)]
    env = {**os.environ, "ACCELKIT_DEVICE": "tpu", "ACCELKIT_TPU_MODE": mode}
    done = subprocess.run(torchrun, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line[:4].strip().isdigit()]
    assert len(rows) == 8
    for _step, ddp, single in rows:
        assert abs(float(ddp) - float(single)) < 1e-5
    assert "2 ranks on tpu" in done.stdout and "estimated" in done.stdout


@pytest.mark.parametrize("checks", ["on", "gloo"])  # fingerprints over the group's sockets, or through gloo
def test_mismatched_arguments_raise_on_every_rank_and_leave_the_group_usable(checks):
    ranks = _findings("tpu", "mismatch", env={"ACCELKIT_COLLECTIVE_CHECKS": checks})
    _ok(ranks)
    for rank in ranks:
        f = rank.findings
        for case in ("sizes", "dtypes", "collectives", "roots", "all_gather_output", "all_to_all_splits"):
            assert f[case]["raised"] == "CollectiveMismatchError", (rank.rank, case, f[case])
        assert "rank 0: all_reduce(SUM) float32[4]" in f["sizes"]["message"]
        assert "rank 1: all_reduce(SUM) float32[6]" in f["sizes"]["message"]
        assert "rank 1: broadcast(src=0)" in f["collectives"]["message"]
        assert "output list has 3 tensors" in f["all_gather_output"]["message"]
        assert "rank 0 sends 2 elements to rank 1, which expects 1" in f["all_to_all_splits"]["message"]
        assert f["received_unchanged"] is True
        assert f["usable_after"] is True
        assert set(f["agreement_checks"]) == {"sockets" if checks == "on" else "gloo"}
    receiver = ranks[1].findings["send_recv_sizes"]
    assert receiver["raised"] == "CollectiveMismatchError"
    assert "rank 0 sent 3 elements of float32" in receiver["message"] and "float32[5]" in receiver["message"]


def test_a_dead_rank_is_an_error_not_a_hang():
    ranks = run_ranks("tpu", "dead_rank", deadline=120, env={"ACCELKIT_TEST_TIMEOUT": "20"})
    survivor, dead = ranks
    assert dead.returncode == 17
    outcome = survivor.findings["all_reduce"]
    assert outcome["raised"] == "CollectiveError"
    assert "peer process exited" in outcome["message"] and "all_reduce" in outcome["message"]
    assert "rank 1's process exited" in outcome["message"]  # the dead rank, by number
    assert outcome["seconds"] < 20


def test_a_rank_that_never_comes_times_out_within_the_group_timeout():
    ranks = run_ranks("tpu", "timeout", deadline=120, env={"ACCELKIT_TEST_TIMEOUT": "3"})
    outcome = ranks[0].findings["all_reduce"]
    assert outcome["raised"] == "CollectiveError"
    assert "timeout" in outcome["message"] and "3 s" in outcome["message"]
    assert "rank 1 did not take part" in outcome["message"]  # the missing rank, by number
    assert 2.5 < outcome["seconds"] < 3 + 5


def test_ddp_matches_single_process_full_batch_training():
    ranks = _findings("neuron", "ddp")
    _ok(ranks)
    for rank in ranks:
        f = rank.findings
        assert f["losses_close"] and f["parameters_close"], f
        assert f["all_reduce_calls"] >= 4  # several gradient buckets per step


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_fsdp2_matches_single_process_training(precision):
    ranks = _findings("tpu", "fsdp2", env={"ACCELKIT_TEST_PRECISION": precision})
    _ok(ranks)
    for rank in ranks:
        f = rank.findings
        assert f["shard_shape"] == [8, 8] and f["shard_device"] == "tpu:0"
        assert f["losses_close"] and f["parameters_close"], f


#: Parameters and losses of FSDP2 in bfloat16 against the one-process reference in bfloat16
#: (see ``_fsdp2_mixed``). The ranks' bfloat16 gradients are each over a slice of the batch,
#: rounded to bfloat16 before the float32 reduction, where the reference's gradient is over the
#: whole batch, rounded once: each gradient element may differ by 2^-8 of itself. Over 4 SGD
#: steps at lr 0.1 with gradients up to ~0.2 that bounds the parameters' drift near
#: 4 x 0.1 x 2^-8 x 0.2 = 3e-4 (measured: 1.8e-4 on 2 ranks, 1.5e-4 on 4, the same on ref, tpu and
#: neuron); 1e-3 leaves room for a device's own bfloat16 kernels and is 1/60 of the parameters'
#: change over the run (0.067): a factor applied wrongly moves them by 0.01 to 0.14.
FSDP2_BF16_TOLERANCE = 1e-3


@pytest.mark.parametrize("device,world,mesh", [("ref", 4, "2x2"), ("tpu", 2, "1x2"), ("neuron", 2, "1x2")])
def test_premul_sum_and_avg_run_as_nccls_and_fsdp2_trains_with_them(device, world, mesh):
    """PREMUL_SUM and AVG through every reducing collective against the same sums by hand in gloo
    on the CPU, their refusals, then FSDP2 in bfloat16 with float32 reductions: with a gradient
    divide factor (PREMUL_SUM) over every rank, and HSDP (AVG in both reduce-scatter and
    all-reduce) on a 2-D mesh. One launch per device (a launch costs the ranks' startup); ref
    takes 4 ranks, so its HSDP mesh has 2 replicas of 2 shards."""
    from accelkit.sdk.testing.distributed_cases import reduction_cases

    ranks = run_ranks(device, "reductions+fsdp2_mixed", world_size=world, env={"ACCELKIT_TEST_MESH": mesh})
    _ok(ranks)
    for rank in ranks:
        assert "scenario_error" not in rank.findings, rank.findings.get("scenario_error")
        found = rank.findings["reductions"]
        cases = {name: found.pop(name) for name in reduction_cases(world)}
        failed = {name: outcome for name, outcome in cases.items() if outcome != "ok"}
        assert not failed, f"rank {rank.rank}: {failed}"
        for case, dtype in (("refused.all_reduce.PREMUL_SUM.int32", "int32"),
                            ("refused.reduce_scatter_tensor.PREMUL_SUM.int64", "int64")):
            assert found[case]["raised"] == "TypeError", found[case]
            assert f"ReduceOp.PREMUL_SUM on {dtype} data" in found[case]["message"]
            assert "float16, bfloat16, float32, float64" in found[case]["message"]
        assert found["refused.all_reduce.AVG.bool"]["raised"] == "TypeError"
        assert "ReduceOp.AVG on bool data" in found["refused.all_reduce.AVG.bool"]["message"]
        mismatch = found["op_mismatch"]
        assert mismatch["raised"] == "CollectiveMismatchError", mismatch
        assert "rank 0: all_reduce(SUM)" in mismatch["message"]
        assert "rank 1: all_reduce(PREMUL_SUM(0.5))" in mismatch["message"]
        assert found["usable_after"] is True and found["version_unchanged"] is True

        fsdp, hsdp = rank.findings["fsdp2_mixed"]["fsdp"], rank.findings["fsdp2_mixed"]["hsdp"]
        assert fsdp["mesh"] == [world] and hsdp["mesh"] == [int(n) for n in mesh.split("x")]
        assert fsdp["reduce_ops"] == {"reduce_scatter": ["PREMUL_SUM"], "all_reduce": []}
        assert hsdp["reduce_ops"] == {"reduce_scatter": ["AVG"], "all_reduce": ["AVG"]}
        for run in (fsdp, hsdp):
            assert run["max_parameter_change"] > 30 * FSDP2_BF16_TOLERANCE
            assert run["max_parameter_difference"] < FSDP2_BF16_TOLERANCE, run
            assert run["max_loss_difference"] < FSDP2_BF16_TOLERANCE, run


def _local_devices(device: str) -> dict[str, str]:
    """Two devices per process, and each rank on the one of its local rank (CUDA's pattern:
    ``torch.device(name, local_rank)`` and ``set_device``)."""
    return {"ACCELKIT_TEST_LOCAL_DEVICE": "1", f"ACCELKIT_{device.upper()}_DEVICES": "2"}


def test_fsdp2_on_neuron_with_each_rank_on_its_local_device():
    ranks = _findings("neuron", "fsdp2", env=_local_devices("neuron"))
    _ok(ranks)
    for rank in ranks:
        assert rank.findings["parameters_close"] and rank.findings["losses_close"], rank.findings
        assert rank.findings["shard_device"] == f"neuron:{rank.rank}"


def test_every_collective_on_the_local_rank_device_of_a_two_device_process():
    ranks = _findings("tpu", "collectives", env=_local_devices("tpu"))
    _ok(ranks)
    for rank in ranks:
        assert rank.findings.pop("stats")["device"] == f"tpu:{rank.rank}"
        failed = {case: outcome for case, outcome in rank.findings.items() if outcome != "ok"}
        assert not failed, failed
        assert len(rank.findings) >= 25


@pytest.mark.parametrize("device", DEVICES)
def test_dtensor_sharding_redistribution_and_tensor_parallel_linear(device):
    ranks = _findings(device, "dtensor")
    _ok(ranks)
    for rank in ranks:
        f = rank.findings
        assert f["mesh_device_type"] == device and f["mesh_backend"] == device
        assert f["local_device"] == f"{device}:0"
        assert f["local_shape"] == [4, 3] and f["tp_local_weight_shape"] == [8, 6]
        for check in ("shard_is_rows", "redistribute_replicate", "reshard_columns", "sum", "tp_output_close",
                      "tp_grad_close", "tp_attention_close", "tp_attention_grad_close"):
            assert f[check] is True, (rank.rank, check)
        assert f["tp_attention_placements"] == "(Shard(dim=1),)"


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """``saved_checkpoint(device)``: the checkpoint scenario's two ranks on ``device`` (train, save
    with DCP, load back), run once per device for this module: (their results, the directory)."""
    runs = {}

    def run(device: str):
        if device not in runs:
            directory = str(tmp_path_factory.mktemp(f"checkpoint-{device}") / "checkpoint")
            runs[device] = _findings(device, "checkpoint", args=(directory,)), directory
        return runs[device]

    return run


def test_sharded_checkpoint_round_trip(saved_checkpoint):
    ranks, _ = saved_checkpoint("tpu")
    _ok(ranks)
    for rank in ranks:
        f = rank.findings
        assert f["fresh_differs"] and f["round_trip_equal"]
        assert f["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert f["local_device"] == "tpu:0"


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_saved_by_two_ranks_loads_into_one_and_into_three(saved_checkpoint, device):
    saved, directory = saved_checkpoint(device)
    _ok(saved)
    for world in (1, 3):  # 3 ranks: uneven shards of the 16-row weight
        ranks = _findings(device, "checkpoint_reshard", world_size=world, args=(directory,))
        _ok(ranks)
        for rank in ranks:
            assert rank.findings["world"] == world
            assert rank.findings["fresh_differs"] and rank.findings["resharded_equal"], rank.findings


def test_estimates_follow_the_ring_algorithms_on_the_device_models_interconnect():
    from accelkit._runtime.distributed.stats import estimate_seconds
    from accelkit.sdk import Interconnect

    link = Interconnect(name="test", bandwidth=100e9)
    mib = 1 << 20
    assert estimate_seconds("all_reduce", 64 * mib, 4, link) == pytest.approx(2 * 3 / 4 * 64 * mib / 100e9)
    assert estimate_seconds("all_gather", 64 * mib, 4, link) == pytest.approx(3 / 4 * 64 * mib / 100e9)
    assert estimate_seconds("broadcast", mib, 2, link) == pytest.approx(mib / 100e9)
    assert estimate_seconds("all_reduce", mib, 1, link) == 0.0
    assert estimate_seconds("all_reduce", mib, 2, None) is None
    slow = Interconnect(name="test", bandwidth=100e9, latency=1e-6)
    assert estimate_seconds("all_reduce", 0, 4, slow) == pytest.approx(6e-6)


def test_the_device_models_carry_their_interconnect_with_sources():
    from accelkit_backends.neuron.device import device_model as neuron_model
    from accelkit_backends.tpu.device import device_model as tpu_model

    v5e = tpu_model("v5e").interconnect
    assert v5e.name == "ICI" and v5e.bandwidth == 200e9 and "G-v5e" in v5e.sources["bandwidth"]
    trn2 = neuron_model("trn2").interconnect
    assert trn2.name == "NeuronLink-v3" and trn2.bandwidth == 640e9 and "N-trn2" in trn2.sources["bandwidth"]
    # beyond a domain (a TPU slice; a 16-chip Trainium instance), for the scaling projection
    assert v5e.domain_chips == 256 and v5e.scale_out is None and "DCN" in v5e.sources["scale_out"]
    assert trn2.domain_chips == 16 and trn2.scale_out.name == "EFA"
    assert trn2.scale_out.bandwidth == pytest.approx(3200e9 / 8 / 16) and "trn2-arch" in trn2.sources["scale_out"]


@pytest.mark.parametrize("device", DEVICES)
def test_sharded_random_ops_equal_the_op_on_the_whole_tensor(device):
    ranks = _findings(device, "sharded_random")
    _ok(ranks)
    for rank in ranks:
        f = rank.findings
        assert f["compared"] == 18 and f["different"] == [], f
        assert f["state_bytes"] == 16  # CUDA's Philox layout: seed and offset


def test_sharded_random_ops_on_a_two_dimensional_mesh_equal_the_whole_tensor():
    ranks = _findings("tpu", "sharded_random", world_size=4, deadline=420)
    _ok(ranks)
    for rank in ranks:
        assert rank.findings["compared"] == 42 and rank.findings["different"] == [], rank.findings


@pytest.mark.parametrize("device", DEVICES)
def test_fsdp2_meta_init_with_mixed_precision_equals_whole_init_and_one_rank(device):
    ranks = _findings(device, "fsdp2_meta_init", deadline=420)
    _ok(ranks)
    for rank in ranks:
        f = rank.findings
        assert f["init_equal"] and f["local_shape"] == [12, 8], f
        # bfloat16 compute: each rank's half-batch backward rounds differently from the one
        # rank's full-batch backward before the float32 reduction (bf16 resolution, 2**-8).
        assert f["max_loss_difference"] < 1e-3 and f["max_parameter_difference"] < 2e-3, f
