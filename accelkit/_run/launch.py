"""Running a script as ``python script.py`` (or a module as ``python -m``) would, on a backend.

Before the script starts, the device is selected and activated and the environment says so
(``ACCELKIT_DEVICE``, ``ACCELERATE_TORCH_DEVICE``, ``ACCELKIT_FALLBACK``), so a script that calls
``select_device()``, reads ``ACCELKIT_DEVICE``, names ``torch.device("tpu")`` or builds a Hugging
Face ``Trainer`` lands on the device, and so do the processes it starts. The script runs in this
process, as ``__main__``, with its own ``sys.argv`` and ``sys.path[0]``.

When it ends — returned, ``sys.exit``, an exception, Ctrl-C or SIGTERM — the report is written,
then the ending passes through unchanged: the same exit code, the same traceback (from the
script's first frame), the same death by signal.
"""

from __future__ import annotations

import functools
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from accelkit._errors import AccelkitError

#: Seconds between memory samples at the start; doubled whenever :data:`MAX_SAMPLES` is reached.
SAMPLE_INTERVAL = 0.02
MAX_SAMPLES = 1000


@dataclass
class RunOptions:
    """What ``accelkit run`` was asked for.

    :ivar target: ``[script, *args]``, or ``["-m", module, *args]``.
    :ivar device: a device name or preference list; ``None``: ``ACCELKIT_DEVICE``, else the best.
    :ivar fallback: the CPU-fallback policy for the run, if given.
    :ivar compile: ``torch.compile`` calls that name no backend (or ``"inductor"``) compile for
        the device instead.
    :ivar report_dir: where the JSON and HTML reports go, if anywhere.
    :ivar estimate_on: target generations to estimate the run on as well (``"v5e,v6e,trn2"``),
        set as ``ACCELKIT_ESTIMATE_ON`` before the backend is activated; ``None``: the
        environment's, if any.
    """

    target: list[str]
    device: str | None = None
    fallback: str | None = None
    compile: bool = False
    report_dir: Path | None = None
    estimate_on: str | None = None


@dataclass
class Ending:
    """How the script ended: ``code`` is the process's exit status, unless ``signal`` is set: the
    process then dies by it, as Python does after an uncaught ``KeyboardInterrupt`` (SIGINT)."""

    code: int = 0
    exception: str | None = None
    signal: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"code": None if self.signal else self.code, "exception": self.exception,
                "signal": signal.Signals(self.signal).name if self.signal else None}


class _Terminated(BaseException):
    """SIGTERM arrived while the script ran (raised in the main thread, as SIGINT is)."""


class MemorySampler:
    """Samples the device's allocated bytes on a daemon thread until stopped.

    Every :attr:`interval` seconds; when :data:`MAX_SAMPLES` are kept, every other one is
    dropped and the interval doubles, so a long run keeps an even, bounded timeline.
    """

    def __init__(self, read: Callable[[], int]):
        self._read = read
        self._stop = threading.Event()
        self.interval = SAMPLE_INTERVAL
        self.points: list[tuple[float, int]] = []
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="accelkit-run-memory", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        self.points.append((time.perf_counter() - self._start, int(self._read())))
        if len(self.points) >= MAX_SAMPLES:
            self.points = self.points[::2]
            self.interval *= 2

    def _loop(self) -> None:
        self._sample()
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> list[tuple[float, int]]:
        """Stop, take a last sample and return the timeline ``[(seconds, bytes), ...]``."""
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.points


def run(options: RunOptions) -> int:
    """Run the script under ``options``; return its exit status (see the module docstring).

    :raises AccelkitError: the device cannot be selected, the policy is unknown, or the script
        or module does not exist (nothing has run then).
    """
    from accelkit import _runtime, fallback_policy, select_device

    runner = _runner(options.target)
    if options.device:
        os.environ["ACCELKIT_DEVICE"] = options.device
    if options.fallback:
        os.environ["ACCELKIT_FALLBACK"] = options.fallback
    if options.estimate_on:
        from accelkit.sdk import ESTIMATE_ON_ENV

        os.environ[ESTIMATE_ON_ENV] = options.estimate_on
    device = select_device(options.device)
    ctx = _runtime.active()
    if ctx is not None and ctx.name == device.type:
        # The script's own select_device(), and every process it starts, find the same device.
        os.environ["ACCELKIT_DEVICE"] = device.type
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", device.type)
        if options.fallback:
            fallback_policy(options.fallback)
        from accelkit import reset_stats

        reset_stats()
        sampler = MemorySampler(lambda: ctx.allocator.memory_allocated())
    else:
        ctx, sampler = None, None

    compile_redirects = [0]
    started = time.time()
    clock = time.perf_counter()
    with _child_reports(ctx is not None) as children, \
            _compile_for(device.type, compile_redirects) if options.compile and ctx else nullcontext():
        ending = _run_script(runner)
        wall = time.perf_counter() - clock
        _report(options, device, ending, started, wall, sampler, compile_redirects[0])
        _report_children(options, children)
    return _pass_through(ending)


