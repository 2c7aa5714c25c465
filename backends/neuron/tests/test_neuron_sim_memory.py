"""The simulator frees the host memory of a kernel or program when it ends, without the cyclic
garbage collector: its tiles, its staged arrays and its program's intermediates are held by
nothing once their run and its record are done (a conformance worker was OOM-killed at 12-14 GB
when they were held in reference cycles, freed only at the collector's next full pass)."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from accelkit.sdk.testing.plugin import no_gc  # noqa: F401 - the fixture: the cyclic collector off
from accelkit_backends.neuron.device import core_spec
from accelkit_backends.neuron.sim import NeuronCore
from accelkit_backends.neuron.sim.replay import array_arguments, with_arrays
from accelkit_backends.neuron.tiling import map_flat


def _add(k, out: np.ndarray, x: np.ndarray, y: np.ndarray, tiles: list) -> None:
    def step(dst, srcs):
        tiles.append(weakref.ref(dst.data))
        k.tensor_tensor(dst, srcs[0], srcs[1], "add")
    map_flat(k, out, [x, y], step)


def test_a_kernels_tiles_are_freed_when_it_ends(no_gc):
    core = NeuronCore(core_spec("trn2"))
    x, y, out = np.ones(1 << 16, np.float32), np.ones(1 << 16, np.float32), np.empty(1 << 16, np.float32)
    tiles: list = []
    with core.kernel("add") as k:
        _add(k, out, x, y, tiles)
    record = k.finish()
    del k
    assert tiles and [t for t in tiles if t() is not None] == []
    assert record.hbm_bytes == 3 * x.nbytes and (out == 2).all()


def test_a_programs_tiles_and_intermediates_are_freed_when_it_ends(no_gc):
    core = NeuronCore(core_spec("trn2"))
    x = np.ones(1 << 16, np.float32)
    tiles: list = []
    with core.program(instance=("two adds",), label="p") as program:
        middle = np.empty_like(x)
        with core.kernel("add") as k:
            _add(k, middle, x, x, tiles)
        out = np.empty_like(x)
        with core.kernel("add") as k:
            _add(k, out, middle, x, tiles)
        program.boundary = [x, out]
        intermediate = weakref.ref(middle)
        del middle, k
    del program
    assert tiles and [t for t in tiles if t() is not None] == []
    assert intermediate() is None
    assert (out == 3).all()


def test_walking_a_calls_arrays_makes_no_cycle(no_gc):
    a, b = np.zeros(4), np.ones(4)
    assert [id(v) for v in array_arguments((a, [1, (b,)]), {"c": a})] == [id(a), id(b), id(a)]
    args, kwargs = with_arrays((a, [1, (b,)]), {"c": a}, [b, a, b])
    assert args[0] is b and args[1][1][0] is a and kwargs["c"] is b
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert gc.collect() == 0, [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
