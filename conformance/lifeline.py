"""Ties between the processes of a run, so that none of them outlives the run.

A run of one backend is three generations of processes::

    accelkit conformance run         the runner (runner.py)
      └─ python -m pytest -n N       the controller: leads its own process group, writes results.jsonl
           ├─ the sentinel           a small process in the group that outlives the controller
           └─ pytest-xdist workers   run the tests; in the controller's group, as is whatever they start

Killing one of them, even with SIGKILL, must not leave the others running: a controller whose
runner is gone would go on appending to ``results.jsonl``, and workers whose controller is gone
would go on computing for nobody. The ties:

- **runner → controller: a lifeline pipe.** The runner holds the write end and never writes;
  the controller reads the other end in a thread (:func:`watch_runner`). End of file means the
  runner is gone, however it died; the controller then stops writing results (between two
  lines, so none is torn) and kills its whole process group with SIGKILL.
- **controller → group: the sentinel.** The controller starts it with the read end of a pipe
  whose write end only the controller holds. When the controller dies, however, the sentinel
  reads end of file and kills the group: workers and whatever tests started.
- **controller → workers, on Linux:** the kernel also sends each worker SIGKILL when the
  controller dies (``prctl(PR_SET_PDEATHSIG)``, :func:`die_with_parent`), sentinel or not.
- **the survivor sweeps:** the runner kills the controller's group once the controller has
  exited (:func:`end_group`), which also takes what a crashed worker left behind.

Stopping gently is the runner's job: Ctrl-C or SIGTERM make it send SIGINT to the group (pytest
records the interruption, the run is marked incomplete), then SIGKILL after a grace period. A
SIGTERM sent to the controller itself does the same (:func:`watch_runner`).

Out of reach: a process a test starts in a session or group of its own, and the group when the
controller and its sentinel are both killed at once (the workers still die, on Linux; nothing is
written to the results by then, as only the controller writes).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping

#: Set by the runner for the controller: the file descriptor of the lifeline's read end.
LIFELINE_ENV = "ACCELKIT_CONFORMANCE_LIFELINE"
#: Set by the controller for its workers when the runner made it lead a process group of its
#: own: that group's id, which is the controller's pid (the parent a worker must not outlive).
GROUP_ENV = "ACCELKIT_CONFORMANCE_GROUP"

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


# -- the runner's side ------------------------------------------------------------------------------


class Lifeline:
    """The runner's end of one controller's lifeline (one per controller started).

    Pass :meth:`environ` and :attr:`pass_fds` to ``subprocess.Popen``, call :meth:`started` once
    the child exists, and :meth:`close` when it has been reaped. If the runner dies first, the
    kernel closes the write end for it, and the controller ends its group.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # both non-inheritable; pass_fds hands the read end on

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read,) if self._read >= 0 else ()

    def environ(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` plus the variable that tells the controller where its lifeline is."""
        return {**env, LIFELINE_ENV: str(self._read)}

    def started(self) -> None:
        """Close the runner's copy of the read end (the controller has its own)."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def close(self) -> None:
        self.started()
        if self._write >= 0:
            os.close(self._write)
            self._write = -1


def has_exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has exited, without reaping it where the platform allows.

    While an exited child is not reaped its pid stays taken, so its process group id cannot be
    reused by an unrelated group before :func:`end_group` kills what is left of the group.
    """
    if proc.returncode is not None:
        return True
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return proc.poll() is not None
    try:
        return waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped elsewhere
        return proc.poll() is not None


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads (the controller's: itself and the workers)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def end_group(proc: subprocess.Popen) -> int:
    """Kill what is left of ``proc``'s process group with SIGKILL, then reap ``proc``.

    Returns its exit status (negative: the signal that ended it).
    """
    signal_group(proc, signal.SIGKILL)
    return proc.wait()


# -- the controller's side ---------------------------------------------------------------------------

#: The sentinel's program: wait for the end of file on argv[1], then kill process group argv[2].
_SENTINEL = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupted run still needs its sentinel
fd, group = int(sys.argv[1]), int(sys.argv[2])
try:
    while os.read(fd, 1):
        pass
except OSError:
    pass
os.killpg(group, signal.SIGKILL)
"""


def watch_runner(stop_writing: Callable[[], None]) -> bool:
    """In a controller the runner started: tie the run's group to the runner and to this process.

    - A thread waits on the lifeline; at its end of file it calls ``stop_writing`` (which must
      return only once no result line is being written, and prevent further ones), then kills
      this process's group with SIGKILL.
    - A sentinel process kills the group when this process dies.
    - SIGTERM interrupts the group with SIGINT, as Ctrl-C interrupts a pytest run.

    Returns False, doing nothing, outside such a run.
    """
    value = os.environ.pop(LIFELINE_ENV, None)  # not for the workers: the fd is not theirs
    if value is None:
        return False
    try:
        fd = int(value)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.set_inheritable(fd, False)
    except (ValueError, OSError):
        return False
    group = os.getpgrp() if os.getpgrp() == os.getpid() else None  # the runner made it lead one
    if group is not None:
        os.environ[GROUP_ENV] = str(group)
        _start_sentinel(group)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda signum, frame: os.killpg(group, signal.SIGINT))
        # The runner stops a run with SIGINT. Started from a background job (``cmd &`` in a script,
        # nohup, some CI runners), this process inherits SIGINT ignored, and Python then never
        # raises KeyboardInterrupt: take it back, for this process and the workers it starts.
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def watch() -> None:
        try:
            while os.read(fd, 1):  # the runner never writes: this returns b"" once it is gone
                pass
        except OSError:
            pass
        try:
            stop_writing()
        finally:
            _end_run(group)

    threading.Thread(target=watch, name="accelkit-conformance-lifeline", daemon=True).start()
    return True


def _start_sentinel(group: int) -> None:
    read, write = os.pipe()  # this process keeps the write end, and gives it to no child
    try:
        subprocess.Popen([sys.executable, "-S", "-E", "-c", _SENTINEL, str(read), str(group)],
                         pass_fds=(read,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, cwd="/")
    except OSError:
        os.close(write)
    finally:
        os.close(read)
    # `write` stays open, unused, until this process ends: that end of file is the sentinel's cue.


# -- a worker's side ----------------------------------------------------------------------------------


def die_with_parent() -> None:
    """In a worker (a child of the controller): on Linux, have the kernel send this process
    SIGKILL when the controller dies. Elsewhere the sentinel ends the group (see the module)."""
    parent = _int(os.environ.get(GROUP_ENV)) or os.getppid()
    if _parent_death_signal(signal.SIGKILL) and os.getppid() != parent:
        _end_run(None)  # the controller died before the signal was armed


def _parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0


def _end_run(group: int | None) -> None:
    """SIGKILL the run's process group, or this process alone when it leads none."""
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None