@contextmanager
def _child_reports(enabled: bool) -> Iterator[Path | None]:
    """A directory the processes the script starts write their reports into (see
    :mod:`accelkit._run.children`), removed after."""
    if not enabled:
        yield None
        return
    import tempfile

    from accelkit._run.children import CHILD_REPORTS

    with tempfile.TemporaryDirectory(prefix="accelkit-run-") as directory:
        previous = os.environ.get(CHILD_REPORTS)
        os.environ[CHILD_REPORTS] = directory
        try:
            yield Path(directory)
        finally:
            if previous is None:
                os.environ.pop(CHILD_REPORTS, None)
            else:
                os.environ[CHILD_REPORTS] = previous


def _report_children(options: RunOptions, directory: Path | None) -> None:
    """Print (and write, with ``--report``) the reports of the script's processes that ran
    device work, after the launcher's own."""
    if directory is None:
        return
    from accelkit._run import report as run_report
    from accelkit._run.children import collect

    try:
        for child in collect(directory):
            written = (run_report.write(child, options.report_dir, stem=f"report-pid{child['pid']}")
                       if options.report_dir else [])
            print(run_report.render_text(child, written, process=f"process {child['pid']}"), file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - the script's ending matters more than its report
        print(f"accelkit run: the reports of the script's processes could not be shown: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)


def _runner(target: list[str]) -> Callable[[], None]:
    if target[:1] == ["-m"]:
        if len(target) < 2:
            raise AccelkitError("accelkit run -m: name the module to run, e.g. `accelkit run -m mypkg.train`")
        module, args = target[1], target[2:]

        def run_module() -> None:
            sys.argv = [module, *args]  # runpy puts the module's file in argv[0]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(module, run_name="__main__", alter_sys=True)

        return run_module
    script, args = target[0], target[1:]
    path = Path(script)
    if not path.is_file():
        raise AccelkitError(f"accelkit run: no such script: {script!r}")

    def run_path() -> None:
        sys.argv = [script, *args]
        sys.path.insert(0, str(path.resolve().parent))
        runpy.run_path(script, run_name="__main__")

    return run_path


def _run_script(runner: Callable[[], None]) -> Ending:
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        runner()
    except SystemExit as exc:
        return Ending(code=_exit_status(exc.code))
    except KeyboardInterrupt as exc:
        _print_traceback(exc)
        return Ending(code=128 + signal.SIGINT, exception="KeyboardInterrupt", signal=signal.SIGINT)
    except _Terminated:
        return Ending(code=128 + signal.SIGTERM, exception="terminated by SIGTERM", signal=signal.SIGTERM)
    except BaseException as exc:  # noqa: BLE001 - every ending of the script is passed through
        _print_traceback(exc)
        return Ending(code=1, exception=f"{type(exc).__name__}: {exc}")
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stdout.flush()
    return Ending()


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated()


def _exit_status(code: Any) -> int:
    """The status ``sys.exit(code)`` gives a Python process (a non-int is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_traceback(exc: BaseException) -> None:
    """Print ``exc`` as ``python script.py`` would: through ``sys.excepthook``, from the script's
    first frame on (the launcher's and runpy's frames are dropped)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                              or tb.tb_frame.f_globals.get("__name__") == "runpy"):
        tb = tb.tb_next
    exc = exc.with_traceback(tb or exc.__traceback__)
    sys.excepthook(type(exc), exc, exc.__traceback__)


def _pass_through(ending: Ending) -> int:
    if ending.signal:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(ending.signal, signal.SIG_DFL)
        os.kill(os.getpid(), ending.signal)  # the process dies by the signal, as without us
    return ending.code


@contextmanager
def _compile_for(device_type: str, redirects: list[int]) -> Iterator[None]:
    """``torch.compile`` with no backend (or ``"inductor"``) compiles for ``device_type``.

    Inductor's ``mode``/``options`` mean nothing to another backend and are dropped (counted
    like the rest in ``redirects[0]``).
    """
    original = torch.compile

    @functools.wraps(original)
    def compile_for_device(*args: Any, backend: Any = "inductor", **kwargs: Any) -> Any:
        if backend == "inductor":
            backend = device_type
            kwargs.pop("mode", None)
            kwargs.pop("options", None)
            redirects[0] += 1
        return original(*args, backend=backend, **kwargs)

    torch.compile = compile_for_device
    try:
        yield
    finally:
        torch.compile = original


def _report(options: RunOptions, device: torch.device, ending: Ending, started: float,
            wall: float, sampler: MemorySampler | None, compile_redirects: int) -> None:
    """Print the report to stderr and write its files; a report that fails says so and never
    changes how the run ends."""
    from accelkit._run import report as run_report

    try:
        memory = sampler.stop() if sampler is not None else []
        built = run_report.build(
            target=options.target, device=device, ending=ending.as_dict(), started=started,
            wall_seconds=wall, memory=memory, sample_interval=sampler.interval if sampler else None,
            compile_requested=options.compile, compile_redirects=compile_redirects,
        )
        written = run_report.write(built, options.report_dir) if options.report_dir else []
        if built["rank"] in (None, 0):
            print(run_report.render_text(built, written), file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - the script's ending matters more than its report
        print(f"accelkit run: the report could not be made: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc()
