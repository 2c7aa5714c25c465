"""What a compiled program keeps on chip (``sim/residency.py``): intermediates and reloads stay in
SBUF while they fit, whatever crosses the program's boundary still moves through HBM, and the
numerics are the same either way. Programs here are built on the core directly, as the graph
lowering builds them."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

import accelkit
from accelkit_backends.neuron.device import core_spec
from accelkit_backends.neuron.sim import NeuronCore
from accelkit_backends.neuron.tiling import map_flat


def _copy(k, out, x):
    map_flat(k, out, [x], lambda dst, srcs: k.tensor_copy(dst, srcs[0]))


def _estimate(core, body, boundary) -> tuple[int, float, int]:
    """Run ``body(core)`` as one program (naming its boundary or not): its HBM bytes,
    estimated device seconds and bytes kept on chip."""
    records = []
    core.program_listeners.append(lambda label, rs: records.extend(rs))
    with core.program("p") as program:
        named = body(core)
        if boundary:
            program.boundary = named
    return (sum(r.hbm_bytes for r in records), sum(r.device_seconds for r in records),
            sum(r.kept_bytes for r in records))


def _hbm_bytes(core, body, boundary) -> int:
    return _estimate(core, body, boundary)[0]


def _through_an_intermediate(core, peaks=None):
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    mid, out = np.empty_like(x), np.empty_like(x)
    for name, src, dst in (("first", x, mid), ("second", mid, out)):
        with core.kernel(name) as k:
            _copy(k, dst, src)
        if peaks is not None:
            peaks.append(k.sbuf_peak)
    np.testing.assert_array_equal(out, x)  # the numerics run against HBM either way
    return [x, out]


def test_an_intermediate_of_a_program_stays_in_sbuf():
    nbytes = 128 * 64 * 4
    through_hbm, slow, none_kept = _estimate(NeuronCore(core_spec("trn2")), _through_an_intermediate, boundary=False)
    on_chip, fast, kept = _estimate(NeuronCore(core_spec("trn2")), _through_an_intermediate, boundary=True)
    assert (through_hbm, none_kept) == (4 * nbytes, 0)
    assert kept == 2 * nbytes  # its store and its load
    # x in and out out; the intermediate is neither stored nor loaded from HBM. Its store is
    # no transfer at all, and its load reads the stored block in place (the next test).
    assert on_chip == 2 * nbytes
    assert fast < slow


def _intermediate_dmas(read_as) -> list:
    """The second kernel's loads of an intermediate the first stored, read as ``read_as(mid)``."""
    core = NeuronCore(core_spec("trn2"))
    core.record_instructions = True
    loads = []
    core.listeners.append(lambda record, log: loads.extend(
        i for i in log if record.name == "second" and i.engine == "dma" and i.detail != "kept in SBUF"))
    x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    mid = np.empty_like(x)
    out = np.empty(read_as(mid).shape, mid.dtype)
    with core.program("p") as program:
        with core.kernel("first") as k:
            _copy(k, mid, x)
        with core.kernel("second") as k:
            _copy(k, out, read_as(mid))
        program.boundary = [x, out]
    np.testing.assert_array_equal(out, read_as(x))
    return [i for i in loads if i.name == "dma" and i.end >= i.start]


def test_a_block_loaded_as_it_was_stored_is_read_in_place_and_another_layout_is_copied():
    """The consumer reads the producer's tile when it wants the same elements on the same
    partitions (the same block of bytes, shape and strides); another layout of the same bytes
    needs an SBUF-to-SBUF copy, which takes time."""
    same = _intermediate_dmas(lambda mid: mid)
    assert same and all(i.detail == "read in place" and i.end == i.start for i in same[:1])
    other = _intermediate_dmas(lambda mid: mid.T)
    assert other and not any(i.detail == "read in place" for i in other)
    assert all(i.end > i.start for i in other if "B" in i.detail)


