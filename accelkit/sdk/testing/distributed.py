"""Multi-process checks of a backend's torch.distributed support, on 127.0.0.1.

:func:`run_ranks` starts ``world_size`` fresh processes, one per rank, with the environment
``torchrun`` gives (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``)
and the device under test in ``ACCELKIT_DEVICE``. Each runs one scenario of
:mod:`accelkit.sdk.testing.distributed_cases` and prints its findings as one JSON line; a rank
that crashes, hangs past the deadline or exits early is reported, never waited on forever::

    ranks = run_ranks("tpu", "collectives", world_size=2)
    assert all(r.findings == {...} for r in ranks)

``run_ranks("tpu", "reductions+fsdp2_mixed")`` runs two scenarios in the same ranks (one startup),
each one's findings under its name.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

RESULT_PREFIX = "accelkit-distributed-result: "


@dataclass
class RankResult:
    """One rank's outcome: exit code (None: killed at the deadline), its findings, its output."""

    rank: int
    returncode: int | None
    findings: dict[str, Any] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        tail = "\n".join(self.stderr.strip().splitlines()[-25:])
        return f"rank {self.rank}: exit {self.returncode} after {self.seconds:.1f} s\n{tail}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(device: str, scenario: str, world_size: int = 2, deadline: float = 240.0,
              env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> list[RankResult]:
    """Run ``scenario`` on ``world_size`` ranks of ``device`` and return each rank's result.

    :param deadline: seconds for the whole run; ranks still running are killed (returncode None).
    :param env: extra environment for every rank.
    """
    port = free_port()
    procs = []
    started = time.perf_counter()
    for rank in range(world_size):
        rank_env = {
            **os.environ, **(env or {}),
            "ACCELKIT_DEVICE": device, "RANK": str(rank), "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        }
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "accelkit.sdk.testing.distributed_cases", scenario, *args],
            env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    results = []
    for rank, proc in enumerate(procs):
        remaining = max(1.0, deadline - (time.perf_counter() - started))
        try:
            out, err = proc.communicate(timeout=remaining)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            code = None
        findings: dict[str, Any] = {}
        for line in out.splitlines():
            if line.startswith(RESULT_PREFIX):
                findings = json.loads(line[len(RESULT_PREFIX):])
        results.append(RankResult(rank, code, findings, out, err, time.perf_counter() - started))
    return results
