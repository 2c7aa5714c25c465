"""Two hosts on one machine, for multi-node launches: ``torchrun --nnodes 2`` as across machines.

Each host is a Linux network namespace with an address of its own from 198.51.100.0/24 (a
documentation range, RFC 5737, so it never collides with a real network), joined to the other
by a veth pair and to nothing else: the job's traffic stays between the two. Commands run on a
host see only its interfaces (its loopback included), so a rank that listened on or connected to
``127.0.0.1`` for a peer on the other host would fail, as on real machines.

A host can also have a name of its own (its own UTS namespace and an ``/etc/hosts`` that
resolves both names, bind-mounted by ``ip netns exec``), as real machines do; or keep the
machine's name, which containers commonly resolve to a loopback address: launchers then need
``torchrun --local-addr`` and every group must still find the routed address by itself.

Making namespaces needs root (``CAP_SYS_ADMIN`` and ``CAP_NET_ADMIN``); :func:`two_hosts` raises
:class:`HostsUnavailable` with the reason where it cannot, for a test to skip with::

    with two_hosts() as (a, b):
        args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{a.name}:29500", ...]
        nodes = run_torchrun([(a, args), (b, args)], ["train.py"], log_dir)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.sdk.testing.distributed import RESULT_PREFIX

#: The documentation range the hosts take their addresses from (RFC 5737's TEST-NET-2).
NETWORK = "198.51.100"


class HostsUnavailable(RuntimeError):
    """This machine cannot simulate hosts (no root, no ``ip``/``unshare``); the message says why."""


@dataclass(frozen=True)
class Host:
    """One simulated host: its network namespace, address and (with ``own_name``) host name."""

    name: str
    namespace: str
    address: str
    own_name: bool

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on this host: in its namespace, under its own host name if it has one."""
        inside = ["ip", "netns", "exec", self.namespace]
        if not self.own_name:
            return [*inside, *argv]
        return [*inside, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.name, *argv]


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise HostsUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")


@contextlib.contextmanager
def two_hosts(own_names: bool = True) -> Iterator[tuple[Host, Host]]:
    """Make two hosts (198.51.100.1 and .2), yield them, and remove them afterwards, whatever
    happened inside.

    :param own_names: give each host its own name resolving to its address on both hosts
        (``host-a``, ``host-b``); else both keep this machine's name and its resolution.
    :raises HostsUnavailable: not root, or the tools or the kernel refuse namespaces.
    """
    if os.geteuid() != 0:
        raise HostsUnavailable("simulating hosts needs root: network namespaces and veth pairs")
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            raise HostsUnavailable(f"simulating hosts needs `{tool}` (Debian: iproute2, util-linux)")
    tag = f"ak{os.getpid() % 100000}"
    hosts = tuple(Host(f"host-{s}" if own_names else os.uname().nodename, f"{tag}{s}", f"{NETWORK}.{i}", own_names)
                  for i, s in enumerate("ab", start=1))
    made: list[str] = []
    etc = [Path("/etc/netns") / h.namespace for h in hosts]
    try:
        for host in hosts:
            _run("ip", "netns", "add", host.namespace)
            made.append(host.namespace)
        a, b = hosts
        _run("ip", "link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb")
        for host, end in ((a, f"{tag}va"), (b, f"{tag}vb")):
            _run("ip", "link", "set", end, "netns", host.namespace)
            _run("ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", end)
            _run("ip", "-n", host.namespace, "link", "set", end, "up")
            _run("ip", "-n", host.namespace, "link", "set", "lo", "up")
        if own_names:
            names = "".join(f"{h.address} {h.name}\n" for h in hosts)
            for directory in etc:
                directory.mkdir(parents=True, exist_ok=True)
                (directory / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        yield a, b
    finally:
        for namespace in made:  # removing a namespace removes its end of the veth pair, and so both
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
        for directory in etc:
            shutil.rmtree(directory, ignore_errors=True)


@dataclass
class NodeRun:
    """One host's ``torchrun``: its exit code (None: killed at the deadline), output, and the
    findings each of its ranks printed (by local rank, from every restart attempt in order)."""

    host: Host
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    findings: dict[tuple[int, int], dict] = field(default_factory=dict)  # (attempt, local rank) -> findings

    def describe(self) -> str:
        tail = "\n".join(self.stderr.strip().splitlines()[-30:])
        return f"{self.host.name} ({self.host.address}): exit {self.returncode} after {self.seconds:.1f} s\n{tail}"


def run_torchrun(nodes: Sequence[tuple[Host, Sequence[str]]], target: Sequence[str], log_dir: Path,
                 env: dict[str, str] | None = None, deadline: float = 300.0) -> list[NodeRun]:
    """Start ``torchrun <args> <target>`` on every host at once and wait for all of them.

    Each rank's output goes to ``log_dir/<host>`` (torchrun's ``--log-dir`` with
    ``--redirects 3``); the lines of it that start with
    :data:`~accelkit.sdk.testing.distributed.RESULT_PREFIX` become the node's findings.
    """
    started = time.perf_counter()
    procs = []
    for host, args in nodes:
        directory = log_dir / host.namespace
        argv = [sys.executable, "-m", "torch.distributed.run", *args,
                "--log-dir", str(directory), "--redirects", "3", *target]
        procs.append((host, directory, subprocess.Popen(
            host.command(argv), env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    runs = []
    for host, directory, proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - (time.perf_counter() - started)))
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            code = None
        run = NodeRun(host, code, out, err, time.perf_counter() - started)
        for log in sorted(directory.glob("*/attempt_*/*/stdout.log")):
            attempt, local = int(log.parent.parent.name.split("_")[1]), int(log.parent.name)
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith(RESULT_PREFIX):
                    run.findings[attempt, local] = json.loads(line[len(RESULT_PREFIX):])
        runs.append(run)
    return runs
