"""Ray Train as a launcher of accelkit devices: Ray's own ``TorchTrainer`` on a local Ray cluster
(2 workers), with the two additions a Ray user makes (``ACCELKIT_DEVICE`` in the workers' runtime
environment, ``TorchConfig(backend=<device>)``), against the same trainings under torchrun's
environment (:func:`accelkit.sdk.testing.distributed.run_ranks`) and in one process.

Each worker reports through ``ray.train.report`` what
:func:`accelkit.sdk.testing.distributed_cases.train` returns (its losses and the trained
parameters), which torchrun's ranks carry in their findings under ``trained``: rank for rank,
the two launchers' numbers must agree to float32 rounding. The workers run
``tests/ray_train_run.py``'s training function, which is also the script ``accelkit run`` runs
for the workers' reports. The cluster is started once for the module, on loopback.

CI runs DDP on tpu; ``make launchers`` (``ACCELKIT_LAUNCHERS=full``) runs FSDP2, neuron and the
workers' reports under ``accelkit run`` too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Train is not installed (the `ray` extra: pip install -e '.[ray]')", allow_module_level=True)

import ray_train_run  # noqa: E402 - sets Ray's environment (loopback, no usage reports) before Ray loads
import ray  # noqa: E402, I001
import torch  # noqa: E402

from accelkit.sdk.testing.distributed import run_ranks  # noqa: E402
from accelkit.sdk.testing.distributed_cases import single_process_training  # noqa: E402

FULL = os.environ.get("ACCELKIT_LAUNCHERS") == "full"
DEVICES = [pytest.param("tpu"), pytest.param("neuron", marks=pytest.mark.skipif(
    not FULL, reason="neuron under Ray Train runs under `make launchers` (ACCELKIT_LAUNCHERS=full)"))]
RUN = Path(ray_train_run.__file__)

#: The same program on the same device under two launchers: equal up to float32 rounding (a
#: few units in the last place; measured: bit for bit).
FLOAT32_ROUNDING = {"rtol": 1e-6, "atol": 1e-7}
#: Ranks on slices of the batch against one process on the whole batch (reductions in another
#: order): scenario ``ddp``'s own tolerance.
ONE_PROCESS = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> dict[str, str]:
    """The environment that shares tpu's compiled programs between the module's processes: the
    second launcher's ranks load the first's programs instead of compiling them again (the same
    programs, so the same numbers; measured once on 2 busy cores, torchrun's half of the tpu
    FSDP2 test took 21 s instead of 34)."""
    return {"ACCELKIT_COMPILE_CACHE": str(tmp_path_factory.mktemp("compile-cache"))}


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for the module's trainers; the workers unpickle the training function
    from ``ray_train_run``'s source (they cannot import this directory's modules)."""
    ray.init(num_cpus=4, include_dashboard=False)
    ray.cloudpickle.register_pickle_by_value(ray_train_run)
    try:
        yield
    finally:
        ray.cloudpickle.unregister_pickle_by_value(ray_train_run)
        ray.shutdown()


def _fit(device: str, training: str, storage: Path, cache: dict[str, str]) -> list[dict]:
    """Ray Train's run, ``ACCELKIT_DEVICE`` (and the compile cache) in the workers' runtime
    environment; ``fit`` passes ``TorchConfig(backend=device)``."""
    return ray_train_run.fit(device, training, storage, worker_env={"ACCELKIT_DEVICE": device, **cache})


def _close(got: list[float], want: list[float], tolerance: dict[str, float], what: str) -> None:
    got_t, want_t = torch.tensor(got), torch.tensor(want)
    assert got_t.shape == want_t.shape, (what, got_t.shape, want_t.shape)
    difference = float((got_t - want_t).abs().max())
    assert torch.allclose(got_t, want_t, **tolerance), f"{what}: largest difference {difference}"


def _torchrun(device: str, training: str, cache: dict[str, str], **kwargs) -> list[dict]:
    """The training under torchrun's environment: every rank's findings."""
    ranks = run_ranks(device, training, world_size=ray_train_run.WORKERS, env=cache, **kwargs)
    for rank in ranks:
        assert rank.returncode == 0 and "scenario_error" not in rank.findings, (
            rank.findings.get("scenario_error") or rank.describe())
    return [rank.findings for rank in ranks]


def _check_workers(workers: list[dict], device: str) -> None:
    assert [w["rank"] for w in workers] == [0, 1] and {w["world"] for w in workers} == {2}
    assert [w["device"] for w in workers] == [f"{device}:0"] * 2
    assert len({w["pid"] for w in workers}) == 2 and os.getpid() not in {w["pid"] for w in workers}
    # The group's agreement checks ran over its own connections, opened at the address that
    # routes to the MASTER_ADDR Ray set (the cluster's node address), not through gloo.
    assert {w["master_addr"] for w in workers} == {"127.0.0.1"}
    assert [set(w["agreement_checks"]) for w in workers] == [{"sockets"}] * 2, workers[0]["agreement_checks"]
    # Ray points accelerate at its own idea of the device (docs/distributed.md says so).
    assert {w["accelerate_device"] for w in workers} == {"cpu"}


