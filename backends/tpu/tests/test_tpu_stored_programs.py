"""tpu's store of compiled eager programs (``ACCELKIT_COMPILE_CACHE``): a later process loads
each op's executable instead of tracing and compiling it, with the same results."""

from __future__ import annotations

import functools
import json
import os
import textwrap

import pytest
import torch

from accelkit_backends.tpu import stored_programs
from accelkit_backends.tpu.kernels import elementwise
from accelkit_backends.tpu.stored_programs import Unstable, canonical, function_identity
from conftest import run_python

# One process's work: ops with floats, views, a reduction, LAPACK routines, a device-side index
# check and a random op, each over several shapes. Prints its results and the cache counters as
# JSON.
WORKLOAD = """
    import json, torch, accelkit
    dev = accelkit.select_device("tpu")
    results = []
    for n in (1, 3, 5):
        x = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4).to(dev)
        y = (x.t() * 0.5 + 1.25).tanh().sum(1) + torch.softmax(x, -1).amax(0)
        results.append(y.cpu().tolist())
        results.append(torch.index_select(x, 0, torch.tensor([n - 1], device=dev)).cpu().tolist())
    # LAPACK custom calls: jaxlib binds their routines only when one is first lowered.
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], device=dev)
    results.append([torch.linalg.cholesky(a).cpu().tolist(), torch.linalg.svdvals(a).cpu().tolist()])
    # Device-side checks: a program loaded from the store must raise what its trace stated.
    for bad in (lambda: torch.index_select(x, 0, torch.tensor([7], device=dev)),
                lambda: torch.nn.functional.cross_entropy(x, torch.tensor([0, 1, 5, 2, 3], device=dev)),
                lambda: torch.tensor([4, 2], device=dev) // torch.tensor([2, 0], device=dev)):
        try:
            bad().cpu()
            results.append("no error")
        except Exception as error:
            results.append(f"{type(error).__name__}: {str(error).split(' (')[0]}")
    torch.manual_seed(3)
    results.append(torch.nn.functional.dropout(torch.ones(8, device=dev), 0.5).cpu().tolist())
    cache = accelkit.stats()["compile"]["persistent_cache"]
    print(json.dumps({"results": results, "cache": cache, "compiles": accelkit.stats()["compiles"]}))
"""


def _run(env: dict[str, str]) -> dict:
    done = run_python(WORKLOAD, env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_eager_program_and_computes_the_same(tmp_path):
    plain = _run({})
    assert plain["cache"] is None  # no cache directory: no store
    cold = _run({"ACCELKIT_COMPILE_CACHE": str(tmp_path)})
    warm = _run({"ACCELKIT_COMPILE_CACHE": str(tmp_path)})
    assert plain["results"][-4:-1] == [
        "IndexError: index out of range in self",
        "IndexError: Target 5 is out of bounds.",
        "RuntimeError: ZeroDivisionError",
    ]
    assert cold["results"] == plain["results"] and warm["results"] == plain["results"]
    stored = cold["cache"]["store_written"]
    assert stored > 10 and cold["cache"]["store_hits"] == 0 and cold["cache"]["store_misses"] == stored
    assert warm["cache"]["store_hits"] == stored and warm["cache"]["store_misses"] == 0
    assert warm["compiles"] == cold["compiles"]  # a program loaded counts as one compiled
    assert len(list((tmp_path / "tpu-programs").glob("*/*.xla"))) == stored


def test_programs_load_onto_the_devices_they_were_compiled_for(tmp_path):
    # Two devices per process: a program compiled for device 1, and factories (no inputs) on
    # each. Loaded onto every device, a one-device program refused to run.
    code = """
        import json, torch, accelkit
        accelkit.select_device("tpu")
        torch.get_device_module("tpu").set_device(1)
        x = torch.arange(3.0, device="tpu")
        y = x.to("tpu:0") + 1
        z = [torch.ones(2, device=f"tpu:{i}") * (i + 2) + x[:2].to(f"tpu:{i}") for i in (0, 1)]
        placed = [t.device.index for t in (x, y, *z)]
        print(json.dumps([placed, [t.cpu().tolist() for t in (y, *z)],
                          accelkit.stats()["compile"]["persistent_cache"]]))
    """
    env = {"ACCELKIT_TPU_DEVICES": "2", "ACCELKIT_COMPILE_CACHE": str(tmp_path)}
    runs = []
    for _ in range(2):
        done = run_python(code, env)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    (cold_placed, cold_values, cold), (warm_placed, warm_values, warm) = runs
    assert cold_placed == warm_placed == [1, 0, 0, 1]
    assert cold_values == warm_values == [[1.0, 2.0, 3.0], [2.0, 3.0], [3.0, 4.0]]
    assert cold["store_written"] > 3 and warm["store_hits"] == cold["store_written"] and warm["store_misses"] == 0


def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path):
    env = {"ACCELKIT_COMPILE_CACHE": str(tmp_path)}
    cold = _run(env)
    entries = sorted((tmp_path / "tpu-programs").glob("*/*.xla"))
    entries[0].write_bytes(entries[0].read_bytes()[:100])
    entries[1].write_bytes(b"")
    damaged = _run(env)
    assert damaged["results"] == cold["results"]
    assert damaged["cache"]["store_unreadable"] == 2 and damaged["cache"]["store_written"] == 2
    assert _run(env)["cache"]["store_misses"] == 0


