"""The trainings any launcher runs (torchrun's scenarios, Ray Train's workers) and the reference they equal."""

from __future__ import annotations

from collections.abc import Callable

import torch

from accelkit.sdk.testing.distributed_cases.sharded_init import _fsdp2_meta_init_training
from accelkit.sdk.testing.distributed_cases.training import _batches, _ddp_training, _model, _train, _trained


#: What :func:`train` runs, by name: each takes ``(device, rank, world)`` and returns the trained
#: model and this rank's losses.
TRAININGS: dict[str, Callable[[torch.device, int, int], tuple[torch.nn.Module, list[float]]]] = {
    "ddp": _ddp_training,
    "fsdp2_meta_init": _fsdp2_meta_init_training,
}


def train(name: str, device: torch.device, rank: int, world: int) -> dict[str, list[float]]:
    """Run the training ``name`` of :data:`TRAININGS` as rank ``rank`` of ``world``, in the default
    process group that the launcher initialised on ``device`` (torchrun's ranks: the scenarios of
    the same names, whose findings carry this under ``trained``; Ray Train's workers:
    ``TorchConfig(backend=device.type)``), and return what each worker reports, as Python floats:
    ``losses``, this rank's loss at each step (on its slice of every batch), and ``parameters``,
    the model's full parameters after training, flattened into one list. Every collective runs
    in the default group, so two launchers that give the ranks the same device and world size
    give the same results.

    ``ddp``: :func:`_model` under DDP with several gradient buckets, SGD on ``_batches(4, 8)``,
    each rank on its slice of every batch: the mean of the ranks' losses and the parameters are
    one process's on the whole batches (:func:`single_process_training`). ``fsdp2_meta_init``: a
    model built on the meta device, sharded with FSDP2 (bfloat16 parameters, float32
    reduction), moved with ``to_empty``, initialised from the device generator and trained on
    ``_batches(3, 8)``."""
    return _trained(*TRAININGS[name](device, rank, world))


def single_process_training() -> dict[str, list[float]]:
    """The ``ddp`` training of :func:`train` in one process on the CPU on the whole batches, as
    :func:`train` reports it: the losses and parameters that the ranks' must equal (the ranks'
    losses averaged) to float32 rounding."""
    model = _model()
    return _trained(model, _train(model, _batches(4, 8), torch.device("cpu")))
