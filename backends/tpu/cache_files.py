"""Files under the compile cache directory (``ACCELKIT_COMPILE_CACHE``), which several processes
share (the ranks of a job, a conformance run's workers): each is written whole or not at all.

Every entry is written to a temporary name in its own directory and then renamed into place
(:func:`write_atomically`), so a process reading an entry another one is writing finds either
nothing or the whole entry. tpu writes two kinds: its store of eager programs
(:mod:`.stored_programs`) and jax's persistent compilation cache. jax 0.10's file cache
(``jax._src.lru_cache.LRUCache``) writes an entry in place when it runs without a size limit,
its default: a reader finds the file as soon as it is created and decompresses part of it
("Error reading persistent compilation cache entry ... incomplete or truncated stream"), and a
writer killed midway leaves a truncated entry that is never rewritten. jax has no public way to
choose the cache implementation, so :func:`use_jax_cache` puts :class:`AtomicFileCache` (same
file layout) in its place. This module is the one place where accelkit touches jax's private
cache state (``jax._src.compilation_cache``); with a size limit set
(``jax_compilation_cache_max_size``), jax's own cache is kept: it holds a file lock around
every read and write.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import jax
from jax._src.compilation_cache_interface import CacheInterface

#: Suffix of temporary files; what a process killed while writing leaves behind.
PARTIAL_SUFFIX = ".partial"
#: A temporary file older than this is a dead writer's and is removed when a cache opens.
STALE_PARTIAL_SECONDS = 3600.0


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader sees part of it: into a temporary file beside
    it, then renamed over ``path`` (atomic within one file system). The temporary file is gone
    whether or not this succeeds.

    :raises OSError: the file could not be written.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def remove_stale_partials(directory: Path, older_than: float = STALE_PARTIAL_SECONDS) -> int:
    """Remove temporary files that writers killed midway left in ``directory`` (those older than
    ``older_than`` seconds; younger ones may still be being written). Returns how many."""
    removed = 0
    deadline = time.time() - older_than
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if entry.name.endswith(PARTIAL_SUFFIX):
            with contextlib.suppress(OSError):
                if entry.stat().st_mtime < deadline:
                    os.unlink(entry.path)
                    removed += 1
    return removed


class AtomicFileCache(CacheInterface):
    """jax's persistent compilation cache as files in one directory, in the layout of jax's own
    file cache (``<key>-cache``, so either reads the other's entries), each written atomically.

    An entry that exists is not written again (jax's rule: one key, one executable).
    """

    SUFFIX = "-cache"

    def __init__(self, directory: str | os.PathLike):
        self._path = Path(directory)
        self._path.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(self._path)

    def _file(self, key: str) -> Path:
        if not key:
            raise ValueError("key cannot be empty")
        return self._path / f"{key}{self.SUFFIX}"

    def get(self, key: str) -> bytes | None:
        try:
            return self._file(key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, value: bytes) -> None:
        path = self._file(key)
        if not path.exists():
            write_atomically(path, value)


def use_jax_cache(directory: str) -> bool:
    """Point jax's persistent compilation cache at ``directory`` (for every program, however
    quick to compile or small), with entries written atomically. Returns whether
    :class:`AtomicFileCache` serves it (False: a size limit is set, and jax's locked cache does).
    """
    from jax._src import compilation_cache

    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if jax.config.jax_compilation_cache_max_size != -1:
        compilation_cache.reset_cache()  # jax opens its own cache at the new directory
        return False
    cache = AtomicFileCache(directory)
    if jax.config.jax_compilation_cache_check_contents:
        cache = compilation_cache.VerificationCache(cache)
    with compilation_cache._cache_initialized_mutex:
        # jax opens its cache once, on first use, from the directory setting; this is that
        # opening done with another implementation (and redone if jax opened one already).
        compilation_cache._cache = cache
        compilation_cache._cache_initialized = True
    return True


@contextlib.contextmanager
def jax_cache_set_aside() -> Iterator[bool]:
    """Compile past jax's persistent cache in this block: jax neither reads nor writes it.

    jax decides once per process whether its cache is used; the decision is set aside for the
    block and restored after. Yields whether it could be (False: this jax keeps the decision
    elsewhere; callers check the outcome, which also guards against another thread's compile
    undoing it).
    """
    from jax._src import compilation_cache

    try:
        with compilation_cache._cache_initialized_mutex:
            decided = compilation_cache._cache_checked, compilation_cache._cache_used
            compilation_cache._cache_checked, compilation_cache._cache_used = True, False
    except AttributeError:
        yield False
        return
    try:
        yield True
    finally:
        with compilation_cache._cache_initialized_mutex:
            compilation_cache._cache_checked, compilation_cache._cache_used = decided