def test_programs_jax_already_cached_are_compiled_afresh_for_the_store(tmp_path):
    # A directory jax's own cache filled first (as before the store existed): an executable jax
    # reads back from it cannot be serialized again, so the store must not take it from there.
    filled_by_jax = textwrap.dedent(f"""
        import jax
        jax.config.update("jax_compilation_cache_dir", {str(tmp_path)!r})
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    """) + textwrap.dedent(WORKLOAD)
    done = run_python(filled_by_jax)
    assert done.returncode == 0, done.stderr
    jax_entries = [p for p in tmp_path.iterdir() if p.name.endswith("-cache")]
    assert jax_entries
    env = {"ACCELKIT_COMPILE_CACHE": str(tmp_path)}
    first = _run(env)
    assert first["cache"]["store_written"] == first["cache"]["store_misses"] > 10
    second = _run(env)
    assert second["results"] == first["results"] and second["cache"]["store_misses"] == 0


def test_a_source_change_starts_a_new_directory_and_old_ones_are_pruned(tmp_path):
    root = tmp_path / "tpu-programs"
    for age, name in enumerate(["old3", "old2", "old1"]):
        (root / name).mkdir(parents=True)
        stamp = 1_000_000 + age
        os.utime(root / name, (stamp, stamp))
    _run({"ACCELKIT_COMPILE_CACHE": str(tmp_path)})
    kept = sorted(p.name for p in root.iterdir())
    assert len(kept) == stored_programs.KEPT_FINGERPRINTS
    assert "old3" not in kept and "old1" in kept and "old2" in kept


# -- naming programs exactly ---------------------------------------------------------------


def test_static_values_have_exact_text():
    assert canonical((1, True, None, 0.1, -0.0, float("nan"))) == "(1,True,None,0.1,-0.0,nan)"
    assert canonical(torch.Size([2, 3])) == canonical((2, 3))
    assert canonical(torch.float32) == "torch.float32" and canonical(float) == "float"
    assert canonical(torch.ops.aten.add.Tensor) == "op(aten.add.Tensor)"
    assert canonical(1) != canonical(1.0) and canonical(1) != canonical(True)
    with pytest.raises(Unstable):
        canonical(object())
    with pytest.raises(Unstable):
        canonical(torch.ones(2))


def test_functions_are_named_by_module_line_closure_and_bound_arguments():
    own = elementwise.operands
    name = function_identity(own)
    assert name.startswith("accelkit_backends.tpu.kernels.elementwise.")
    assert function_identity(functools.partial(own, flag=True)) != function_identity(functools.partial(own, flag=False))
    with pytest.raises(Unstable):  # a user's function: its source is not in the fingerprint
        function_identity(lambda x: x)


def test_closures_over_different_values_are_different_programs():
    import accelkit_backends.tpu.kernels as kernels

    def make(scale):
        return lambda x: x * scale

    first, second = make(2), make(3)
    first.__module__ = second.__module__ = kernels.__name__  # as if defined in the backend
    again = make(2)
    again.__module__ = kernels.__name__
    assert function_identity(first) != function_identity(second)
    assert function_identity(first) == function_identity(again)


def test_compiling_for_the_store_keeps_the_bound_on_loaded_executables(tmp_path):
    # jax's own caches hold a compiled executable as long as the function's trace lives: the
    # store lets go of them, or executables past ACCELKIT_TPU_LIVE_PROGRAMS stay loaded (each
    # maps memory regions, and a long run would end in a crash at the kernel's map limit).
    code = """
        import torch, accelkit
        dev = accelkit.select_device("tpu")
        def regions(): return len(open("/proc/self/maps").readlines())
        before = regions()
        x = torch.randn(150, 8)
        for n in range(1, 151):
            ((x[:n].to(dev) * 2.5 + 1).tanh().sum(0)).cpu()
        print(regions() - before, accelkit.stats()["tpu"]["loaded_programs"]["unloaded"])
    """
    bound = {"ACCELKIT_TPU_LIVE_PROGRAMS": "64"}
    plain = run_python(code, bound)
    stored = run_python(code, {**bound, "ACCELKIT_COMPILE_CACHE": str(tmp_path)})
    assert plain.returncode == 0 and stored.returncode == 0, plain.stderr + stored.stderr
    plain_regions, unloaded = map(int, plain.stdout.split())
    stored_regions, stored_unloaded = map(int, stored.stdout.split())
    # 150 shapes compile some 540 programs (425 unloaded at 120 shapes), 8 times the bound
    assert unloaded > 450 and stored_unloaded == unloaded
    assert stored_regions < plain_regions + 300  # not one region per program ever compiled


def test_the_store_can_be_turned_off(tmp_path):
    off = _run({"ACCELKIT_COMPILE_CACHE": str(tmp_path), stored_programs.ENABLE_ENV: "0"})
    assert "store_hits" not in off["cache"] and off["cache"]["misses"] > 10
    assert not (tmp_path / "tpu-programs").exists()


def test_a_setting_other_than_0_or_1_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(stored_programs.ENABLE_ENV, "off")  # was silently taken as on
    with pytest.raises(ValueError, match="ACCELKIT_TPU_PROGRAM_STORE='off': use one of 0, 1"):
        stored_programs.wanted()
    monkeypatch.setenv(stored_programs.ENABLE_ENV, "0")
    assert not stored_programs.wanted()
    monkeypatch.delenv(stored_programs.ENABLE_ENV)
    assert stored_programs.wanted()


def test_only_host_calls_the_store_binds_are_stored():
    import jax
    import numpy as np

    matrix = jax.numpy.eye(3)
    lapack = jax.jit(jax.numpy.linalg.cholesky).lower(matrix)
    host = jax.jit(lambda a: jax.pure_callback(np.sin, a, a)).lower(matrix)
    assert stored_programs._foreign_callouts(lapack) == []
    assert stored_programs._foreign_callouts(host)  # its function lives in one process only
