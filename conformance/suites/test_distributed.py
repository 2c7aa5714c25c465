"""Distributed: the backend's c10d process group across real processes on 127.0.0.1.

Every collective of :func:`accelkit.sdk.testing.distributed_cases.collective_cases` runs on the
backend's tensors in ``init_process_group("<backend>")`` and, in the same processes, on CPU
tensors through plain gloo; each rank compares its results (values, dtypes, shapes). Training
(DDP; FSDP2 in the full profile) is compared with a single-process full-batch run on the CPU.
World sizes: 2 in the quick profile, 2 and 4 in the full one. A scenario runs once per world
size and process (the tests read its per-rank findings); a rank that crashes or hangs fails
the tests of that run, not the suite.

Declared skip for a backend without collectives (no ``accelkit_make_process_group``).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from accelkit.sdk import backends
from accelkit.sdk.testing.distributed import RankResult, run_ranks
from accelkit.sdk.testing.distributed_cases import collective_cases
from accelkit_conformance import session
from accelkit_conformance.cases import param_id
from accelkit_conformance.once import once_per_run

SETTINGS = session.current()
NAME = SETTINGS.backend
WORLD_SIZES = (2,) if SETTINGS.profile.name == "quick" else (2, 4)
TRAINING = ("ddp",) if SETTINGS.profile.name == "quick" else ("ddp", "fsdp2")
HAS_COLLECTIVES = NAME in backends() and backends()[NAME].implements("accelkit_make_process_group")


@functools.cache
def _ranks(scenario: str, world: int) -> tuple[RankResult, ...]:
    """The scenario's run at this world size, once per pytest run (not once per xdist worker)."""
    def run() -> list[dict]:
        ranks = run_ranks(NAME, scenario, world_size=world, deadline=SETTINGS.profile.timeout * 2)
        return [dataclasses.asdict(rank) for rank in ranks]

    return tuple(RankResult(**rank) for rank in once_per_run(f"{NAME}-{scenario}-world{world}", run))


def _findings(scenario: str, world: int) -> list[dict]:
    if not HAS_COLLECTIVES:
        pytest.skip(f"{NAME} has no collectives (accelkit_make_process_group)")
    ranks = _ranks(scenario, world)
    for rank in ranks:
        if rank.returncode != 0 or "scenario_error" in rank.findings:
            error = rank.findings.get("scenario_error", "")
            pytest.fail(f"{scenario} at world size {world}: {rank.describe()}\n{error[-2000:]}")
    return [rank.findings for rank in ranks]


@pytest.mark.parametrize(
    "name,world",
    [pytest.param(name, world, id=param_id(name, f"world{world}"))
     for world in WORLD_SIZES for name in collective_cases(2)],
)
def test_collective(name, world):
    for rank, findings in enumerate(_findings("collectives", world)):
        assert findings[name] == "ok", f"rank {rank}: {findings[name]}"


@pytest.mark.parametrize(
    "scenario,world",
    [pytest.param(s, w, id=param_id(s, f"world{w}")) for w in WORLD_SIZES for s in TRAINING],
)
def test_training(scenario, world):
    for rank, findings in enumerate(_findings(scenario, world)):
        assert findings["losses_close"], f"rank {rank}: losses {findings['losses']} vs {findings['reference_losses']}"
        assert findings["parameters_close"], f"rank {rank}: parameters differ by {findings['max_parameter_difference']}"
