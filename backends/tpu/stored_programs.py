"""tpu's store of compiled eager programs: a later process loads an op's executable instead of
tracing, lowering and compiling it again.

With a persistent compile cache (``ACCELKIT_COMPILE_CACHE=DIR``), jax finds a program in its
cache only after tracing it, lowering it to MLIR and hashing the module: about 20 ms for a small
op, most of a warm conformance run. tpu therefore keeps each eager op program it compiles as a
serialized XLA executable under ``DIR/tpu-programs/<fingerprint>/``, keyed by what decides the
program before any tracing: the lowering (op, function, static argument names), the call's
static structure and the input types, shapes and devices. A process with the same fingerprint
loads it in about 3 ms. jax's own cache is not consulted or written for these programs (an
executable jax read from its cache cannot be serialized again); compiled graphs and data
movement keep using it.

The fingerprint covers everything else a program depends on: the sources of accelkit and of
this backend, the versions of torch, jax, jaxlib, numpy and ml_dtypes, ``XLA_FLAGS``, every
``ACCELKIT_TPU_*`` and ``ACCELKIT_FAST_COMPILE`` setting, and the PJRT platform. Any change
starts a new directory; the three used most recently are kept. A program is not stored, and
compiles as before, when its function is not the backend's own (a user's custom op, whose source
the fingerprint cannot see) or a static argument has no exact text form. An entry that cannot
be read or loaded is a miss, compiled and written again; results never depend on the store.

A loaded program runs on the devices it was compiled for. One that calls a host function
(a custom call) is stored only if that function is a LAPACK routine, which the store binds when
it opens, as jaxlib does on first lowering one.

``ACCELKIT_TPU_PROGRAM_STORE=0`` keeps the store closed. Like jax's own persistent cache, the
store loads executables from disk: point ``ACCELKIT_COMPILE_CACHE`` only at a directory you
trust.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import re
import shutil
import sys
import threading
import zlib
from importlib import metadata
from pathlib import Path
from typing import Any

import jax
import torch
from torch._ops import OpOverload

from accelkit.sdk import env_choice, fast_compile
from accelkit_backends.tpu import cache_files, checks

FORMAT = "accelkit-tpu-programs/3"
#: ``=0`` keeps the store closed: eager programs then use jax's persistent cache alone.
ENABLE_ENV = "ACCELKIT_TPU_PROGRAM_STORE"
KEPT_FINGERPRINTS = 3
_OWN_MODULES = "accelkit_backends.tpu"


class Unstable(Exception):
    """A value with no exact, process-independent text form: its program is not stored."""


def canonical(value: Any) -> str:
    """The exact text of a static value, the same in every process.

    :raises Unstable: ``value`` (or a part of it) has no such text.
    """
    kind = type(value)
    if value is None or kind in (bool, int, str, float, complex):
        return repr(value)  # repr of a float is exact, and keeps -0.0 and nan apart
    if kind in (torch.dtype, torch.layout, torch.memory_format):
        return str(value)
    if kind is torch.device:
        return f"device({value})"
    if kind is type and value in (bool, int, float, complex):
        return value.__name__
    if isinstance(value, OpOverload):
        return f"op({value})"
    if isinstance(value, tuple | list):
        prefix = "" if kind in (tuple, list, torch.Size) else kind.__name__
        return f"{prefix}({','.join(canonical(v) for v in value)})"
    if isinstance(value, dict):
        return f"{{{','.join(f'{canonical(k)}:{canonical(v)}' for k, v in value.items())}}}"
    if callable(value):
        return function_identity(value, own_only=False)
    raise Unstable(f"{kind.__name__} has no exact text form")


def function_identity(fn: Any, own_only: bool = True) -> str:
    """Which function ``fn`` is, the same in every process: module, name and first line, the
    values it closes over, and a partial's bound arguments.

    :param own_only: refuse functions outside this backend (the fingerprint cannot see their
        source); functions of the libraries whose versions it covers (``jax.numpy``) are named.
    :raises Unstable: ``fn`` cannot be named so.
    """
    if isinstance(fn, functools.partial):
        bound = canonical(fn.args) + canonical(dict(sorted(fn.keywords.items())))
        return f"partial({function_identity(fn.func, own_only)},{bound})"
    module = getattr(fn, "__module__", None) or ""
    own = module == _OWN_MODULES or module.startswith(_OWN_MODULES + ".")
    if own_only and not own:
        raise Unstable(f"{getattr(fn, '__qualname__', fn)!r} is not tpu's own code")
    name = f"{module}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    code = getattr(fn, "__code__", None)
    if code is None:
        if own:
            raise Unstable(f"{name} is not a plain function")
        return name
    cells = fn.__closure__ or ()
    closed = ",".join(canonical(cell.cell_contents) for cell in cells)
    return f"{name}:{code.co_firstlineno}[{closed}]"


def _fingerprint(device: Any) -> str:
    """The hash of everything a stored program depends on besides its key (see the module
    docstring)."""
    import accelkit
    import accelkit_backends.tpu as tpu

    digest = hashlib.sha256(FORMAT.encode())
    for package in (accelkit, tpu):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            if "tests" in path.relative_to(root).parts:
                continue
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    for distribution in ("torch", "jax", "jaxlib", "numpy", "ml_dtypes"):
        try:
            digest.update(f"{distribution}={metadata.version(distribution)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{distribution}=absent".encode())
    settings = sorted((k, v) for k, v in os.environ.items()
                      if k == "XLA_FLAGS" or k.startswith("ACCELKIT_TPU_"))
    digest.update(repr((settings, fast_compile(), jax.config.jax_enable_x64, sys.version_info[:2])).encode())
    client = device.client
    digest.update(repr((client.platform, client.platform_version, device.device_kind)).encode())
    return digest.hexdigest()[:24]


class ProgramStore:
    """Serialized executables in one fingerprint's directory, written atomically (several
    processes may share it). ``hits``, ``misses``, ``written`` and ``unreadable`` count this
    process's lookups."""

    def __init__(self, root: Path, fingerprint: str):
        self.directory = root / fingerprint
        self.directory.mkdir(parents=True, exist_ok=True)
        os.utime(self.directory)  # marks it used, for _prune
        cache_files.remove_stale_partials(self.directory)
        self.hits = self.misses = self.written = self.unreadable = 0
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.xla"

    def load(self, key: str) -> Any | None:
        """The executable stored under ``key``, loaded, or None."""
        from jax.experimental.serialize_executable import deserialize_and_load

        try:
            data = self._path(key).read_bytes()
        except OSError:
            with self._lock:
                self.misses += 1
            return None
        try:
            form, stored_key, blob, in_tree, out_tree, stated, device_ids = pickle.loads(zlib.decompress(data))
            if form != FORMAT or stored_key != key:
                raise ValueError("another program under the same hash")
            # Loaded onto all devices (jax's default), a one-device program fails to run in a
            # process with several.
            by_id = {d.id: d for d in jax.devices()}
            devices = [by_id[i] for i in device_ids]
            executable = deserialize_and_load(blob, in_tree, out_tree, execution_devices=devices)
            for check in stated:  # what a failed status of this program raises
                checks.register(check)
        except Exception:  # damaged or foreign: compile again and overwrite it
            with self._lock:
                self.misses += 1
                self.unreadable += 1
            return None
        with self._lock:
            self.hits += 1
        return executable

    def save(self, key: str, executable: Any, stated: set) -> None:
        """Store ``executable`` under ``key`` with the device-side checks it states
        (:mod:`.checks`); a failure to write only costs the next process a compile."""
        from jax.experimental.serialize_executable import serialize

        try:
            blob, in_tree, out_tree = serialize(executable)
            device_ids = [d.id for d in executable.runtime_executable().local_devices()]
            entry = (FORMAT, key, blob, in_tree, out_tree, list(stated), device_ids)
            cache_files.write_atomically(self._path(key), zlib.compress(pickle.dumps(entry), 1))
        except Exception:
            return
        with self._lock:
            self.written += 1

    def statistics(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "written": self.written, "unreadable": self.unreadable}


