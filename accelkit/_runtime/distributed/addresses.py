"""Where a rank's host-staged group listens: the address its peers on other hosts reach it at.

A group opens two kinds of connections, gloo's pairs (the bytes of every collective) and the
agreement channel (the fingerprints). Both must listen on an address that routes to the other
hosts of the job. A host name is no guide to that: containers and cloud images commonly resolve
it to a loopback address (Debian's ``127.0.1.1``, gVisor's ``127.0.0.1``), on which a peer on
another host never arrives. The rendezvous is: every launcher (``torchrun``, Ray Train,
``init_method="env://"``) sets ``MASTER_ADDR`` to the host all ranks already reached for the
store, so the local end of the route to it is an address every peer can reach too.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

#: torchrun's count of restarts of the job (``--max-restarts``), 0 in its first attempt.
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"

#: Gloo's own variable: the network interfaces its pairs use. Set, it wins, as with plain gloo.
GLOO_INTERFACES_ENV = "GLOO_SOCKET_IFNAME"


def advertised_address() -> str:
    """This host's address as its peers reach it: the local end of the route to ``MASTER_ADDR``
    (loopback when the master is local), else the host name's address, else loopback."""
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            family, _, _, _, where = socket.getaddrinfo(master, 1, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(where)  # a UDP connect sends nothing; it only picks the route
                return probe.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def gloo_group(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """A gloo process group whose pairs listen on :func:`advertised_address`, or on the
    interfaces ``GLOO_SOCKET_IFNAME`` names when it is set (gloo's own rule then)."""
    import torch.distributed as dist

    if os.environ.get(GLOO_INTERFACES_ENV):
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=advertised_address())]
    return dist.ProcessGroupGloo(store, rank, size, options)


def this_attempts_keys(store: Any) -> Any:
    """``store`` seen through a prefix of the launch attempt, under torchrun.

    torchrun's agent keeps one store server for the whole job, across restarts, and its workers
    use it unprefixed: a restarted rank would read the addresses its dead predecessor published
    (gloo's pairs, the agreement channel's) and wait on them until the group's timeout, or not,
    depending on which rank wrote first. Keys written under the attempt's prefix are fresh."""
    import torch.distributed as dist

    attempt = os.environ.get(RESTART_COUNT_ENV)
    return dist.PrefixStore(f"attempt-{attempt}", store) if attempt else store
