"""The sockets a host-staged group's agreement check travels over.

Every collective of a checked group first swaps one small fingerprint per rank
(:mod:`accelkit._runtime.distributed.agreement`). Through gloo that swap costs a collective of its own: gloo's work
queue, its worker thread and the waiting caller hand off to each other on both ends, about
0.2 ms on loopback, a quarter of a 1 MiB all-reduce. So each group opens its own full mesh of
TCP connections when it is created (as gloo opens its pairs) and the calling thread swaps the
fingerprints over them directly, about 0.025 ms. The bytes of the collective still go through
gloo; only the fingerprints travel here.

Where the ranks cannot reach each other this way (a port the network blocks, an address that
does not route), every rank of the group falls back to gloo for the check: the ranks settle on
one answer through the group's store, so they always agree on the path.

Messages have a fixed length, the same on every rank of a group, so the stream never needs
framing. A swap that fails (a peer that timed out or died) leaves the streams out of step: the
channel then refuses every later swap, as gloo refuses a group whose pairs closed.
"""

from __future__ import annotations

import socket
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from accelkit._runtime.distributed.addresses import advertised_address

#: How long a rank waits to connect to a peer while the group is being created.
_CONNECT_SECONDS = 30.0


class ChannelBroken(ConnectionError):
    """An earlier swap of this channel failed; its streams are out of step."""


class AgreementChannel:
    """A full mesh of TCP connections between the ranks of one group (none for one rank).

    :meth:`swap` sends this rank's message to every peer and returns every rank's message, in
    rank order. It runs on the calling thread; concurrent callers take turns.
    """

    def __init__(self, rank: int, peers: dict[int, socket.socket], timeout: timedelta):
        self.rank = rank
        self._peers = dict(sorted(peers.items()))
        self._timeout = timeout.total_seconds()
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._closer = weakref.finalize(self, _close_all, list(self._peers.values()))

    def swap(self, message: bytes, meanwhile: Callable[[], None] = lambda: None) -> list[bytes]:
        """Every rank's ``message`` (all of one length), ``meanwhile`` run while they travel (an
        error it raises is raised after the peers' messages are read, so the streams stay in
        step).

        Raises :class:`TimeoutError` when a peer sends nothing within the group's timeout,
        :class:`ConnectionResetError` when a peer's connection closed (its process exited), each
        with the peer's rank as ``peer_rank``, and :class:`ChannelBroken` once either has happened.
        """
        with self._lock:
            if self._broken is not None:
                raise ChannelBroken(f"an earlier collective of this group failed ({self._broken})")
            current = None
            try:
                for current, peer in self._peers.items():
                    peer.sendall(message)
                try:
                    meanwhile()
                except Exception as exc:  # raised after the peers' messages are read: streams stay in step
                    failed: Exception | None = exc
                else:
                    failed = None
                deadline = time.monotonic() + self._timeout
                received = {}
                for current, peer in self._peers.items():
                    received[current] = _receive(peer, len(message), deadline)
            except OSError as exc:
                self._broken = type(exc).__name__
                exc.peer_rank = current  # type: ignore[attr-defined]  # the rank to name in the error
                raise
        if failed is not None:
            raise failed
        received[self.rank] = message
        return [received[r] for r in sorted(received)]

    def close(self) -> None:
        self._closer()


def open_channel(store: Any, rank: int, world: int, timeout: timedelta,
                 address: str | None = None) -> AgreementChannel | None:
    """Connect the ranks of a group being created (every rank calls this, as gloo's constructor).

    Rank ``i`` listens, publishes its address in ``store``, connects to every lower rank and
    accepts every higher one. Returns None on every rank if any rank could not connect (the
    group then checks through gloo).

    :param address: the address to listen on and publish; default: the interface that routes to
        ``MASTER_ADDR`` (loopback when the master is local), else the host name's address.
    """
    if world == 1:
        return AgreementChannel(rank, {}, timeout)
    address = address or advertised_address()
    peers: dict[int, socket.socket] = {}
    listener = None
    try:
        listener = socket.create_server((address, 0), family=_family(address), backlog=world)
        host, port = listener.getsockname()[:2]
        store.set(f"address/{rank}", f"{host} {port}")
    except OSError:
        store.set(f"address/{rank}", "")
    ok = listener is not None
    for lower in range(rank):
        target = store.get(f"address/{lower}").decode()
        ok = ok and bool(target) and _connect(target, rank, lower, peers)
    store.set(f"connected/{rank}", "1" if ok else "0")
    if ok:
        ok = _accept(listener, store, range(rank + 1, world), peers, timeout.total_seconds())
    store.set(f"ready/{rank}", "1" if ok else "0")
    if listener is not None:
        listener.close()
    if all(store.get(f"ready/{r}") == b"1" for r in range(world)):
        for peer in peers.values():
            peer.settimeout(None)
        return AgreementChannel(rank, peers, timeout)
    _close_all(list(peers.values()))
    return None


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _connect(target: str, rank: int, lower: int, peers: dict[int, socket.socket]) -> bool:
    host, port = target.rsplit(" ", 1)
    try:
        peer = socket.create_connection((host, int(port)), timeout=_CONNECT_SECONDS)
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer.sendall(rank.to_bytes(4, "little"))
    except OSError:
        return False
    peers[lower] = peer
    return True


def _accept(listener: socket.socket, store: Any, higher: range, peers: dict[int, socket.socket],
            timeout: float) -> bool:
    """Accept every higher rank; give up when one of them reports it could not connect, or at
    the group's timeout."""
    pending = set(higher)
    deadline = time.monotonic() + timeout
    listener.settimeout(0.05)
    while pending:
        try:
            peer, _ = listener.accept()
        except TimeoutError:
            failed = [r for r in pending if store.check([f"connected/{r}"]) and store.get(f"connected/{r}") == b"0"]
            if failed or time.monotonic() > deadline:
                return False
            continue
        except OSError:
            return False
        try:
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            who = int.from_bytes(_receive(peer, 4, deadline), "little")
        except OSError:
            peer.close()
            return False
        if who not in pending:
            peer.close()
            return False
        peers[who] = peer
        pending.discard(who)
    return True


def _receive(peer: socket.socket, nbytes: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < nbytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out")
        peer.settimeout(remaining)
        chunk = peer.recv(nbytes - got)
        if not chunk:
            raise ConnectionResetError("the peer closed its connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _close_all(peers: list[socket.socket]) -> None:
    for peer in peers:
        try:
            peer.close()
        except OSError:
            pass