def _prune(root: Path, keep: int) -> None:
    """Remove all but the ``keep`` fingerprint directories used most recently."""
    try:
        directories = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return
    for stale in directories[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


#: The store of this process, once a compile cache directory is in use (:func:`open_store`).
STORE: ProgramStore | None = None


def _bind_native_routines() -> None:
    """Bind the LAPACK routines that XLA's CPU programs call out to.

    jaxlib binds them when it first lowers a linear-algebra op; a process that only loads
    programs never does, and a loaded ``cholesky`` would call an unbound routine (a segmentation
    fault). jax's own deserialization of exported programs binds them the same way.

    :raises RuntimeError: this jax has no such entry point (the store then stays closed).
    """
    try:
        from jax._src.lax.linalg import initialize_lapack
    except ImportError as missing:
        raise RuntimeError(f"jax {jax.__version__} has no initialize_lapack: {missing}") from None
    initialize_lapack()


def wanted() -> bool:
    """Whether the store opens with a compile cache directory: ``ACCELKIT_TPU_PROGRAM_STORE``,
    ``1`` by default.

    :raises ValueError: the variable is set to something other than ``0`` or ``1``.
    """
    return env_choice(ENABLE_ENV, ("0", "1"), "1") == "1"


def open_store(cache_directory: str, device: Any) -> ProgramStore:
    """Store eager programs under ``cache_directory`` from now on (see the module docstring).

    :raises RuntimeError: loaded programs could not run safely in this process.
    """
    global STORE
    _bind_native_routines()
    root = Path(cache_directory) / "tpu-programs"
    store = ProgramStore(root, _fingerprint(device))
    _prune(root, KEPT_FINGERPRINTS)
    STORE = store
    return store


_compile_lock = threading.Lock()
_this_thread = threading.local()


def _count_jax_cache_hit(event: str, **kwargs: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _this_thread.jax_cache_hits = getattr(_this_thread, "jax_cache_hits", 0) + 1


jax.monitoring.register_event_listener(_count_jax_cache_hit)


def _foreign_callouts(lowered: Any) -> list[str]:
    """The host functions a program calls that a loading process would not have bound: any
    custom call but the LAPACK routines :func:`_bind_native_routines` binds."""
    return [target for target in re.findall(r"custom_call @([\w.$-]+)", lowered.as_text())
            if not target.startswith("lapack_")]


def _compile_fresh(jitted: Any, arrays: list, scalars: list) -> tuple[Any, bool]:
    """Compile ``jitted`` for these inputs past jax's persistent cache, and say whether the
    executable may be stored: it must be freshly compiled (one jax read from its cache cannot be
    serialized again: XLA's CPU client keeps its code but drops it on serializing, and the copy
    fails to run with "Function ... not found") and call no host function another process
    would lack (:func:`_foreign_callouts`).

    jax's cache is set aside for this compile (:func:`.cache_files.jax_cache_set_aside`, hence
    the check of the outcome, which holds even if another thread's compile or a newer jax undoes
    it).
    """
    with _compile_lock:
        _this_thread.jax_cache_hits = 0
        with cache_files.jax_cache_set_aside():
            lowered = jitted.lower(arrays, scalars)
            executable = lowered.compile()
        return executable, _this_thread.jax_cache_hits == 0 and not _foreign_callouts(lowered)


def _signature_of(arrays: list) -> tuple:
    """What besides the static structure decides an executable: each input's type and device."""
    return tuple([(a.shape, a.dtype, a.weak_type, a.sharding) for a in arrays])


def _devices_of(signature: tuple) -> str:
    """The devices a program with these inputs runs on; jax's default device for one without
    inputs (a factory)."""
    if not signature:
        default = jax.config.jax_default_device
        return f"default {getattr(default, 'id', default)}"
    return ";".join(str(sorted(d.id for d in sharding.device_set)) for *_, sharding in signature)


class StoredProgram:
    """A jitted op program whose executables, one per input signature, come from the store, or
    are compiled and written to it. Called as the jitted function is (``(arrays, scalars)``),
    and bounded by :data:`programs.LOADED` through the same two methods."""

    __slots__ = ("jitted", "key", "store", "_executables", "_stated")

    def __init__(self, jitted: Any, key: str, store: ProgramStore):
        self.jitted, self.key, self.store = jitted, key, store
        self._executables: dict[tuple, Any] = {}
        self._stated: set = set()  # the checks its traces stated (jax may reuse a trace)

    def __call__(self, arrays: list, scalars: list) -> Any:
        signature = _signature_of(arrays)
        executable = self._executables.get(signature)
        if executable is None:
            executable = self._load_or_compile(signature, arrays, scalars)
        return executable(arrays, scalars)

    def executable(self, arrays: list) -> Any:
        """The loaded executable for these arrays (after a call with them)."""
        return self._executables[_signature_of(arrays)]

    def _load_or_compile(self, signature: tuple, arrays: list, scalars: list) -> Any:
        inputs = ";".join(f"{shape}:{dtype}:{weak}" for shape, dtype, weak, _ in signature)
        key = f"{self.key}|{inputs}|{_devices_of(signature)}"
        executable = self.store.load(key)
        if executable is None:
            with checks.recording() as stated:
                executable, storable = _compile_fresh(self.jitted, arrays, scalars)
            self._stated |= stated
            # jax's trace and compile caches keep the executable alive beside this table; let
            # go of them, or programs.LOADED could not bound the executables loaded.
            self.jitted.clear_cache()
            if storable:
                self.store.save(key, executable, self._stated)
        self._executables[signature] = executable
        return executable

    def _cache_size(self) -> int:
        return len(self._executables)

    def clear_cache(self) -> None:
        self._executables.clear()
