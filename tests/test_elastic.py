"""Elastic restart: a rank killed mid-training, torchrun restarts the job, which resumes from its
last DCP checkpoint and ends with the losses of a run that was never interrupted.

``examples/train_elastic.py`` (FSDP2 with AdamW, a checkpoint every step) runs twice under
``torchrun --max-restarts 1``: once untouched, once with rank 1 killed (SIGKILL) at step 5. The
survivor must not hang: it fails at its next collective with an error naming rank 1 (or torchrun
stops it first), and the whole job is done within the deadline.

CI runs tpu; ``make launchers`` (``ACCELKIT_LAUNCHERS=full``) runs neuron too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelkit.sdk.testing.distributed import free_port

FULL = os.environ.get("ACCELKIT_LAUNCHERS") == "full"
EXAMPLE = Path(__file__).parents[1] / "examples" / "train_elastic.py"


def _torchrun(device: str, checkpoints: Path, kill: str | None) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "ACCELKIT_DEVICE": device}
    env.pop("KILL_RANK_AT_STEP", None)
    if kill:
        env["KILL_RANK_AT_STEP"] = kill
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(EXAMPLE), str(checkpoints)]
    started = time.perf_counter()
    # Its own session, so that a hang kills torchrun's workers too, not only torchrun.
    launcher = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        out, err = launcher.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        out, err = launcher.communicate()
        pytest.fail(f"the job hung (killed after 400 s):\n{out[-2000:]}\n{err[-4000:]}")
    done = subprocess.CompletedProcess(argv, launcher.returncode, out, err)
    return done, time.perf_counter() - started


def _losses(done: subprocess.CompletedProcess) -> list[float]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("losses: ")]
    assert len(lines) == 1, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[0][len("losses: "):])


@pytest.mark.parametrize("device", ["tpu", pytest.param("neuron", marks=pytest.mark.skipif(
    not FULL, reason="neuron's elastic restart runs under `make launchers` (ACCELKIT_LAUNCHERS=full)"))])
def test_a_rank_killed_mid_training_resumes_from_its_checkpoint_with_the_uninterrupted_losses(tmp_path, device):
    whole, _ = _torchrun(device, tmp_path / "whole", kill=None)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "resumed" not in whole.stdout

    killed, seconds = _torchrun(device, tmp_path / "killed", kill="1:5")
    assert killed.returncode == 0, killed.stderr[-3000:]
    output = killed.stdout + killed.stderr
    assert "rank 1: killed at step 5" in output
    assert "resumed from step-4 (attempt 1)" in output  # the newest complete checkpoint, one restart
    assert _losses(killed) == _losses(whole)  # bit for bit: the same steps on the same shards
    # The survivor failed at its next collective naming the dead rank, unless torchrun stopped it first.
    errors = [line for line in output.splitlines() if "CollectiveError:" in line]
    assert all("rank 1's process exited" in line for line in errors), errors
    assert seconds < 300


_RANK = """
import datetime, os, time
import torch, torch.distributed as dist
import accelkit

device = accelkit.select_device()
time.sleep(float(os.environ["START_AFTER"]))
dist.init_process_group(device.type, timeout=datetime.timedelta(seconds=15))
total = torch.full((2,), float(dist.get_rank() + 1), device=device)
dist.all_reduce(total)
print("sum", total.cpu().tolist(), flush=True)
dist.destroy_process_group()
"""


def test_a_restarted_group_never_reads_the_addresses_its_dead_predecessors_published():
    """torchrun's agent keeps one store across restarts and its workers use it unprefixed. Rank 0
    of the second attempt comes 3 s late: rank 1 must wait for its new addresses (gloo's and the
    agreement channel's), not connect to those attempt 0 left in the store."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))

    def attempt(number: int, start_after: tuple[float, float]) -> list[tuple[int, str, str]]:
        procs = [subprocess.Popen(
            [sys.executable, "-c", _RANK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")},
                 "ACCELKIT_DEVICE": "ref", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
                 "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(number),
                 "START_AFTER": str(start_after[rank])})
            for rank in range(2)]
        results = []
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            results.append((proc.returncode, out, err))
        return results

    for number, start_after in ((0, (0.0, 0.0)), (1, (3.0, 0.0))):
        for code, out, err in attempt(number, start_after):
            assert code == 0, f"attempt {number}: {err[-3000:]}"
            assert "sum [3.0, 3.0]" in out
            # The agreement channel connected too (a stale address sent its checks through gloo).
            assert "could not open connections" not in err, err[-3000:]
