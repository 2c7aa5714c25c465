"""Device memory: the SDK's caching allocator on its own, and the ref device's memory through torch.

The unit tests drive :class:`accelkit.sdk.DeviceAllocator` through a tiny in-test backend whose
blocks are ``bytearray`` objects; the device tests watch ``torch.ref.memory_*`` while tensors come
and go, run out of memory on purpose and check that nothing is left behind.
"""

from __future__ import annotations

import os
import random
import subprocess

import pytest
import torch
from conftest import run_python

from accelkit.sdk import DeviceAllocator, format_bytes, size_class
from accelkit_backends.ref.device import parse_bytes

KiB, MiB = 1 << 10, 1 << 20


# Memory counters change only through each test's own tensors, so a leak shows as an exact
# difference (see the no_gc fixture in conftest).
pytestmark = pytest.mark.usefixtures("no_gc")


class BytesAllocator(DeviceAllocator):
    """The smallest backend: blocks are bytearrays; it records what the base asks of it."""

    def __init__(self, capacity: int, max_cached: int | None = None):
        super().__init__("tiny:0", capacity, max_cached)
        self.made: list[int] = []
        self.freed: list[int] = []
        self.fail_next = False

    def _alloc_block(self, nbytes: int) -> bytearray:
        if self.fail_next:
            self.fail_next = False
            raise MemoryError("backend refused the block")
        self.made.append(nbytes)
        return bytearray(nbytes)

    def _free_block(self, block: bytearray) -> None:
        self.freed.append(len(block))


# ---------------------------------------------------------------------------------------------
# size classes
# ---------------------------------------------------------------------------------------------


def test_small_requests_round_up_to_512_byte_multiples():
    for n in [0, 1, 511, 512, 513, 1000, 4096, 65_537, MiB - 1, MiB]:
        c = size_class(n)
        assert c >= max(n, 512)
        assert c % 512 == 0
        assert c - n < 512 or n == 0


