"""The scenarios :func:`accelkit.sdk.testing.distributed.run_ranks` runs, one per process and rank.

``python -m accelkit.sdk.testing.distributed_cases SCENARIO`` under torchrun's environment
activates ``ACCELKIT_DEVICE``, joins the process group of that name and prints one JSON line of
findings (``A+B`` runs scenarios A then B in the same ranks, their findings under their names).
Every comparison is made here, per rank, against an independent reference computed in the same
process: gloo on CPU tensors (a second group of the same ranks) for collectives, a
single-process full-batch run on the CPU for training.

Scenarios: ``collectives``, ``reductions``, ``mismatch``, ``dead_rank``, ``timeout``, ``ddp``,
``fsdp2``, ``fsdp2_mixed``, ``dtensor``, ``checkpoint``, ``sharded_random``, ``fsdp2_meta_init``.

The trainings of ``ddp`` and ``fsdp2_meta_init`` also run under another launcher's process group
through :func:`train` (Ray Train's workers call it), which reports what those scenarios' findings
carry under ``trained``: the launchers' runs compare number for number.

One module per kind of scenario: :mod:`.collectives` (and NCCL's reduce ops), :mod:`.failures`
(mismatch, a dead rank, a silent one), :mod:`.training` (DDP, FSDP2, mixed precision, DTensor),
:mod:`.sharded_init` (random numbers on shards, meta-device initialisation), :mod:`.checkpoint`
(DCP), :mod:`.launchers` (the trainings other launchers run); ``_group`` holds what they share.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

from accelkit.sdk.testing.distributed import RESULT_PREFIX
from accelkit.sdk.testing.distributed_cases.checkpoint import scenario_checkpoint, scenario_checkpoint_reshard
from accelkit.sdk.testing.distributed_cases.collectives import (NCCL_OPS, collective_cases, reduction_cases,
                                                                scenario_collectives, scenario_reductions)
from accelkit.sdk.testing.distributed_cases.failures import scenario_dead_rank, scenario_mismatch, scenario_timeout
from accelkit.sdk.testing.distributed_cases.launchers import TRAININGS, single_process_training, train
from accelkit.sdk.testing.distributed_cases.sharded_init import scenario_fsdp2_meta_init, scenario_sharded_random
from accelkit.sdk.testing.distributed_cases.training import (scenario_ddp, scenario_dtensor, scenario_fsdp2,
                                                             scenario_fsdp2_mixed)

__all__ = ["NCCL_OPS", "SCENARIOS", "TRAININGS", "collective_cases", "main", "reduction_cases",
           "single_process_training", "train"]

SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "collectives": scenario_collectives,
    "reductions": scenario_reductions,
    "mismatch": scenario_mismatch,
    "dead_rank": scenario_dead_rank,
    "timeout": scenario_timeout,
    "ddp": scenario_ddp,
    "fsdp2": scenario_fsdp2,
    "fsdp2_mixed": scenario_fsdp2_mixed,
    "dtensor": scenario_dtensor,
    "checkpoint": scenario_checkpoint,
    "checkpoint_reshard": scenario_checkpoint_reshard,
    "sharded_random": scenario_sharded_random,
    "fsdp2_meta_init": scenario_fsdp2_meta_init,
}


def main(argv: list[str]) -> int:
    name, *args = argv
    try:
        if "+" in name:  # several scenarios in one launch (a launch costs the ranks' startup)
            findings = {part: SCENARIOS[part](*args) for part in name.split("+")}
        else:
            findings = SCENARIOS[name](*args)
    except Exception:
        findings = {"scenario_error": traceback.format_exc()}
    print(RESULT_PREFIX + json.dumps(findings, default=str), flush=True)
    import torch.distributed as dist

    if dist.is_initialized() and "scenario_error" not in findings and name not in ("dead_rank", "timeout"):
        dist.barrier()
        dist.destroy_process_group()
    return 0
