"""torchrun across two hosts, each running two ranks on its simulated device.

The hosts are network namespaces with their own addresses from 198.51.100.0/24, joined by a
veth pair (:mod:`accelkit.sdk.testing.hosts`); nothing of the job can go through a shared
loopback. Each launch is TorchTitan-style multi-node torchrun: ``--nnodes 2 --nproc-per-node 2
--rdzv-backend c10d``, the same command on both hosts. Where this machine cannot make namespaces
(not root), the tests skip and say why.

CI runs DDP and FSDP2 on tpu; ``make launchers`` (``ACCELKIT_LAUNCHERS=full``) runs neuron and
the loopback-named hosts too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accelkit.sdk.testing.distributed import free_port
from accelkit.sdk.testing.hosts import HostsUnavailable, run_torchrun, two_hosts

FULL = os.environ.get("ACCELKIT_LAUNCHERS") == "full"
DEVICES = [pytest.param("tpu"), pytest.param("neuron", marks=pytest.mark.skipif(
    not FULL, reason="neuron's multi-node launches run under `make launchers` (ACCELKIT_LAUNCHERS=full)"))]
EXAMPLE = Path(__file__).parents[1] / "examples" / "train_ddp.py"


@pytest.fixture
def hosts(request):
    """Two simulated hosts (with names of their own unless the test's parameter is False),
    removed after the test; the test skips where this machine cannot make them."""
    try:
        with two_hosts(getattr(request, "param", True)) as pair:
            yield pair
            return
    except HostsUnavailable as exc:
        unavailable = exc
    pytest.skip(f"cannot simulate two hosts here: {unavailable}")


def _torchrun_args(endpoint: str, run_id: str) -> list[str]:
    return ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]


@pytest.mark.parametrize("device", DEVICES)
def test_ddp_and_fsdp2_on_two_hosts_of_two_ranks_equal_one_process(tmp_path, hosts, device):
    a, b = hosts
    args = _torchrun_args(f"{a.name}:{free_port()}", "ddp-fsdp2")
    nodes = run_torchrun([(a, args), (b, args)],
                         ["-m", "accelkit.sdk.testing.distributed_cases", "ddp+fsdp2"],
                         tmp_path, env={"ACCELKIT_DEVICE": device}, deadline=400)
    for node in nodes:
        assert node.returncode == 0, node.describe()
        assert sorted(node.findings) == [(0, 0), (0, 1)], node.describe()  # two ranks, one attempt
    ranks = [findings for node in nodes for findings in node.findings.values()]
    for findings in ranks:
        assert "scenario_error" not in findings, findings.get("scenario_error")
        for scenario in ("ddp", "fsdp2"):
            result = findings[scenario]
            assert result["losses_close"] and result["parameters_close"], result
        # The agreement checks went over the group's own sockets between the hosts, not through gloo.
        assert set(findings["ddp"]["agreement_checks"]) == {"sockets"}, findings["ddp"]
        assert findings["fsdp2"]["shard_shape"] == [4, 8]  # 16 rows over 4 ranks
    # Every rank saw the same full-batch losses: one job of four ranks, not two jobs of two.
    assert len({tuple(findings["ddp"]["losses"]) for findings in ranks}) == 1


@pytest.mark.skipif(not FULL, reason="runs under `make launchers` (ACCELKIT_LAUNCHERS=full): CI's budget")
@pytest.mark.parametrize("hosts", [False], indirect=True, ids=["names-as-this-machine"])
def test_hosts_whose_names_resolve_to_loopback_train_when_torchrun_is_given_their_addresses(tmp_path, hosts):
    """Containers often resolve the host name to 127.0.0.x. torchrun is then told each host's
    address (``--local-addr``, and ``is_host`` on the rendezvous host); the device's process group
    must find the routed address by itself (gloo's default follows the host name, to loopback,
    and the group never formed)."""
    a, b = hosts
    args = _torchrun_args(f"{a.address}:{free_port()}", "loopback-names")
    nodes = run_torchrun(
        [(a, [*args, "--rdzv-conf", "is_host=1", "--local-addr", a.address]),
         (b, [*args, "--local-addr", b.address])],
        [str(EXAMPLE)], tmp_path, env={"ACCELKIT_DEVICE": "tpu"}, deadline=300)
    for node in nodes:
        assert node.returncode == 0, node.describe()
    outputs = [log.read_text() for log in tmp_path.glob("*/*/attempt_0/*/stdout.log")]
    table = [out for out in outputs if "4 ranks on tpu" in out]
    assert len(table) == 1, outputs  # rank 0 prints the losses beside one process's
    rows = [line.split() for line in table[0].splitlines() if line[:4].strip().isdigit()]
    assert len(rows) == 8
    for _step, ddp, single in rows:
        assert abs(float(ddp) - float(single)) < 1e-5