def test_large_requests_use_four_classes_per_power_of_two():
    for k in range(21, 34):
        low = 1 << (k - 1)
        classes = {size_class(n) for n in range(low + 1, 2 * low + 1, max(1, low // 997))}
        classes.add(size_class(2 * low))
        assert classes == {low * 5 // 4, low * 3 // 2, low * 7 // 4, 2 * low}


def test_large_classes_fit_the_request_with_under_a_fifth_of_slack():
    rng = random.Random(7)
    sizes = [MiB + 1, 3 * MiB, (5 << 20) + 3, 1 << 30] + [rng.randrange(MiB + 1, 1 << 34) for _ in range(500)]
    for n in sizes:
        c = size_class(n)
        assert n <= c
        assert (c - n) * 5 <= c


def test_size_classes_never_shrink_as_requests_grow():
    rng = random.Random(3)
    sizes = sorted(rng.randrange(0, 1 << 32) for _ in range(2000))
    classes = [size_class(n) for n in sizes]
    assert classes == sorted(classes)


# ---------------------------------------------------------------------------------------------
# the DeviceAllocator base, with an in-test backend
# ---------------------------------------------------------------------------------------------


def test_buffer_reserves_its_size_class_and_remembers_the_request():
    alloc = BytesAllocator(64 * MiB)
    buf = alloc.allocate(1000)
    assert buf.nbytes == 1000
    assert buf.block_bytes == size_class(1000)
    assert alloc.made == [size_class(1000)]
    assert len(buf.block) == size_class(1000)
    stats = alloc.memory_stats()
    assert stats["allocated_bytes.current"] == size_class(1000)
    assert stats["requested_bytes.current"] == 1000


def test_an_allocator_that_caches_nothing_reserves_exactly_the_request():
    alloc = BytesAllocator(64 * MiB, max_cached=0)
    buf = alloc.allocate(1000)
    assert (buf.nbytes, buf.block_bytes, alloc.made) == (1000, 1000, [1000])
    assert alloc.memory_allocated() == 1000
    del buf
    assert alloc.memory_allocated() == 0 and alloc.freed == [1000]


def test_freed_block_is_cached_and_reused_by_a_request_of_the_same_class():
    alloc = BytesAllocator(64 * MiB)
    first = alloc.allocate(1000)
    block = first.block
    del first
    assert alloc.memory_allocated() == 0
    assert alloc.memory_reserved() == size_class(1000)  # kept for reuse, not given back
    assert alloc.freed == []

    again = alloc.allocate(900)  # a different request in the same class
    assert again.block is block
    assert alloc.made == [size_class(1000)]
    assert alloc.memory_stats()["num_cache_hits"] == 1
    assert alloc.memory_reserved() == size_class(1000)


def test_request_of_another_class_gets_a_new_block():
    alloc = BytesAllocator(64 * MiB)
    small = alloc.allocate(1000)
    block = small.block
    del small
    big = alloc.allocate(5000)
    assert big.block is not block
    assert alloc.made == [size_class(1000), size_class(5000)]
    assert alloc.memory_stats()["num_cache_hits"] == 0
    assert alloc.memory_reserved() == size_class(1000) + size_class(5000)


def test_current_and_peak_statistics_follow_allocations_and_reset():
    alloc = BytesAllocator(64 * MiB)
    a = alloc.allocate(1 * KiB)
    b = alloc.allocate(4 * KiB)
    both = size_class(KiB) + size_class(4 * KiB)
    assert alloc.memory_allocated() == both
    assert alloc.max_memory_allocated() == both

    del b
    assert alloc.memory_allocated() == size_class(KiB)
    assert alloc.max_memory_allocated() == both
    assert alloc.max_memory_reserved() == both

    alloc.reset_peak_stats()
    assert alloc.max_memory_allocated() == size_class(KiB)
    assert alloc.max_memory_reserved() == alloc.memory_reserved() == both  # b's block is cached

    stats = alloc.memory_stats()
    assert stats["num_allocations"] == 2
    assert stats["num_frees"] == 1
    assert stats["allocated_bytes.peak"] == size_class(KiB)
    assert stats["cached_bytes.current"] == size_class(4 * KiB)
    assert stats["reserved_bytes.current"] == stats["allocated_bytes.current"] + stats["cached_bytes.current"]
    assert stats["capacity_bytes"] == 64 * MiB
    del a


def test_empty_cache_gives_back_cached_blocks_and_keeps_live_ones():
    alloc = BytesAllocator(64 * MiB)
    live = alloc.allocate(2 * KiB)
    live.block[:3] = b"abc"
    dead = [alloc.allocate(n) for n in (1 * KiB, 8 * KiB, 100 * KiB)]
    del dead
    assert alloc.memory_reserved() > alloc.memory_allocated()

    alloc.empty_cache()
    assert sorted(alloc.freed) == sorted(size_class(n) for n in (1 * KiB, 8 * KiB, 100 * KiB))
    assert alloc.memory_reserved() == alloc.memory_allocated() == size_class(2 * KiB)
    assert bytes(live.block[:3]) == b"abc"

    again = alloc.allocate(1 * KiB)  # the cache is empty: a fresh block
    assert alloc.made[-1] == size_class(1 * KiB)
    assert alloc.memory_stats()["num_cache_hits"] == 0
    del again


def test_frees_beyond_the_cache_limit_go_straight_back_to_the_backend():
    alloc = BytesAllocator(64 * MiB, max_cached=10 * KiB)
    bufs = [alloc.allocate(4 * KiB) for _ in range(4)]
    del bufs
    assert alloc.memory_stats()["cached_bytes.current"] == 8 * KiB  # two fit under the limit
    assert alloc.freed == [4 * KiB, 4 * KiB]
    assert alloc.memory_reserved() == 8 * KiB


def test_default_cache_limit_is_a_quarter_of_capacity():
    alloc = BytesAllocator(8 * MiB)
    bufs = [alloc.allocate(MiB) for _ in range(5)]
    del bufs
    assert alloc.memory_stats()["cached_bytes.current"] == 2 * MiB
    assert len(alloc.freed) == 3


def test_request_beyond_capacity_raises_oom_and_changes_nothing():
    alloc = BytesAllocator(4 * MiB)
    held = alloc.allocate(3 * MiB)
    before = alloc.memory_stats()
    with pytest.raises(torch.OutOfMemoryError) as info:
        alloc.allocate(2 * MiB)
    message = str(info.value)
    assert "tiny:0" in message
    assert format_bytes(2 * MiB) in message  # the request
    assert format_bytes(3 * MiB) in message  # what live tensors hold
    assert format_bytes(4 * MiB) in message  # the capacity
    after = alloc.memory_stats()
    assert after["num_ooms"] == before["num_ooms"] + 1
    for key in ("allocated_bytes.current", "requested_bytes.current", "reserved_bytes.current"):
        assert after[key] == before[key]
    assert held.nbytes == 3 * MiB


def test_cached_blocks_are_dropped_before_declaring_oom():
    alloc = BytesAllocator(4 * MiB, max_cached=4 * MiB)
    cached = [alloc.allocate(MiB) for _ in range(3)]
    del cached
    assert alloc.memory_reserved() == 3 * MiB
    big = alloc.allocate(3 * MiB)  # fits only once the three cached blocks are given back
    assert alloc.freed == [MiB, MiB, MiB]
    assert alloc.memory_allocated() == alloc.memory_reserved() == 3 * MiB
    del big


def test_backend_failure_while_making_a_block_rolls_the_accounting_back():
    alloc = BytesAllocator(64 * MiB)
    alloc.fail_next = True
    with pytest.raises(MemoryError):
        alloc.allocate(10 * KiB)
    assert alloc.memory_allocated() == 0
    assert alloc.memory_reserved() == 0
    assert alloc.memory_stats()["requested_bytes.current"] == 0
    ok = alloc.allocate(10 * KiB)
    assert alloc.memory_allocated() == size_class(10 * KiB)
    del ok


class AdoptingAllocator(BytesAllocator):
    """Adopts ``bytearray`` results as blocks, the way ref adopts a kernel's fresh tensor."""

    def _block_from_array(self, array):
        return (array, len(array)) if isinstance(array, bytearray) else None


def test_adopted_results_count_against_capacity_and_bypass_the_cache():
    alloc = AdoptingAllocator(64 * MiB)
    assert alloc.adopt("not adoptable") is None
    result = bytearray(4 * KiB)  # exactly a size class
    buf = alloc.adopt(result)
    assert buf.block is result
    assert alloc.made == []  # no copy, no new block
    assert alloc.memory_allocated() == 4 * KiB
    del buf
    assert alloc.memory_allocated() == alloc.memory_reserved() == 0
    assert alloc.freed == [4 * KiB]
    with pytest.raises(torch.OutOfMemoryError):
        alloc.adopt(bytearray(65 * MiB))
    assert alloc.memory_allocated() == 0


def test_a_refused_adoption_tells_the_backend_which_result_it_refused():
    class Listening(AdoptingAllocator):
        refused: list = []

        def _adoption_refused(self, array):
            self.refused.append(array)

    alloc = Listening(64 * MiB)
    fits = alloc.adopt(bytearray(KiB))
    assert alloc.refused == []
    too_big = bytearray(65 * MiB)
    with pytest.raises(torch.OutOfMemoryError):
        alloc.adopt(too_big)
    assert len(alloc.refused) == 1 and alloc.refused[0] is too_big
    assert alloc.memory_allocated() == KiB
    del fits


def test_ensure_room_refuses_what_an_allocation_would_and_changes_nothing_else():
    alloc = BytesAllocator(64 * MiB)
    held = alloc.allocate(32 * MiB)
    alloc.ensure_room(32 * MiB)  # fits exactly: nothing happens
    assert alloc.memory_stats()["num_ooms"] == 0
    with pytest.raises(torch.OutOfMemoryError, match="tiny:0 out of memory: tried to allocate 32.00 MiB"):
        alloc.ensure_room(32 * MiB + 1)
    assert alloc.memory_stats()["num_ooms"] == 1
    assert alloc.memory_allocated() == 32 * MiB and alloc.made == [32 * MiB]
    del held


def test_repeated_adoption_does_not_grow_reserved_memory():
    alloc = AdoptingAllocator(64 * MiB)
    for _ in range(200):
        scratch = alloc.allocate(4 * KiB)  # reuses one cached block after the first round
        result = alloc.adopt(bytearray(4 * KiB))
        del scratch, result
    assert alloc.memory_allocated() == 0
    assert alloc.memory_reserved() == 4 * KiB
    assert alloc.made == [4 * KiB]


def _cuda_stat(stats, name):
    return tuple(stats[f"{name}.all.{metric}"] for metric in ("current", "peak", "allocated", "freed"))


def test_cuda_shaped_statistics_follow_what_the_backend_was_asked_for():
    alloc = AdoptingAllocator(8 * MiB, max_cached=64 * KiB)
    rng = random.Random(11)
    live: list = []
    handed = asked = dropped_bytes = dropped_asked = buffers = adopted = adopted_bytes = 0
    peak_bytes = peak_asked = peak_live = peak_segments = 0
    for _ in range(600):
        roll = rng.random()
        if live and roll < 0.4:
            buf = live.pop(rng.randrange(len(live)))
            dropped_bytes += buf.block_bytes
            dropped_asked += buf.nbytes
            del buf
        elif roll < 0.42:
            alloc.empty_cache()
        else:
            n = rng.choice([1, 700, 4 * KiB, 20 * KiB, 300 * KiB])
            if roll < 0.6:
                buf = alloc.adopt(bytearray(n))
                adopted, adopted_bytes = adopted + 1, adopted_bytes + n
            else:
                buf = alloc.allocate(n)
            live.append(buf)
            buffers += 1
            handed += buf.block_bytes
            asked += buf.nbytes
        segments = len(alloc.made) + adopted - len(alloc.freed)
        peak_bytes = max(peak_bytes, handed - dropped_bytes)
        peak_asked = max(peak_asked, asked - dropped_asked)
        peak_live = max(peak_live, len(live))
        peak_segments = max(peak_segments, segments)
    stats = alloc.memory_stats()
    assert _cuda_stat(stats, "allocated_bytes") == (handed - dropped_bytes, peak_bytes, handed, dropped_bytes)
    assert _cuda_stat(stats, "active_bytes") == _cuda_stat(stats, "allocated_bytes")
    assert _cuda_stat(stats, "requested_bytes") == (asked - dropped_asked, peak_asked, asked, dropped_asked)
    assert _cuda_stat(stats, "allocation") == (len(live), peak_live, buffers, buffers - len(live))
    assert _cuda_stat(stats, "segment") == (segments, peak_segments, len(alloc.made) + adopted, len(alloc.freed))
    taken = sum(alloc.made) + adopted_bytes
    assert _cuda_stat(stats, "reserved_bytes")[2:] == (taken, sum(alloc.freed))
    assert stats["reserved_bytes.all.current"] == taken - sum(alloc.freed) == alloc.memory_reserved()
    assert (stats["num_device_alloc"], stats["num_device_free"]) == (len(alloc.made) + adopted, len(alloc.freed))
    assert stats["num_alloc_retries"] == stats["num_ooms"] == 0

    alloc.reset_peak_stats()
    stats = alloc.memory_stats()
    for name in ("allocated_bytes", "requested_bytes", "reserved_bytes", "allocation", "segment", "active"):
        current, peak, _, _ = _cuda_stat(stats, name)
        assert peak == current, name
    del live


def test_a_request_that_fits_once_the_cache_is_given_back_counts_one_alloc_retry():
    alloc = BytesAllocator(4 * MiB, max_cached=4 * MiB)
    cached = [alloc.allocate(MiB) for _ in range(3)]
    del cached
    assert alloc.memory_stats()["num_alloc_retries"] == 0
    big = alloc.allocate(3 * MiB)
    stats = alloc.memory_stats()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (1, 0)
    assert stats["num_device_free"] == 3 and stats["segment.all.current"] == 1
    with pytest.raises(torch.OutOfMemoryError):  # nothing cached to give back: no retry, an OOM
        alloc.allocate(2 * MiB)
    stats = alloc.memory_stats()
    assert (stats["num_alloc_retries"], stats["num_ooms"]) == (1, 1)
    del big


def test_a_backend_failure_leaves_no_trace_in_the_cuda_shaped_statistics():
    alloc = BytesAllocator(64 * MiB)
    before = alloc.memory_stats()
    alloc.fail_next = True
    with pytest.raises(MemoryError):
        alloc.allocate(10 * KiB)
    after = alloc.memory_stats()
    for name in ("allocated_bytes", "requested_bytes", "reserved_bytes", "allocation", "segment"):
        current, _, up, down = _cuda_stat(after, name)
        assert (current, up, down) == (0, 0, 0), name
    assert after["num_device_alloc"] == before["num_device_alloc"] == 0


def _spans_overlap(buffers) -> bool:
    spans = sorted((b.address, b.address + b.nbytes) for b in buffers if b.nbytes)
    return any(end > start for (_, end), (start, _) in zip(spans, spans[1:]))


def test_live_buffers_have_distinct_aligned_non_overlapping_addresses():
    alloc = AdoptingAllocator(64 * MiB)
    rng = random.Random(5)
    live = []
    for step in range(400):
        if live and rng.random() < 0.4:
            live.pop(rng.randrange(len(live)))
        elif rng.random() < 0.3:
            live.append(alloc.adopt(bytearray(rng.randrange(1, 3000))))
        else:
            live.append(alloc.allocate(rng.choice([1, 100, 512, 513, 4000, MiB + 3])))
        assert not _spans_overlap(live), f"overlapping device addresses at step {step}"
    assert all(b.address and b.address % 512 == 0 for b in live)
    assert len({b.address for b in live}) == len(live)


def test_addresses_lie_where_no_host_pointer_can():
    # Non-canonical on x86-64 (bits 63..47 differ); above any user address on arm64 once its
    # loads drop the top byte.
    address = BytesAllocator(MiB).allocate(8).address
    assert address < 1 << 63  # a positive int64, as PyTorch's data pointers are
    assert (address >> 47) not in (0, (1 << 17) - 1)
    assert (address & ((1 << 56) - 1)) >= 1 << 52


def test_an_empty_buffer_has_no_address_like_an_empty_cpu_storage():
    assert torch.empty(0).untyped_storage().data_ptr() == 0
    assert BytesAllocator(MiB).allocate(0).address == 0


def test_a_freed_address_is_reused_and_a_failed_request_keeps_none():
    alloc = BytesAllocator(4 * MiB, max_cached=0)
    first = alloc.allocate(3 * MiB)
    address = first.address
    del first
    filler = alloc.allocate(2 * MiB)
    for _ in range(20):
        with pytest.raises(torch.OutOfMemoryError):
            alloc.allocate(3 * MiB)
    del filler
    alloc.fail_next = True
    with pytest.raises(MemoryError):
        alloc.allocate(3 * MiB)
    # Neither the out-of-memory requests nor the backend's failure kept the freed address.
    assert alloc.allocate(3 * MiB).address == address


def test_negative_requests_and_capacities_are_refused():
    with pytest.raises(ValueError, match="capacity"):
        BytesAllocator(0)
    alloc = BytesAllocator(MiB)
    with pytest.raises(ValueError, match="negative"):
        alloc.allocate(-1)


@pytest.mark.parametrize("books", ["python", "native"])
def test_a_buffer_freed_by_garbage_collection_inside_the_allocator_does_not_deadlock(books):
    # A device tensor caught in a reference cycle is freed whenever the garbage collector runs,
    # which can be in the middle of the allocator's own bookkeeping (with native books, a C
    # release inside Python's bookkeeping, under the same reentrant lock). With the collector
    # made eager, that happens on nearly every call; the loop must finish with every byte back.
    if books == "native":
        _load_native()
    code = f"""
        import gc
        import torch
        from accelkit import _native
        from accelkit.sdk import DeviceAllocator

        class A(DeviceAllocator):
            def _alloc_block(self, n):
                return bytearray(n)

            def _block_from_array(self, array):
                return array, len(array)

        alloc = A("tiny:0", 1 << 20)
        if {books == "native"}:
            alloc._use_native_books(_native.load())

        class Holder:
            pass

        gc.set_threshold(1)
        for i in range(2000):
            h = Holder()
            h.me = h
            h.adopted = alloc.adopt(bytearray(100))
            h.allocated = alloc.allocate(100)
            del h
            shift = [[] for _ in range(i % 4)]  # move where the next collection falls
            alloc.empty_cache()
            for request in (alloc.allocate, lambda n: alloc.adopt(bytearray(n))):
                try:
                    request(2 << 20)
                except torch.OutOfMemoryError:
                    pass
        gc.set_threshold(700)
        gc.collect()
        print("allocated", alloc.memory_allocated(), "frees", alloc.memory_stats()["num_frees"],
              type(alloc._books).__module__)
    """
    try:
        result = run_python(code, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the allocator deadlocked when the garbage collector freed a buffer inside it")
    assert result.returncode == 0, result.stderr
    books_module = "accelkit._native" if books == "native" else "accelkit.sdk._allocator"
    assert f"allocated 0 frees 4000 {books_module}" in result.stdout


# ---------------------------------------------------------------------------------------------
# the books in C (accelkit/_native/books.cpp)
# ---------------------------------------------------------------------------------------------


class PlainAdopter(DeviceAllocator):
    """Adopts ``bytearray`` results and drops nothing itself, as tpu: with native books, adopting
    and releasing a result both take the C path."""

    def _alloc_block(self, nbytes: int) -> bytearray:
        return bytearray(nbytes)

    def _block_from_array(self, array):
        return (array, len(array)) if isinstance(array, bytearray) else None


def _native_books(alloc: DeviceAllocator) -> DeviceAllocator:
    alloc._use_native_books(_load_native())
    return alloc


def _load_native():
    from accelkit import _native

    try:
        return _native.load()
    except _native.NativeUnavailableError as error:  # ACCELKIT_NATIVE=off: nothing native to test
        pytest.skip(str(error))


ALLOCATOR_KINDS = {
    "released-in-c": lambda capacity: PlainAdopter("tiny:0", capacity),
    "caches-nothing": lambda capacity: PlainAdopter("tiny:0", capacity, max_cached=0),  # allocates in C too
    "backend-frees": lambda capacity: AdoptingAllocator(capacity, max_cached=64 * KiB),
}


@pytest.mark.parametrize("kind", ALLOCATOR_KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_native_books_keep_the_figures_and_addresses_python_books_keep(kind, seed):
    rng = random.Random(seed)
    capacity = 256 * KiB
    python = ALLOCATOR_KINDS[kind](capacity)
    native = _native_books(ALLOCATOR_KINDS[kind](capacity))
    live: list[tuple] = []
    adopted_natively = 0
    for step in range(400):
        action = rng.random()
        size = rng.choice([0, 1, 100, 512, 4 * KiB, 5000, 70 * KiB, 300 * KiB])
        if action < 0.45 or not live:
            outcomes = []
            for alloc in (python, native):
                try:
                    outcomes.append(alloc.adopt(bytearray(size)) if action < 0.3 else alloc.allocate(size))
                except torch.OutOfMemoryError as error:
                    outcomes.append(str(error))
            if isinstance(outcomes[0], str):
                assert outcomes[0] == outcomes[1], step
            else:
                live.append(tuple(outcomes))
                assert type(outcomes[1]).__module__ == "accelkit._native"  # the C Buffer
                adopted_natively += not outcomes[1].cacheable
        elif action < 0.95:
            live.pop(rng.randrange(len(live)))
        else:
            python.empty_cache()
            native.empty_cache()
        assert native.memory_stats() == python.memory_stats(), step
        assert [b.address for _, b in live] == [b.address for b, _ in live], step
    assert adopted_natively > 50
    live.clear()
    outcomes.clear()  # the last step's pair
    assert native.memory_stats() == python.memory_stats()
    assert native.memory_allocated() == 0


def test_a_native_buffer_has_the_python_buffers_attributes_and_releases_once():
    alloc = _native_books(PlainAdopter("tiny:0", MiB))
    result = bytearray(4 * KiB)
    buf = alloc.adopt(result)
    assert (buf.block is result, buf.nbytes, buf.block_bytes, buf.cacheable) == (True, 4 * KiB, 4 * KiB, False)
    assert buf._allocator is alloc and buf.address % 512 == 0 and "tiny:0" in repr(buf)
    assert alloc.memory_stats()["num_allocations"] == 1
    del buf
    stats = alloc.memory_stats()
    assert (stats["num_frees"], stats["num_device_free"], alloc.memory_allocated()) == (1, 1, 0)


def test_native_adopt_is_the_allocators_adopt_unless_the_backend_has_its_own():
    assert PlainAdopter("tiny:0", MiB).adopt.__func__ is DeviceAllocator.adopt
    assert _native_books(PlainAdopter("tiny:0", MiB)).adopt.__func__ is _load_native().adopt

    class OwnAdopt(PlainAdopter):
        def adopt(self, array):
            self.seen = array
            return super().adopt(array)

    own = _native_books(OwnAdopt("tiny:0", MiB))
    result = bytearray(100)
    buf = own.adopt(result)
    assert own.seen is result and buf.block is result  # its own adopt ran, and the books counted
    assert own.memory_allocated() == 100


def test_native_allocate_is_the_allocators_allocate_only_when_it_caches_nothing():
    native = _load_native()
    assert _native_books(PlainAdopter("tiny:0", MiB, max_cached=0)).allocate.__func__ is native.allocate
    assert _native_books(PlainAdopter("tiny:0", MiB)).allocate.__func__ is DeviceAllocator.allocate

    class OwnAllocate(PlainAdopter):
        def allocate(self, nbytes):
            self.seen = nbytes
            return super().allocate(nbytes)

    own = _native_books(OwnAllocate("tiny:0", MiB, max_cached=0))
    assert own.allocate(64).nbytes == 64 and own.seen == 64


def test_native_allocate_gives_everything_back_when_the_backend_fails_and_keeps_its_error():
    class Failing(PlainAdopter):
        def _alloc_block(self, nbytes):
            raise MemoryError(f"the backend has no {nbytes} bytes")

    alloc = _native_books(Failing("tiny:0", MiB, max_cached=0))
    first = _native_books(PlainAdopter("tiny:0", MiB, max_cached=0)).allocate(4 * KiB)
    before = alloc.memory_stats()
    with pytest.raises(MemoryError, match="no 4096 bytes"):
        alloc.allocate(4 * KiB)
    after = alloc.memory_stats()
    peaks = {k for k in after if ".peak" in k}
    assert {k: v for k, v in after.items() if k not in peaks} == {k: v for k, v in before.items() if k not in peaks}
    alloc._alloc_block = lambda nbytes: bytearray(nbytes)  # the backend recovers
    assert alloc.allocate(4 * KiB).address == first.address  # the address went back too
    with pytest.raises(ValueError, match="negative size"):
        alloc.allocate(-1)  # the Python path's own errors


def test_native_adopt_names_a_backend_hook_that_returns_the_wrong_thing():
    class Broken(PlainAdopter):
        def _block_from_array(self, array):
            return array  # not (block, nbytes)

    alloc = _native_books(Broken("tiny:0", MiB))
    with pytest.raises(TypeError, match="_block_from_array must return"):
        alloc.adopt(bytearray(8))
    assert alloc.memory_stats()["num_allocations"] == 0  # nothing counted


# ---------------------------------------------------------------------------------------------
# the ref device
# ---------------------------------------------------------------------------------------------


def _capacity() -> int:
    return torch.ref.get_device_properties().total_memory


def test_device_capacity_is_the_configured_ref_memory():
    assert _capacity() == parse_bytes(os.environ["ACCELKIT_REF_MEMORY"])
    assert torch.ref.memory_stats()["capacity_bytes"] == _capacity()


def test_nothing_reads_or_writes_through_a_device_address():
    # A device storage's data pointer is an address with no memory behind it. Every PyTorch
    # path that would use it as host memory must either work from the payload or raise; a
    # fresh interpreter, so that a regression shows as a crash of this test only.
    code = """
        import io, pickle
        import numpy as np
        import torch, accelkit
        d = accelkit.select_device("ref")
        x = torch.arange(6.0, device=d)
        storage = x.untyped_storage()

        def outcome(f):
            try:
                f()
            except Exception as e:
                return type(e).__name__ + ": " + str(e).splitlines()[0]
            return "ok"

        fresh = storage.new()
        print("new", fresh.device, fresh.nbytes())
        host = torch.arange(6.0)
        storage.byteswap(torch.float32); host.untyped_storage().byteswap(torch.float32)
        print("byteswap", torch.equal(x.cpu().view(torch.int32), host.view(torch.int32)))
        storage.byteswap(torch.float32)
        storage.fill_(0); print("fill", x.cpu().tolist())
        x.copy_(torch.arange(6.0))
        expected = torch.arange(6.0).untyped_storage()
        print("item", [storage[i] for i in range(4, 8)] == [expected[i] for i in range(4, 8)], x.tolist())
        print("numpy", outcome(lambda: x.numpy()))
        print("asarray", outcome(lambda: np.asarray(x)))
        print("np.from_dlpack", outcome(lambda: np.from_dlpack(x)))
        print("dlpack", outcome(lambda: torch.from_dlpack(torch.utils.dlpack.to_dlpack(x)) + 1))
        print("pickle", outcome(lambda: pickle.dumps(x)))
        print("legacy", outcome(lambda: torch.save(x, io.BytesIO(), _use_new_zipfile_serialization=False)))
        print("resize", outcome(lambda: storage.resize_(100)), storage.nbytes())
        print("pin", outcome(lambda: x.pin_memory()))
        print("still", x.tolist(), (x + 1).sum().item())
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert out["new"] == "ref:0 0"
    assert out["byteswap"] == "True"
    assert out["fill"] == "[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]"
    assert out["item"] == "True [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]"  # the bytes of 1.0, as on the CPU
    assert out["numpy"].startswith("TypeError: can't convert ref:0 device type tensor to numpy")
    assert out["asarray"].startswith("TypeError")
    assert out["np.from_dlpack"].startswith("RuntimeError: Unsupported device")
    for rebuilt in ("dlpack", "pickle", "legacy"):  # tensors rebuilt over the bare address
        assert out[rebuilt].startswith("RuntimeError: a ref:0 tensor without device memory"), out[rebuilt]
    assert out["resize"] == "ok 100"  # as a CPU storage: a new buffer keeping the first bytes
    assert out["pin"].startswith("RuntimeError: cannot pin")
    assert out["still"] == "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0] 21.0"


def test_memory_allocated_grows_with_a_tensor_and_shrinks_when_it_goes(dev):
    base = torch.ref.memory_allocated()
    x = torch.empty(1000, device=dev)
    assert torch.ref.memory_allocated() - base == size_class(x.nbytes)
    y = torch.empty(3, 1 << 18, device=dev)
    assert torch.ref.memory_allocated() - base == size_class(x.nbytes) + size_class(y.nbytes)
    del x
    assert torch.ref.memory_allocated() - base == size_class(y.nbytes)
    del y
    assert torch.ref.memory_allocated() == base


def test_views_share_memory_and_keep_it_alive(dev):
    x = torch.empty(64, 64, device=dev)
    with_x = torch.ref.memory_allocated()
    views = [x.t(), x[3:], x.view(-1), x[:, 1], x.view(torch.int32)]
    assert torch.ref.memory_allocated() == with_x
    del x
    assert torch.ref.memory_allocated() == with_x  # the views still hold the storage
    del views
    assert torch.ref.memory_allocated() == with_x - size_class(64 * 64 * 4)


def test_op_results_count_against_device_memory_until_freed(dev):
    x = torch.ones(300, 300, device=dev)
    base = torch.ref.memory_allocated()
    y = x * 2  # a native kernel
    z = torch.cumsum(x, 0)  # the CPU fallback
    assert torch.ref.memory_allocated() - base >= y.nbytes + z.nbytes
    torch.testing.assert_close(z.cpu(), torch.cumsum(x.cpu(), 0))
    del y, z
    assert torch.ref.memory_allocated() == base


def test_kernel_result_of_odd_byte_size_can_be_reinterpreted_as_a_wider_dtype(dev):
    # A kernel's result is adopted with its exact byte size (6 here), not a padded size class.
    cpu = torch.arange(6, dtype=torch.uint8) + 1
    x = torch.arange(6, dtype=torch.uint8, device=dev) + 1
    assert torch.equal(x[:4].view(torch.int32).cpu(), cpu[:4].view(torch.int32))
    assert torch.equal(x[2:].view(torch.int16).cpu(), cpu[2:].view(torch.int16))


def test_peak_memory_and_reset_peak_memory_stats(dev):
    torch.ref.reset_peak_memory_stats()
    base = torch.ref.memory_allocated()
    assert torch.ref.max_memory_allocated() == base
    temp = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    del temp
    assert torch.ref.memory_allocated() == base
    assert torch.ref.max_memory_allocated() == base + size_class(8 * MiB)
    assert torch.ref.max_memory_reserved() >= base + size_class(8 * MiB)
    torch.ref.reset_peak_memory_stats()
    assert torch.ref.max_memory_allocated() == base
    assert torch.ref.max_memory_reserved() == torch.ref.memory_reserved()


def test_memory_stats_agree_with_the_module_functions(dev):
    x = torch.empty(5000, device=dev)
    stats = torch.ref.memory_stats()
    assert stats["allocated_bytes.current"] == torch.ref.memory_allocated()
    assert stats["reserved_bytes.current"] == torch.ref.memory_reserved()
    assert stats["allocated_bytes.peak"] == torch.ref.max_memory_allocated()
    free, total = torch.ref.mem_get_info()
    assert total == _capacity()
    assert free == total - torch.ref.memory_reserved()
    del x


def test_empty_cache_returns_cached_device_memory(dev):
    x = torch.empty(2 * MiB, dtype=torch.uint8, device=dev)
    del x
    assert torch.ref.memory_reserved() > torch.ref.memory_allocated()
    torch.ref.empty_cache()
    assert torch.ref.memory_reserved() == torch.ref.memory_allocated()


def test_allocation_beyond_capacity_raises_oom_naming_device_request_use_and_capacity(dev):
    capacity = _capacity()
    held = torch.empty(capacity // 4, dtype=torch.uint8, device=dev)
    in_use = torch.ref.memory_allocated()
    request = capacity - capacity // 8  # fits the empty device, not beside `held`
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(request, dtype=torch.uint8, device=dev)
    message = str(info.value)
    assert "ref:0" in message
    assert format_bytes(request) in message
    assert format_bytes(in_use) in message
    assert format_bytes(capacity) in message
    assert torch.ref.memory_allocated() == in_use
    del held


def test_request_larger_than_the_whole_device_raises_oom(dev):
    base = torch.ref.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError, match="ref:0"):
        torch.zeros(_capacity() // 4 + 1, device=dev)  # one float32 more than the device holds
    assert torch.ref.memory_allocated() == base


def test_nothing_leaks_when_an_op_runs_out_of_memory_midway(dev):
    base = torch.ref.memory_allocated()
    n = int(_capacity() * 0.4) // 4  # float32 elements filling 40% of the device
    a = torch.ones(n, device=dev)
    b = a + 1
    held = torch.ref.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError):
        a * 2  # native kernel: the result cannot be placed
    assert torch.ref.memory_allocated() == held
    with pytest.raises(torch.OutOfMemoryError):
        torch.cumsum(a, 0)  # CPU fallback: the result cannot be brought back
    assert torch.ref.memory_allocated() == held
    with pytest.raises(torch.OutOfMemoryError):
        torch.stack([a, b])
    assert torch.ref.memory_allocated() == held
    del a, b
    assert torch.ref.memory_allocated() == base
    small = torch.ones(10, device=dev) * 3  # the device still works
    assert small.cpu().tolist() == [3.0] * 10


def test_allocation_loop_keeps_reserved_memory_bounded(dev):
    # Element counts: some sizes fall on a size class exactly (1024, 4096, 65536 floats), some not.
    counts = [1000, 1024, 3000, 4096, 20_000, 65_536]
    rng = random.Random(0)
    base_allocated = torch.ref.memory_allocated()
    base_reserved = torch.ref.memory_reserved()
    live: list[torch.Tensor] = []
    for _ in range(3000):
        n = rng.choice(counts)
        x = torch.empty(n, device=dev)
        x.fill_(1.0)
        y = x * 2  # a kernel result of the same size
        live.append(y)
        if len(live) > 2:
            live.pop(0)
        del x, y
    del live
    assert torch.ref.memory_allocated() == base_allocated
    # At most four buffers of one size are alive at once (x, y and two kept results), so no
    # size needs more than four blocks, whatever the number of iterations.
    bound = 4 * sum(size_class(4 * n) for n in counts)
    assert torch.ref.memory_reserved() - base_reserved <= bound


def _ints(d):
    return torch.arange(4, device=d)


def _floats(d):
    return torch.arange(4.0, device=d)


def _matrix(d):
    return torch.arange(6.0, device=d).reshape(2, 3)


def _ones(t, *shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device=t.device)


@pytest.mark.parametrize(
    ("make", "op"),
    [
        pytest.param(_ints, lambda t: t.add_(1.5), id="int-add-float-scalar"),
        pytest.param(_ints, lambda t: t.add_(_ones(t, 4) / 2), id="int-add-float-tensor"),
        pytest.param(_ints, lambda t: t.div_(3), id="int-true-div"),
        pytest.param(_ints, lambda t: t.exp_(), id="int-exp"),
        pytest.param(_ints, lambda t: t.clamp_(min=_ones(t, ()) / 2), id="int-clamp-float"),
        pytest.param(_floats, lambda t: t.add_(_ones(t, 3)), id="shape-mismatch"),
        pytest.param(_floats, lambda t: t.add_(_ones(t, 2, 4)), id="broadcast-beyond-self"),
        pytest.param(_matrix, lambda t: t.mul_(_ones(t, 4, 3)), id="mul-shape-mismatch"),
        pytest.param(_matrix, lambda t: t.copy_(_ones(t, 4)), id="copy-shape-mismatch"),
        pytest.param(_floats, lambda t: t.addcmul_(_ones(t, 2, 4), _ones(t, 2, 4)),
                     id="addcmul-broadcast-beyond-self"),
        pytest.param(_floats, lambda t: t.masked_fill_(_ones(t, 2, 4, dtype=torch.bool), 0.0),
                     id="masked-fill-broadcast-beyond-self"),
        pytest.param(_floats, lambda t: t.add_(_ones(t, 4, dtype=torch.complex64)), id="float-add-complex"),
        pytest.param(lambda d: torch.ones(4, dtype=torch.bool, device=d),
                     lambda t: t.sub_(_ones(t, 4, dtype=torch.bool)), id="bool-sub"),
    ],
)
def test_failed_inplace_op_raises_like_cpu_and_leaves_the_tensor_unchanged(dev, make, op):
    cpu = make("cpu")
    with pytest.raises(RuntimeError) as on_cpu:
        op(cpu)
    t = make(dev)
    alias = t.view(-1)
    before = t.cpu()
    allocated = torch.ref.memory_allocated()
    with pytest.raises(type(on_cpu.value)) as on_device:
        op(t)
    assert str(on_device.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]
    assert torch.equal(t.cpu(), before)
    assert torch.equal(alias.cpu(), before.view(-1))
    assert t.shape == before.shape
    del on_device
    assert torch.ref.memory_allocated() == allocated
