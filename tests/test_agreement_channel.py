"""The sockets a checked process group swaps its ranks' fingerprints over
(``accelkit/_runtime/distributed/agreement_channel.py``): ranks are threads here, sharing one real c10d store
and real TCP connections on 127.0.0.1; the multi-process behaviour (mismatches, a dead rank, a
timeout) is in ``test_distributed.py``."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch.distributed as dist

from accelkit._runtime.distributed.agreement_channel import ChannelBroken, open_channel


def _open_all(world: int, timeout: float = 20.0, addresses=None):
    store = dist.HashStore()
    addresses = addresses or ["127.0.0.1"] * world
    with ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(open_channel, store, r, world, timedelta(seconds=timeout), addresses[r])
                   for r in range(world)]
        return [f.result(timeout=60) for f in futures]


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_receives_every_message_in_rank_order(world):
    channels = _open_all(world)
    assert all(c is not None for c in channels)
    ran = [threading.Event() for _ in range(world)]
    with ThreadPoolExecutor(world) as pool:
        for round_ in range(3):
            messages = [bytes([r, round_]) * 8 for r in range(world)]
            futures = [pool.submit(c.swap, messages[r], ran[r].set) for r, c in enumerate(channels)]
            assert [f.result(timeout=30) for f in futures] == [messages] * world
    assert all(e.is_set() for e in ran)
    for c in channels:
        c.close()


def test_an_error_of_the_work_done_meanwhile_is_raised_after_the_messages_are_in():
    channels = _open_all(2)

    def failing() -> None:
        raise ValueError("staging failed")

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(channels[0].swap, b"A" * 8, failing), pool.submit(channels[1].swap, b"B" * 8)]
        with pytest.raises(ValueError, match="staging failed"):
            futures[0].result(timeout=30)
        assert futures[1].result(timeout=30) == [b"A" * 8, b"B" * 8]
        # Still in step: the next swap reads the next messages, not the ones left unread.
        futures = [pool.submit(c.swap, bytes([r]) * 8) for r, c in enumerate(channels)]
        assert [f.result(timeout=30) for f in futures] == [[bytes([0]) * 8, bytes([1]) * 8]] * 2
    for c in channels:
        c.close()


def test_one_rank_needs_no_connection():
    (channel,) = _open_all(1)
    assert channel.swap(b"abcdefgh") == [b"abcdefgh"]


def test_a_rank_that_cannot_listen_makes_every_rank_fall_back():
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: rank 1 cannot listen, so rank 2
    # cannot connect to it, and every rank, rank 0 included, must answer None.
    assert _open_all(3, addresses=["127.0.0.1", "192.0.2.1", "127.0.0.1"]) == [None, None, None]


def test_a_silent_peer_times_out_and_the_channel_refuses_later_swaps():
    first, second = _open_all(2, timeout=0.3)
    with pytest.raises(TimeoutError):
        first.swap(b"12345678")
    with pytest.raises(ChannelBroken, match="earlier collective of this group failed"):
        first.swap(b"12345678")
    second.close()


def test_a_peer_that_closed_its_connections_is_reported_at_once():
    first, second = _open_all(2, timeout=20)
    second.close()
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        first.swap(b"12345678")


def test_the_advertised_address_routes_to_a_local_master(monkeypatch):
    from accelkit._runtime.distributed.addresses import advertised_address

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert advertised_address() == "127.0.0.1"
    monkeypatch.delenv("MASTER_ADDR")
    socket.inet_aton(advertised_address())  # some IPv4 address of this host
