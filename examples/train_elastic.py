"""FSDP2 training that survives a lost rank: torchrun restarts the job, which resumes from its
last distributed checkpoint.

    ACCELKIT_DEVICE=tpu torchrun --nproc-per-node 2 --max-restarts 1 examples/train_elastic.py CKPT_DIR
    ACCELKIT_DEVICE=tpu KILL_RANK_AT_STEP=1:5 torchrun ... # rank 1 is killed (SIGKILL) at step 5

Every step ends with a checkpoint (``torch.distributed.checkpoint``: the sharded model, the
optimizer and the losses so far) in ``CKPT_DIR/step-<n>``. A (re)started job loads the newest
complete one and goes on from the step after it. When a rank dies, its peers' next collective
fails (the process group names the dead rank) or torchrun stops them; torchrun then starts every
rank again (``--max-restarts``), and the job ends with the losses of a run that was never
interrupted. Rank 0 prints them as one JSON line, ``losses: [...]``.

``KILL_RANK_AT_STEP=<rank>:<step>`` kills that rank at the start of that step in the first attempt
only (``TORCHELASTIC_RESTART_COUNT`` is 0): the failure this example exists to show.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import accelkit

STEPS, BATCH = 8, 16


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 16, generator=generator), torch.randn(BATCH, 4, generator=generator)


def newest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint of the latest step that was written completely (DCP writes ``.metadata``
    last, once every rank's shards are in place)."""
    done = [d for d in directory.glob("step-*") if (d / ".metadata").exists()]
    return max(done, key=lambda d: int(d.name.split("-")[1]), default=None)


def main(directory: Path) -> None:
    device = accelkit.select_device()
    dist.init_process_group(device.type)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model().to(device)
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = torch.zeros(STEPS)  # the whole job's losses; the checkpoint carries those so far
    start = 0
    resume = newest_checkpoint(directory)
    if resume is not None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "losses": losses}
        dcp.load(state, checkpoint_id=resume)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        start = int(resume.name.split("-")[1]) + 1
        if rank == 0:
            print(f"resumed from {resume.name} (attempt {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')})", flush=True)

    kill_rank, kill_step = (int(v) for v in os.environ.get("KILL_RANK_AT_STEP", "-1:-1").split(":"))
    rows = BATCH // world
    for step in range(start, STEPS):
        if rank == kill_rank and step == kill_step and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            print(f"rank {rank}: killed at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step)
        x, y = x[rank * rows:(rank + 1) * rows].to(device), y[rank * rows:(rank + 1) * rows].to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # the full batch's loss
        losses[step] = mean.cpu()
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state, "losses": losses},
                 checkpoint_id=directory / f"step-{step}")
    if rank == 0:
        print("losses: " + json.dumps(losses.tolist()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
