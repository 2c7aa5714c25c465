"""The compile cache directory shared by several processes: no process ever reads a partial entry
(jax warned "Error reading persistent compilation cache entry ... incomplete or truncated
stream" when two tpu ranks compiled into one ``ACCELKIT_COMPILE_CACHE``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import run_python

from accelkit_backends.tpu import cache_files
from accelkit_backends.tpu.cache_files import AtomicFileCache, write_atomically

# One of two processes sharing a cache: a reader thread polls every entry, as a rank about to
# compile the same program looks it up, while the main thread looks each entry up and writes
# the ones it misses (jax's order: get, compile on a miss, put). Entries are 4 MiB of
# incompressible bytes, so a write takes long enough for a non-atomic one to be seen midway.
# STRESS_CACHE=jax runs jax's own file cache instead (what tpu used before).
STRESS = """
    import hashlib, json, os, sys, threading, time
    directory, order, barrier = sys.argv[1], sys.argv[2], sys.argv[3]
    if os.environ.get("STRESS_CACHE") == "jax":
        from jax._src.lru_cache import LRUCache
        cache = LRUCache(directory, max_size=-1)
    else:
        from accelkit_backends.tpu.cache_files import AtomicFileCache
        cache = AtomicFileCache(directory)
    keys = [f"entry{i:02d}" for i in range(24)]
    values = {k: hashlib.shake_256(k.encode()).digest(4 << 20) for k in keys}
    digests = {k: hashlib.sha256(v).hexdigest() for k, v in values.items()}
    partial, reads, done = [], [0], threading.Event()

    def read(key):
        data = cache.get(key)
        if data is not None:
            reads[0] += 1
            if hashlib.sha256(data).hexdigest() != digests[key]:
                partial.append([key, len(data)])

    def poll():
        while not done.is_set():
            for key in keys:
                read(key)

    poller = threading.Thread(target=poll)
    open(os.path.join(barrier, order), "w").close()
    while len(os.listdir(barrier)) < 2:
        time.sleep(0.001)
    poller.start()
    for key in (keys if order == "forward" else keys[::-1]):
        if cache.get(key) is None:
            cache.put(key, values[key])
        read(key)
    done.set()
    poller.join()
    print(json.dumps({"partial": len(partial), "examples": partial[:3], "reads": reads[0]}))
