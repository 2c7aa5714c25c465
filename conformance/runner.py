"""``accelkit conformance run``: one pytest subprocess per backend, a progress bar, result files.

For each backend (one after the other; PyTorch allows one PrivateUse1 backend per process)::

    python -m pytest <suite files> -p accelkit_conformance.plugin --accelkit-backend NAME
        -n JOBS --timeout T ...        (pytest-xdist workers; pytest-timeout)

Worker processes isolate crashes: a test that kills its worker is recorded as ``crash`` and
the worker is replaced. A test that hangs is stopped by pytest-timeout (``timeout``), or, if
it cannot be interrupted, its worker is killed by a watchdog and the test recorded as
``timeout``. The controller appends each record to ``OUT/NAME/results.jsonl`` as it
finishes; at the end this module writes ``results.json``, ``report.md`` and ``report.html``
next to it; the pytest output is in ``pytest.log`` and each worker's faulthandler log (the
source of crash reasons) in ``.workers/``.

No process of a run outlives it: the pytest subprocess leads a process group with its workers,
which is killed when this process dies (even by SIGKILL), and whatever the subprocess leaves
behind is killed when it exits (:mod:`accelkit_conformance.lifeline`). Ctrl-C and SIGTERM
interrupt the run, keep what it recorded and write the reports of the partial run, marked
incomplete (exit status 130).

Exit status: 0 when every run completed without a failing outcome (fail, error, crash,
timeout; with ``--strict`` also xpass), 1 when some test has one, 2 when a run could not
complete or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from accelkit_conformance import lifeline, profiles, schema, upstream_files
from accelkit_conformance.cases import SUITE_FILES

PACKAGE_DIR = Path(__file__).resolve().parent
SUITES_DIR = PACKAGE_DIR / "suites"
DEFAULT_COMPILE_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "accelkit" / "compile-cache"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``accelkit conformance run``."""
    parser.add_argument("--backend", action="append", required=True, metavar="NAME",
                        help="backend to test; repeat for several (one subprocess each)")
    parser.add_argument("--profile", choices=sorted(profiles.PROFILES), default="quick",
                        help="quick: CI-sized (minutes); full: every sample, default dtypes, backward")
    parser.add_argument("--jobs", "-j", type=int, default=max(1, min(os.cpu_count() or 1, 8)), metavar="N",
                        help="worker processes per backend (at least 1; default: CPU count, at most 8)")
    parser.add_argument("--out", default="conformance-results", metavar="DIR",
                        help="output directory; results go to DIR/<backend>/ (default: ./conformance-results)")
    parser.add_argument("--dtypes", default=None, metavar="LIST",
                        help="comma-separated dtypes for ops and modules (default: the profile's)")
    parser.add_argument("--suite", action="append", choices=sorted([*SUITE_FILES, "upstream"]), default=None,
                        help="run only this suite; repeat for several (default: all; upstream with --pytorch-tests)")
    parser.add_argument("--pytorch-tests", default=None, metavar="DIR",
                        help="upstream suite: a PyTorch checkout's test/ directory, whose device-generic files "
                             "run instantiated for the backend")
    parser.add_argument("--files", default=None, metavar="LIST",
                        help="upstream suite: comma-separated test files in DIR, e.g. test_ops.py,test_view_ops.py "
                             "(default: every test_*.py in DIR)")
    parser.add_argument("--bypass-device-restrictions", action="store_true",
                        help="upstream suite: also run tests PyTorch restricts to CUDA or native devices "
                             "(onlyCUDA, onlyNativeDeviceTypes, onlyOn)")
    parser.add_argument("--compile-cache", default=str(DEFAULT_COMPILE_CACHE), metavar="DIR",
                        help="persistent compile cache shared by runs (ACCELKIT_COMPILE_CACHE; default: %(default)s); "
                             "a second run reuses the programs the first compiled")
    parser.add_argument("--no-compile-cache", action="store_true", help="compile everything afresh")
    parser.add_argument("--expectations", default=None, metavar="FILE",
                        help="a TOML file of further expectations (same format as the backend's conformance.toml), "
                             "e.g. declared upstream tests; its [capabilities] replace the backend's")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="pytest -k expression selecting tests, e.g. 'add and float32'")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="per-test timeout (default: the profile's)")
    parser.add_argument("--fallback", choices=("deny", "warn", "allow"), default=None,
                        help="CPU-fallback policy for the run (sets ACCELKIT_FALLBACK; default: the backend's)")
    parser.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failing test")
    parser.add_argument("--junitxml", action="store_true", help="also write DIR/<backend>/junit.xml")
    parser.add_argument("--strict", action="store_true", help="exit 1 on xpass too (stale expectations)")
    parser.add_argument("--no-report", action="store_true", help="skip writing report.md and report.html")
    parser.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS",
                        help="further arguments for pytest, after '--'")