def _same_as_torchrun(workers: list[dict], torchrun: list[dict]) -> None:
    for worker, rank in zip(workers, torchrun, strict=True):
        trained = rank["trained"]
        _close(worker["losses"], trained["losses"], FLOAT32_ROUNDING, f"rank {worker['rank']} losses")
        _close(worker["parameters"], trained["parameters"], FLOAT32_ROUNDING, f"rank {worker['rank']} parameters")


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_under_ray_train_equals_torchrun_and_one_process(ray_cluster, compile_cache, tmp_path, device):
    workers = _fit(device, "ddp", tmp_path, compile_cache)
    _check_workers(workers, device)
    _same_as_torchrun(workers, _torchrun(device, "ddp", compile_cache))

    one = single_process_training()
    # Each worker's loss is on its half of the batch; their mean is the whole batch's loss.
    assert workers[0]["losses"] != workers[1]["losses"]
    mean = [sum(pair) / 2 for pair in zip(workers[0]["losses"], workers[1]["losses"])]
    _close(mean, one["losses"], ONE_PROCESS, "mean of the workers' losses")
    for worker in workers:
        _close(worker["parameters"], one["parameters"], ONE_PROCESS, f"rank {worker['rank']} parameters")


@pytest.mark.skipif(not FULL, reason="runs under `make launchers` (ACCELKIT_LAUNCHERS=full): CI's budget")
@pytest.mark.parametrize("device", ["tpu", "neuron"])
def test_fsdp2_meta_init_under_ray_train_equals_torchrun(ray_cluster, compile_cache, tmp_path, device):
    workers = _fit(device, "fsdp2_meta_init", tmp_path, compile_cache)
    _check_workers(workers, device)
    torchrun = _torchrun(device, "fsdp2_meta_init", compile_cache, deadline=420)
    _same_as_torchrun(workers, torchrun)
    # ... and torchrun's run is the whole model's: initialised as the unsharded model, trained
    # as one rank on the whole batch (to bfloat16's resolution; tests/test_distributed.py).
    for rank in torchrun:
        assert rank["init_equal"] and rank["max_loss_difference"] < 1e-3, rank
    assert workers[0]["parameters"] == workers[1]["parameters"]  # the full parameters, gathered


@pytest.mark.skipif(not FULL, reason="the workers' reports run under `make launchers` (ACCELKIT_LAUNCHERS=full): "
                                     "a cluster of its own costs CI a minute")
@pytest.mark.parametrize("device", ["tpu", "neuron"])
def test_accelkit_run_reports_each_ray_worker(compile_cache, tmp_path, device):
    """``accelkit run --device DEVICE --report DIR ray_train_run.py``: the script starts its own
    local cluster (``ray.init`` with the device in the job's runtime environment), whose workers
    inherit the run's environment; each worker writes its report when Ray destroys its process
    group, before Ray kills it."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELKIT_", "ACCELERATE_", "RAY_ADDRESS"))}
    env.update(compile_cache)
    result = subprocess.run(
        [sys.executable, "-m", "accelkit", "run", "--device", device, "--report", str(out),
         str(RUN), device, "ddp", str(tmp_path / "ray")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    workers = json.loads(result.stdout.strip().splitlines()[-1])
    _check_workers(workers, device)

    launcher = json.loads((out / "report.json").read_text())
    assert launcher["ops"]["executions"] == 0  # the driver only launched the trainer
    reports = {r["pid"]: r for r in (json.loads(p.read_text()) for p in out.glob("report-pid*.json"))}
    assert set(reports) == {w["pid"] for w in workers}, sorted(reports)  # one per worker, no other
    for worker in workers:
        report = reports[worker["pid"]]
        assert report["command"] == ["ray::RayTrainWorker"]
        assert (report["rank"], report["world_size"]) == (worker["rank"], 2)
        assert report["device"]["device"] == f"{device}:0"
        assert report["ops"]["executions"] > 0 and report["ops"]["totals"]["fallback"] == 0
        assert report["collectives"]["by_kind"]["all_reduce"]["calls"] >= 4  # DDP's gradient buckets
        headline = [line for line in result.stderr.splitlines()
                    if line.startswith(f"accelkit run: process {worker['pid']} of the run, ")]
        assert len(headline) == 1, result.stderr[-4000:]
        assert f"ray::RayTrainWorker on {device}:0 " in headline[0] and f"[rank {worker['rank']} of 2]" in headline[0]
