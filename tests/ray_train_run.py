"""Train on an accelkit device with Ray Train's ``TorchTrainer``, as a Ray user does: the two
additions are ``ACCELKIT_DEVICE`` in the workers' runtime environment and
``TorchConfig(backend=<device>)``; everything else is Ray's.

``python ray_train_run.py DEVICE TRAINING STORAGE`` starts a local Ray cluster, runs the training
``TRAINING`` of :func:`accelkit.sdk.testing.distributed_cases.train` on 2 workers of ``DEVICE``
and prints one JSON line: what each worker reported through ``ray.train.report``, by world rank.
``tests/test_ray.py`` imports :func:`fit` and runs it on the cluster it started, and runs this
script under ``accelkit run`` for the workers' reports.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# Ray here stays on this machine's loopback address (its default is the address of the
# interface that routes off the machine), and reports no usage statistics.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
import ray.train  # noqa: E402
from ray.train import RunConfig, ScalingConfig, UserCallback  # noqa: E402
from ray.train.torch import TorchConfig, TorchTrainer  # noqa: E402

WORKERS = 2


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: the training on the device ``ACCELKIT_DEVICE`` names, in the process
    group Ray initialised (``TorchConfig(backend=...)``); reports its rank, process, device, the
    address Ray gave the group (``MASTER_ADDR``), the path of the group's agreement checks and
    :func:`~accelkit.sdk.testing.distributed_cases.train`'s losses and parameters."""
    import accelkit
    from accelkit.sdk.testing.distributed_cases import train

    context = ray.train.get_context()
    device = accelkit.select_device()
    rank, world = context.get_world_rank(), context.get_world_size()
    trained = train(config["training"], device, rank, world)
    ray.train.report({
        "rank": rank, "world": world, "pid": os.getpid(), "device": str(device),
        "master_addr": os.environ["MASTER_ADDR"], "accelerate_device": os.environ.get("ACCELERATE_TORCH_DEVICE"),
        "agreement_checks": accelkit.stats()["distributed"]["agreement_checks"], **trained,
    })


class _EveryWorkersMetrics(UserCallback):
    """Appends each round of ``ray.train.report`` (a list: every worker's metrics, by world
    rank) to a JSON-lines file: the result of ``fit`` keeps rank 0's metrics only."""

    def __init__(self, path: Path):
        self.path = path

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(metrics) + "\n")


def fit(device: str, training: str, storage: Path, worker_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run ``training`` with ``TorchTrainer`` on :data:`WORKERS` workers of ``device`` (Ray already
    initialised); return each worker's last report, by world rank.

    :param worker_env: the environment variables of this trainer's workers
        (``RunConfig(worker_runtime_env=...)``), ``ACCELKIT_DEVICE`` among them unless the job's
        runtime environment (``ray.init(runtime_env=...)``) has it.
    """
    storage = Path(storage)
    storage.mkdir(parents=True, exist_ok=True)
    reports = storage / f"reports-{training}-{device}.jsonl"
    reports.unlink(missing_ok=True)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"training": training},
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
        torch_config=TorchConfig(backend=device),
        run_config=RunConfig(
            name=f"{training}-{device}", storage_path=str(storage),
            worker_runtime_env={"env_vars": worker_env} if worker_env else None,
            callbacks=[_EveryWorkersMetrics(reports)],
        ),
    )
    trainer.fit()
    rounds = [json.loads(line) for line in reports.read_text(encoding="utf-8").splitlines()]
    return rounds[-1]


def main(device: str, training: str, storage: str) -> None:
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"ACCELKIT_DEVICE": device}})
    try:
        print(json.dumps(fit(device, training, Path(storage))), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