def test_an_intermediate_that_does_not_fit_sbuf_goes_through_hbm():
    spec = core_spec("trn2")
    peaks = []
    _hbm_bytes(NeuronCore(spec), lambda core: _through_an_intermediate(core, peaks), boundary=True)
    # The intermediate takes 256 B in each partition next to the copies' own tiles.
    fits = dataclasses.replace(spec, sbuf_partition_bytes=max(peaks) + 256)
    short = dataclasses.replace(spec, sbuf_partition_bytes=max(peaks) + 255)
    nbytes = 128 * 64 * 4
    assert _hbm_bytes(NeuronCore(fits), _through_an_intermediate, boundary=True) == 2 * nbytes
    assert _hbm_bytes(NeuronCore(short), _through_an_intermediate, boundary=True) == 4 * nbytes


def test_an_input_read_again_is_loaded_once_and_results_are_all_stored():
    def body(core):
        x = np.ones((128, 32), np.float32)
        a, b = np.empty_like(x), np.empty_like(x)
        with core.kernel("first") as k:
            _copy(k, a, x)
        with core.kernel("second") as k:
            _copy(k, b, x)
        return [x, a, b]

    nbytes = 128 * 32 * 4
    assert _hbm_bytes(NeuronCore(core_spec("trn2")), body, boundary=True) == 3 * nbytes


def test_an_input_read_in_halves_and_then_whole_is_loaded_once():
    def body(core):
        x = np.ones((128, 64), np.float32)
        top, bottom, whole = np.empty((64, 64), np.float32), np.empty((64, 64), np.float32), np.empty_like(x)
        for name, src, dst in (("top", x[:64], top), ("bottom", x[64:], bottom), ("whole", x, whole)):
            with core.kernel(name) as k:
                _copy(k, dst, src)
        return [x, top, bottom, whole]

    nbytes = 128 * 64 * 4
    assert _hbm_bytes(NeuronCore(core_spec("trn2")), body, boundary=True) == nbytes + 2 * nbytes  # x once; results


def test_a_strided_read_does_not_stand_for_the_bytes_it_skipped():
    def body(core):
        x = np.ones((128, 64), np.float32)
        half, whole = np.empty((128, 32), np.float32), np.empty_like(x)
        with core.kernel("every other column") as k:
            _copy(k, half, x[:, ::2])
        with core.kernel("all of it") as k:
            _copy(k, whole, x)
        return [x, half, whole]

    # Both reads of x come from HBM (the strided one walks half its bytes).
    moved = _hbm_bytes(NeuronCore(core_spec("trn2")), body, boundary=True)
    assert moved == (128 * 32 + 128 * 64) * 4 + (128 * 32 + 128 * 64) * 4


# -- through torch.compile ----------------------------------------------------------------------


def _two_matmuls(a, b, c):
    return (a @ b) @ c


def test_a_compiled_graph_keeps_the_tensor_between_two_matmuls_on_chip(dev):
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(*shape, generator=g).to(dev) for shape in ((64, 128), (128, 256), (256, 32)))
    accelkit.reset_stats()
    eager = _two_matmuls(a, b, c)
    eager_bytes = accelkit.stats()["neuron"]["estimate"]["hbm_bytes"]
    compiled_fn = torch.compile(_two_matmuls, backend="neuron")
    compiled_fn(a, b, c)
    accelkit.reset_stats()
    compiled = compiled_fn(a, b, c)
    estimate = accelkit.stats()["neuron"]["estimate"]
    compiled_bytes = estimate["hbm_bytes"]
    (program,) = estimate["per_program"].values()
    assert program["kept_bytes"] >= 2 * 64 * 256 * 4  # what stayed on chip is reported
    assert torch.equal(compiled.cpu(), eager.cpu())
    middle = 64 * 256 * 4
    boundary = sum(t.numel() * 4 for t in (a, b, c, compiled))
    # The product a @ b is neither stored nor loaded; the inputs are read and the result written.
    assert boundary <= compiled_bytes <= eager_bytes - 2 * middle