"""


def _start(code: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out, err


def test_two_processes_writing_and_reading_the_same_entries_never_read_a_partial_one(tmp_path):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    processes = [_start(STRESS, [str(cache), order, str(barrier)]) for order in ("forward", "backward")]
    reports = [json.loads(_finish(p)[0].strip().splitlines()[-1]) for p in processes]
    for report in reports:
        assert report["partial"] == 0, report
        assert report["reads"] >= 24, report  # every entry was read back at least once
    entries = sorted(p.name for p in cache.iterdir())
    assert entries == [f"entry{i:02d}-cache" for i in range(24)]  # no temporary file left
    for name in entries:
        key = name.removesuffix("-cache")
        assert (cache / name).read_bytes() == hashlib.shake_256(key.encode()).digest(4 << 20)


def test_a_failed_write_leaves_neither_the_entry_nor_a_temporary_file(tmp_path):
    target = tmp_path / "entry-cache"
    with pytest.raises(TypeError):
        write_atomically(target, object())  # not bytes: the write raises after the file is made
    assert list(tmp_path.iterdir()) == []
    write_atomically(target, b"whole")
    write_atomically(target, b"replaced")
    assert target.read_bytes() == b"replaced" and [p.name for p in tmp_path.iterdir()] == ["entry-cache"]


def test_temporary_files_of_dead_writers_are_removed_when_a_cache_opens(tmp_path):
    stale = tmp_path / f".abc-cache.x1{cache_files.PARTIAL_SUFFIX}"
    fresh = tmp_path / f".def-cache.x2{cache_files.PARTIAL_SUFFIX}"
    for path in (stale, fresh):
        path.write_bytes(b"half")
    old = time.time() - cache_files.STALE_PARTIAL_SECONDS - 60
    os.utime(stale, (old, old))
    (tmp_path / "ghi-cache").write_bytes(b"entry")
    AtomicFileCache(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, "ghi-cache"])


def test_entries_keep_jax_s_file_layout_and_are_written_once(tmp_path):
    from jax._src.lru_cache import LRUCache

    ours, theirs = AtomicFileCache(tmp_path), LRUCache(str(tmp_path), max_size=-1)
    ours.put("k1", b"one")
    theirs.put("k2", b"two")
    assert (theirs.get("k1"), ours.get("k2")) == (b"one", b"two")
    ours.put("k1", b"other")  # one key, one executable: an existing entry stays
    assert ours.get("k1") == b"one" and ours.get("missing") is None
    with pytest.raises(ValueError):
        ours.get("")


# Two tpu processes compile the same programs at the same time into one cache directory:
# compiled graphs (forward and backward, several shapes) go through jax's cache, eager ops through
# the program store, and with the store off (ACCELKIT_TPU_PROGRAM_STORE=0) through jax's cache too.
TPU_RANK = """
    import json, os, sys, time, warnings
    warnings.simplefilter("always")
    import torch, accelkit
    dev = accelkit.select_device("tpu")
    barrier, ranks = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dev)
    step = torch.compile(lambda x: model(x).square().mean())
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    while len(os.listdir(barrier)) < ranks:  # the ranks start compiling at once
        time.sleep(0.001)
    losses = []
    for rows in (1, 2, 3, 5):
        x = torch.linspace(-1, 1, rows * 16).reshape(rows, 16).to(dev)
        loss = step(x)
        loss.backward()
        losses.append(round(loss.item(), 6))
        losses.append(round((x.exp() * 0.5).sum(0).softmax(0)[0].item(), 6))
    print(json.dumps({"losses": losses, "cache": accelkit.stats()["compile"]["persistent_cache"]}))
"""


@pytest.mark.parametrize("store", ["1", "0"])
def test_two_tpu_ranks_compiling_into_one_directory_warn_of_no_unreadable_entry(tmp_path, store):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    env = {"ACCELKIT_COMPILE_CACHE": str(cache), "ACCELKIT_TPU_PROGRAM_STORE": store}
    ranks = [_start(TPU_RANK, [str(barrier), "2"], env) for _ in range(2)]
    outputs = [_finish(rank) for rank in ranks]
    for _, err in outputs:
        assert "persistent compilation cache" not in err, err
    cold = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert cold[0]["losses"] == cold[1]["losses"]
    warm = _start(TPU_RANK, [str(barrier), "0"], env)
    warm_out, warm_err = _finish(warm)
    assert "persistent compilation cache" not in warm_err, warm_err
    warm = json.loads(warm_out.strip().splitlines()[-1])
    assert warm["losses"] == cold[0]["losses"]
    assert warm["cache"]["hits"] > 0 and warm["cache"]["misses"] == 0, warm["cache"]  # all served
    assert not [p for p in cache.rglob(f"*{cache_files.PARTIAL_SUFFIX}")]


def test_jax_s_cache_at_the_directory_is_the_atomic_one(tmp_path):
    done = run_python("""
        import accelkit, torch
        accelkit.select_device("tpu")
        from jax._src import compilation_cache
        print(type(compilation_cache._cache).__name__, compilation_cache._cache._path)
    """, {"ACCELKIT_COMPILE_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["AtomicFileCache", str(tmp_path)]


def test_with_a_size_limit_jax_keeps_its_own_locked_cache(tmp_path):
    done = run_python("""
        import jax
        jax.config.update("jax_compilation_cache_max_size", 1 << 30)
        import accelkit, torch
        dev = accelkit.select_device("tpu")
        (torch.ones(3, device=dev) * 2).cpu()
        from jax._src import compilation_cache
        print(type(compilation_cache._cache).__name__)
    """, {"ACCELKIT_COMPILE_CACHE": str(tmp_path), "ACCELKIT_TPU_PROGRAM_STORE": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["LRUCache"]
    assert any(p.name.endswith("-cache") for p in tmp_path.iterdir())