def pytest_command(backend: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The pytest command line that runs the suites for ``backend`` into ``out``."""
    profile = profiles.get(args.profile)
    timeout = args.timeout if args.timeout is not None else profile.timeout
    jobs = max(1, int(args.jobs))
    suites = _suites(args)
    cmd = [
        sys.executable, "-m", "pytest",
        *(str(SUITES_DIR / SUITE_FILES[s]) for s in suites if s != "upstream"),
        # The directory, not its files: node ids are then relative to it (test_x.py::TestX::test_y).
        *((str(Path(args.pytorch_tests).resolve()),) if "upstream" in suites else ()),
        "-p", "accelkit_conformance.plugin",
        "--accelkit-backend", backend,
        "--accelkit-profile", profile.name,
        "--accelkit-out", str(out),
        "--accelkit-hard-timeout", str(timeout + max(10.0, timeout / 4)),
        # Worker processes: a test that kills its worker costs that test only.
        "-n", str(jobs), "--max-worker-restart", "100000",
        "--timeout", str(timeout), "--timeout-method", "signal",
        # The suites' own configuration, whatever directory the user is in.
        "--rootdir", str(PACKAGE_DIR), "-c", os.devnull, "-p", "no:cacheprovider",
        # No suite uses it, and it imports all of hypothesis when each process ends its session.
        "-p", "no:hypothesispytest",
        "-q", "-rN", "--tb=line", "--color=no", "-W", "ignore::DeprecationWarning",
    ]
    if args.dtypes:
        cmd += ["--accelkit-dtypes", args.dtypes]
    if args.expectations:
        cmd += ["--accelkit-expectations", str(Path(args.expectations).resolve())]
    if "upstream" in suites:
        files = upstream_files.test_files(Path(args.pytorch_tests), args.files)
        cmd += ["--accelkit-upstream-files", ",".join(str(f.resolve()) for f in files)]
    if args.bypass_device_restrictions:
        cmd += ["--accelkit-bypass-device-restrictions"]
    if args.keyword:
        cmd += ["-k", args.keyword]
    if args.exitfirst:
        cmd += ["-x"]
    if args.junitxml:
        cmd += ["--junitxml", str(out / "junit.xml")]
    return cmd + list(args.pytest_args)


def _suites(args: argparse.Namespace) -> list[str]:
    """The suites to run: as asked, else all of accelkit's, and upstream when a PyTorch test
    directory is given.

    :raises ValueError: upstream without a test directory.
    """
    suites = args.suite or [*SUITE_FILES, *(("upstream",) if args.pytorch_tests else ())]
    if "upstream" in suites and not args.pytorch_tests:
        raise ValueError("--suite upstream needs --pytorch-tests DIR (a PyTorch checkout's test/ directory)")
    return suites


def _environ(args: argparse.Namespace, backend: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"}
    if "upstream" in _suites(args):
        directory = str(Path(args.pytorch_tests).resolve())
        env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = backend  # only the backend's instantiations
        env["PYTHONPATH"] = os.pathsep.join(p for p in (directory, env.get("PYTHONPATH")) if p)
    env["ACCELKIT_AUTOLOAD"] = "0"  # the workers activate the backend themselves
    if args.no_compile_cache:
        env.pop("ACCELKIT_COMPILE_CACHE", None)
    else:  # compiling dominates a run on a backend that compiles per op and shape (tpu)
        env["ACCELKIT_COMPILE_CACHE"] = str(Path(args.compile_cache).expanduser().resolve())
    if profiles.get(args.profile).fast_compile:
        env.setdefault("ACCELKIT_FAST_COMPILE", "1")  # accelkit.sdk.FAST_COMPILE_ENV; one the user set wins
    env["PYTHONFAULTHANDLER"] = "1"
    if "OMP_NUM_THREADS" not in env:  # N workers x all cores of threads each oversubscribes
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, args.jobs)))
    if args.fallback:
        env["ACCELKIT_FALLBACK"] = args.fallback
    return env


class Progress:
    """A one-line progress display fed from ``results.jsonl`` (a plain line log when not a tty)."""

    def __init__(self, backend: str, stream: TextIO):
        self.backend = backend
        self.stream = stream
        self.tty = stream.isatty()
        self.start = time.monotonic()
        self.last_log = 0.0
        self.total: int | None = None
        self.counts = dict.fromkeys(schema.OUTCOMES, 0)
        self._offset = 0
        self._partial = b""

    def poll(self, path: Path) -> None:
        """Read the lines appended to ``path`` since the last poll and redraw."""
        import json

        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("event") == "collected":
                self.total = obj["total"]
            elif "outcome" in obj:
                self.counts[obj["outcome"]] += 1
        self.draw()

    def line(self) -> str:
        done = sum(self.counts.values())
        total = self.total
        elapsed = time.monotonic() - self.start
        if total:
            width = 28
            filled = int(width * min(done, total) / total)
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
            eta = f" eta {_clock(elapsed / done * (total - done))}" if done else ""
        else:
            bar, eta = f"collecting... {done}", ""
        shown = ", ".join(f"{n} {o}" for o, n in self.counts.items() if n)
        return f"{self.backend}: {bar} {_clock(elapsed)}{eta}  {shown}"

    def draw(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            text = self.line()
            cols = 120
            try:
                cols = os.get_terminal_size(self.stream.fileno()).columns
            except OSError:
                pass
            self.stream.write("\r" + text[: cols - 1].ljust(cols - 1) + ("\n" if final else ""))
            self.stream.flush()
        elif final or now - self.last_log >= 30:
            self.last_log = now
            self.stream.write(self.line() + "\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


def run_backend(backend: str, args: argparse.Namespace, stream: TextIO = sys.stderr) -> dict[str, Any]:
    """Run the suites for one backend in a subprocess; return its assembled results document.

    The pytest subprocess leads a process group of its own, tied to this process by a lifeline
    (:mod:`accelkit_conformance.lifeline`): if this process dies, the group is killed. On
    KeyboardInterrupt (Ctrl-C, or SIGTERM through :func:`run_command`) the group is interrupted,
    killed if it does not stop within a grace period, and the partial results are assembled;
    the :class:`Interrupted` raised then carries them.
    """
    from accelkit_conformance.results import JSONL, assemble, drop_torn_tail

    out = Path(args.out) / backend
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("results.jsonl", "results.json", "report.md", "report.html", "junit.xml"):
        (out / stale).unlink(missing_ok=True)
    shutil.rmtree(out / ".workers", ignore_errors=True)  # per-worker crash logs of an earlier run
    shared = out / ".shared"  # what the workers compute once for all (accelkit_conformance.once)
    shutil.rmtree(shared, ignore_errors=True)
    cmd = pytest_command(backend, args, out)
    progress = Progress(backend, stream)
    interrupted = False
    with open(out / "pytest.log", "w", encoding="utf-8") as log:
        log.write("$ " + shlex.join(cmd) + "\n\n")
        log.flush()
        life = lifeline.Lifeline()
        try:
            # A group of its own: it can be interrupted and killed as a whole, workers and what
            # tests started included, and a Ctrl-C in the terminal reaches this process only.
            env = {**_environ(args, backend), "ACCELKIT_CONFORMANCE_SHARED": str(shared)}  # once.SHARED_ENV
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=life.environ(env),
                                    pass_fds=life.pass_fds, process_group=0)
            life.started()
            try:
                while not lifeline.has_exited(proc):
                    time.sleep(0.5)
                    progress.poll(out / JSONL)
            except KeyboardInterrupt:
                interrupted = True
                _stop(proc)
            finally:
                returncode = lifeline.end_group(proc)  # strays of a crashed or killed run too
        finally:
            life.close()
            shutil.rmtree(shared, ignore_errors=True)
        if (out / JSONL).exists():
            drop_torn_tail(out / JSONL)  # the writer is dead: a cut last line can only be its last
        progress.poll(out / JSONL)
        progress.draw(final=True)
    if not (out / JSONL).exists() or not (out / JSONL).stat().st_size:
        if interrupted:
            raise KeyboardInterrupt  # before the suite started: nothing to assemble
        tail = (out / "pytest.log").read_text(errors="replace").strip().splitlines()[-15:]
        raise RunError(f"{backend}: the suite did not start (exit status {returncode}); "
                       f"the end of {out / 'pytest.log'}:\n  " + "\n  ".join(tail))
    path = assemble(out)
    doc = schema.load_results(path)
    if interrupted:
        raise Interrupted(doc)
    if not doc["complete"] and returncode not in (0, 1):
        stream.write(f"{backend}: the run ended early (pytest exit status {returncode}); "
                     f"see {out / 'pytest.log'}\n")
    return doc


def _stop(proc: subprocess.Popen) -> None:
    """Stop the run: SIGINT to its group (pytest records the interruption, workers stop), then SIGKILL."""
    for sig, wait in ((signal.SIGINT, 15.0), (signal.SIGKILL, 5.0)):
        lifeline.signal_group(proc, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if lifeline.has_exited(proc):
                return
            time.sleep(0.1)


class Interrupted(KeyboardInterrupt):
    """The run was interrupted; ``doc`` is the assembled partial results (``complete`` False)."""

    def __init__(self, doc: dict[str, Any]):
        super().__init__()
        self.doc = doc


class RunError(Exception):
    """A backend's run could not start or finish; the message says why and where to look."""


def write_reports(directory: Path, paths: Sequence[Path]) -> list[Path]:
    """Write ``report.md`` and ``report.html`` for the results at ``paths`` into ``directory``.

    Returns the files written; nothing when the report module is unavailable.
    """
    try:
        from accelkit_conformance import report
    except ImportError:
        return []
    from accelkit_conformance.results import write_text_atomically

    runs = [report.load_results(p) for p in paths]
    return [write_text_atomically(directory / name, render(runs))
            for name, render in (("report.md", report.render_markdown), ("report.html", report.render_html))]


def run_command(args: argparse.Namespace) -> int:
    """Run ``accelkit conformance run`` with parsed ``args``; returns the exit status."""
    if args.jobs < 1:
        print("accelkit: error: --jobs must be at least 1 (workers isolate crashes)", file=sys.stderr)
        return 2
    import importlib.util

    missing = [dist for dist, module in (("pytest-xdist", "xdist"), ("pytest-timeout", "pytest_timeout"),
                                         ("expecttest", "expecttest")) if importlib.util.find_spec(module) is None]
    if missing:
        print(f"accelkit: error: the conformance suite needs {', '.join(missing)}; "
              "install them with: pip install 'accelkit[conformance]'", file=sys.stderr)
        return 2
    try:
        if "upstream" in _suites(args):
            upstream_files.test_files(Path(args.pytorch_tests), args.files)
        if args.expectations and not Path(args.expectations).is_file():
            raise ValueError(f"--expectations {args.expectations}: no such file")
    except ValueError as exc:
        print(f"accelkit: error: {exc}", file=sys.stderr)
        return 2

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # stop pytest and keep what it recorded, as on Ctrl-C

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        return _run_all(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_all(args: argparse.Namespace) -> int:
    status = 0
    done: list[Path] = []
    for backend in dict.fromkeys(args.backend):
        started = time.monotonic()
        try:
            doc = run_backend(backend, args)
        except RunError as exc:
            print(f"accelkit: error: {exc}", file=sys.stderr)
            status = 2
            continue
        except KeyboardInterrupt as exc:
            out = Path(args.out) / backend
            reports = []
            if isinstance(exc, Interrupted) and not args.no_report:
                reports = write_reports(out, [out / "results.json"])  # marked as an incomplete run
            print(f"\ninterrupted; the results so far are in {out}"
                  + "".join(f"\n  report:  {r}" for r in reports), file=sys.stderr)
            return 130
        out = Path(args.out) / backend
        done.append(out / "results.json")
        tally = schema.counts(doc["results"])
        bad = sum(tally[o] for o in schema.BAD_OUTCOMES) + (tally[schema.XPASS] if args.strict else 0)
        if not doc["complete"]:
            status = 2
        elif bad:
            status = max(status, 1)
        reports = [] if args.no_report else write_reports(out, [out / "results.json"])
        summary = ", ".join(f"{n} {o}" for o, n in tally.items() if n) or "no tests"
        print(f"{backend}: {summary} in {_clock(time.monotonic() - started)}"
              f"{'' if doc['complete'] else ' (INCOMPLETE)'}")
        print(f"  results: {out / 'results.json'}" + "".join(f"\n  report:  {r}" for r in reports))
    if len(done) > 1 and not args.no_report:
        for r in write_reports(Path(args.out), done):
            print(f"side by side: {r}")
    return status
