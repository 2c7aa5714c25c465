"""accelkit's native extension: the PrivateUse1 pieces torch 2.13 keeps in C++.

``device.cpp`` holds a device guard with a device count and a per-thread current device, and a
maker of device tensors at any index; ``hooks.cpp`` PyTorch's PrivateUse1 hooks with pinned host
memory and the device's generators (``generator.cpp``); ``memory.cpp`` the device's memory figures
for ``torch.accelerator``; ``views.cpp`` and ``lane.cpp`` the view kernels and the prepared-call
lane's front; ``books.cpp`` the allocator's books for kernel results and uncached allocations;
``factories.cpp`` the common case of ``torch.empty`` (see their headers). It is
compiled once per torch version, Python version and source, with the system C++ compiler against
the installed torch, into
``$ACCELKIT_NATIVE_DIR`` (default ``$XDG_CACHE_HOME/accelkit/native``, i.e.
``~/.cache/accelkit/native``), and loaded from there. The install step builds it
(``python -m accelkit native build``, which ``make`` runs); otherwise the first process that
needs it builds it (about 30 s on two cores, said on stderr), under a lock, so parallel
processes build it once.

Activation loads it for the hooks and the memory figures; the guard replaces the Python one only with more than one
device per process. Everything else works without it: several devices per process raise
:class:`NativeUnavailableError` with the reason when it cannot be built, and pinning host memory
for the device raises PyTorch's NotImplementedError, and ``torch.accelerator.memory_*`` an
internal assert (activation warns which; ``torch.<name>.memory_*`` work either way).
``ACCELKIT_NATIVE=off`` disables it.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

from accelkit._errors import AccelkitError

SOURCES = tuple(Path(__file__).with_name(name) for name in ("device.cpp", "hooks.cpp", "memory.cpp", "generator.cpp",
                                                             "views.cpp", "lane.cpp", "books.cpp", "factories.cpp"))
MODULE = "_accelkit_device"
DIR_ENV = "ACCELKIT_NATIVE_DIR"
SWITCH_ENV = "ACCELKIT_NATIVE"
COMPILER_ENV = "CXX"

_lock = threading.Lock()
_module: ModuleType | None = None


class NativeUnavailableError(AccelkitError):
    """accelkit's native extension is disabled or cannot be built here; the message says why."""


_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c++20", "-w")


def _compile_command(output: Path) -> list[str]:
    from torch.utils import cpp_extension

    libraries = cpp_extension.library_paths()
    return [
        os.environ.get(COMPILER_ENV, "g++"), *_FLAGS,
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(f"-I{path}" for path in cpp_extension.include_paths()),
        f"-I{sysconfig.get_paths()['include']}",
        *map(str, SOURCES), "-o", str(output),
        *(f"-L{path}" for path in libraries),
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
        *(f"-Wl,-rpath,{path}" for path in libraries),
    ]


def module_path() -> Path:
    """Where the built module is (or will be) for this torch, Python and source."""
    root = os.environ.get(DIR_ENV)
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "accelkit", "native")
    key = hashlib.sha256()
    for source in SOURCES:
        key.update(source.read_bytes())
    # What the compile command holds, without importing torch.utils.cpp_extension (it imports
    # setuptools: 0.1-0.2 s of every activation): the flags, and this torch's version and
    # directory, where the headers and libraries it builds against are.
    key.update(repr((_FLAGS, MODULE, int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__,
                     os.path.dirname(torch.__file__), sysconfig.get_paths()["include"])).encode())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return Path(root) / f"{torch.__version__}-{key.hexdigest()[:16]}" / f"{MODULE}{suffix}"


def disabled_reason() -> str | None:
    if os.environ.get(SWITCH_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return f"{SWITCH_ENV}=off disables it"
    return None


def build(force: bool = False) -> tuple[Path, float]:
    """Compile the extension unless it is built already; returns its path and the seconds the
    compiler took (0.0 when nothing was built).

    :raises NativeUnavailableError: no compiler, or the compiler failed (its output is in the
        message).
    """
    path = module_path()
    if path.exists() and not force:
        return path, 0.0
    compiler = os.environ.get(COMPILER_ENV, "g++")
    if shutil.which(compiler) is None:
        raise NativeUnavailableError(
            f"accelkit's native extension needs a C++ compiler and {compiler!r} is not on PATH; "
            f"install g++ (e.g. apt install g++) or name one in ${COMPILER_ENV}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same module
        if path.exists() and not force:
            return path, 0.0
        partial = path.with_name(f".{os.getpid()}.{path.name}")
        started = time.perf_counter()
        result = subprocess.run(_compile_command(partial), capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise NativeUnavailableError(
                f"building accelkit's native extension failed ({compiler}, exit {result.returncode}):\n"
                f"{result.stderr.strip()[-4000:]}"
            )
        os.replace(partial, path)  # atomic: a reader never sees half a module
    return path, seconds


def load() -> ModuleType:
    """The native module, built first if need be.

    :raises NativeUnavailableError: disabled, or it cannot be built (the reason and the fix).
    """
    global _module
    with _lock:
        if _module is not None:
            return _module
        reason = disabled_reason()
        if reason:
            raise NativeUnavailableError(f"accelkit's native extension is off: {reason}")
        if not module_path().exists():
            # The install step builds it; a process that finds it missing builds it now, once.
            print("accelkit: building the native extension (once per torch version, about 30 s)...",
                  file=sys.stderr, flush=True)
        path, _ = build()
        spec = importlib.util.spec_from_file_location(MODULE, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _module = module
        return module


def loaded() -> ModuleType | None:
    """The native module if this process loaded it, else None (never builds)."""
    return _module


def status() -> str:
    """One line for ``accelkit devices``: whether the extension is built, loaded or off."""
    reason = disabled_reason()
    if reason:
        return f"off ({reason})"
    path = module_path()
    if _module is not None:
        return f"loaded ({path})"
    return f"built ({path})" if path.exists() else "not built yet (built on first use, or: python -m accelkit native build)"
