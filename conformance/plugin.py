"""The pytest plugin that runs the conformance suites against one accelkit backend.

Load it with ``-p accelkit_conformance.plugin --accelkit-backend NAME``. It is inert without
``--accelkit-backend``. Roles, with pytest-xdist (``-n N``):

- **workers** activate the backend (before any suite imports PyTorch's test databases), mark
  declared skips and expected failures at collection, measure each test (dispatch paths,
  fallbacks, compilations) and attach the measurements to its reports. A watchdog in C
  (``faulthandler.dump_traceback_later``) kills a worker whose test hangs past the hard
  timeout, even with the GIL held; a fatal signal is written to the same per-worker file.
- **the controller** never runs tests. It turns the reports of each test, or the news that a
  worker died running it, into one result record and appends it to ``results.jsonl`` at once.

Workers die with the controller, and a controller started by ``accelkit conformance run`` ends
its run when the runner dies (:mod:`accelkit_conformance.lifeline`).

Without xdist one process does both.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from accelkit.sdk import UnsupportedDtypeError
from accelkit_conformance import expectations, lifeline, profiles, schema, session
from accelkit_conformance.cases import parse_nodeid
from accelkit_conformance.recording import Recorder

_TIMEOUT_MESSAGE = "Timeout (>"  # pytest-timeout's failure message starts so
_PROPERTY = "accelkit"
_REASON_LIMIT = 2000


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("accelkit", "accelkit conformance")
    group.addoption("--accelkit-backend", help="accelkit backend to test (activates the plugin)")
    group.addoption("--accelkit-profile", default="quick", choices=sorted(profiles.PROFILES),
                    help="how much of each suite to run (default: quick)")
    group.addoption("--accelkit-dtypes", default=None,
                    help="comma-separated dtypes for the ops and modules suites (default: the profile's)")
    group.addoption("--accelkit-out", default=None,
                    help="directory for results.jsonl (the controller writes it)")
    group.addoption("--accelkit-hard-timeout", type=float, default=None,
                    help="seconds after which a hung worker is killed and its test recorded as timeout")
    group.addoption("--accelkit-expectations", default=None,
                    help="a TOML file of further expectations, on top of the backend's own")
    group.addoption("--accelkit-upstream-files", default=None,
                    help="upstream suite: the test files to collect (comma-separated paths); others are ignored")
    group.addoption("--accelkit-bypass-device-restrictions", action="store_true",
                    help="upstream tests: run tests PyTorch restricts to CUDA or native devices on the backend")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _distributing(config: pytest.Config) -> bool:
    return not _is_worker(config) and bool(getattr(config.option, "numprocesses", None)) and \
        getattr(config.option, "dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    backend = config.getoption("accelkit_backend")
    if not backend:
        return
    if _is_worker(config):
        lifeline.die_with_parent()  # a worker must not outlive the controller it reports to
    profile = profiles.get(config.getoption("accelkit_profile"))
    dtypes_opt = config.getoption("accelkit_dtypes")
    dtypes = tuple(d.strip() for d in dtypes_opt.split(",") if d.strip()) if dtypes_opt else profile.dtypes
    import torch

    bad = [d for d in dtypes if not isinstance(getattr(torch, d, None), torch.dtype)]
    if bad:
        raise pytest.UsageError(f"--accelkit-dtypes: {', '.join(bad)} not torch dtype names (e.g. float32,int64)")
    try:
        declared = expectations.load(backend, config.getoption("accelkit_expectations"))
    except (LookupError, ValueError) as exc:
        raise pytest.UsageError(f"accelkit conformance: {exc}") from None
    from accelkit.sdk import backends

    probe = backends()[backend].probe()
    if not probe.available:
        raise pytest.UsageError(f"accelkit conformance: backend {backend!r} cannot run here: {probe.reason}")
    runs_tests = not _distributing(config)
    device = None
    out = config.getoption("accelkit_out")
    workers_dir = Path(out) / ".workers" if out else None
    if runs_tests:
        import accelkit

        try:
            device = accelkit.select_device(backend)
        except accelkit.AccelkitError as exc:
            raise pytest.UsageError(f"accelkit conformance: cannot activate {backend!r}: {exc}") from None
        if workers_dir is not None:
            workers_dir.mkdir(parents=True, exist_ok=True)
            name = os.environ.get("PYTEST_XDIST_WORKER", "main")
            # Fatal signals and the hang watchdog write here; the controller reads it on a crash.
            config._accelkit_crash_file = open(workers_dir / f"{name}.log", "w")  # noqa: SIM115
    session.install(session.Settings(backend, profile, dtypes, declared, device))
    if runs_tests and not config.getoption("accelkit_upstream_files", None):
        from accelkit_conformance.sample_draws import draw_on_the_cpu

        draw_on_the_cpu(device.type)
    if runs_tests and config.getoption("accelkit_bypass_device_restrictions"):
        from accelkit_conformance.upstream_files import bypass_device_restrictions

        bypass_device_restrictions()
    if runs_tests:
        config.pluginmanager.register(_Worker(config, declared), "accelkit-conformance-worker")
    if not _is_worker(config):
        controller = _Controller(config, declared, profile, dtypes, workers_dir)
        config.pluginmanager.register(controller, "accelkit-conformance-controller")
        # Started by `accelkit conformance run`: if the runner dies, stop writing and end the run.
        lifeline.watch_runner(stop_writing=controller.writer.close if controller.writer else lambda: None)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Upstream suite: collect the chosen files of the PyTorch test directory, nothing else in it."""
    chosen = config.getoption("accelkit_upstream_files", None)
    if not chosen:
        return None
    files = [Path(f) for f in chosen.split(",")]
    roots = {f.parent for f in files}
    inside = any(collection_path == root or root in collection_path.parents for root in roots)
    if not inside or collection_path in roots:
        return None
    wanted = collection_path in files or any(collection_path in f.parents for f in files)
    return None if wanted else True


@pytest.fixture
def recorder(request: pytest.FixtureRequest):
    """This test's :class:`~accelkit_conformance.recording.Recorder`.

    While the test runs, the CPU fallback is allowed except inside ``recorder.measure()``,
    where the run's policy applies (see :mod:`accelkit_conformance.recording`).
    """
    import accelkit

    policy = accelkit.stats()["fallback_policy"]
    rec = request.node._accelkit_recorder = Recorder(policy)
    with accelkit.fallback_policy("allow"):
        yield rec


def _reason(excinfo: Any) -> str:
    exc = excinfo.value
    text = getattr(exc, "msg", None) if isinstance(exc, pytest.skip.Exception) else None
    text = text if text is not None else f"{excinfo.typename}: {exc}"
    return text if len(text) <= _REASON_LIMIT else text[: _REASON_LIMIT - 3] + "..."


class _Worker:
    """Runs in each process that executes tests."""

    def __init__(self, config: pytest.Config, declared: expectations.Declared):
        self.config = config
        self.declared = declared
        self.hard_timeout = config.getoption("accelkit_hard_timeout")
        self.crash_file = getattr(config, "_accelkit_crash_file", None)

    def pytest_sessionstart(self) -> None:
        # After every plugin's configure (pytest's faulthandler plugin points it at stderr).
        if self.crash_file is not None:
            import threading

            self.crash_file.write(f"main thread 0x{threading.main_thread().ident:016x}\n")
            self.crash_file.flush()
            faulthandler.enable(file=self.crash_file, all_threads=True)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            case = parse_nodeid(item.nodeid, self.declared.backend)
            rule = self.declared.lookup(case) if case else None
            if rule is None:
                continue
            if rule.kind == "skip":
                item.add_marker(pytest.mark.skip(reason=rule.reason), append=False)
            else:
                item.add_marker(pytest.mark.xfail(reason=rule.reason, strict=False))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any):
        watchdog = self.hard_timeout and self.crash_file is not None
        if watchdog:
            faulthandler.dump_traceback_later(self.hard_timeout, exit=True, file=self.crash_file)
        try:
            yield
        finally:
            if watchdog:
                faulthandler.cancel_dump_traceback_later()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        # A test that never calls recorder.measure() is measured as a whole.
        whole = item._accelkit_whole = Recorder()
        with whole.measure():
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        info: dict[str, Any] = {}
        if call.excinfo is not None and not isinstance(call.excinfo.value, pytest.skip.Exception):
            exc = call.excinfo.value
            if isinstance(exc, pytest.fail.Exception) and str(exc).startswith(_TIMEOUT_MESSAGE):
                info["kind"] = schema.TIMEOUT
            elif isinstance(exc, AssertionError):
                info["kind"] = schema.FAIL
            else:
                info["kind"] = schema.ERROR
                refused = getattr(exc, "dtype", None) if isinstance(exc, UnsupportedDtypeError) else None
                if refused is not None:
                    info["refused_dtype"] = str(refused).removeprefix("torch.")
            info["reason"] = _reason(call.excinfo)
        elif call.excinfo is not None:
            info["reason"] = _reason(call.excinfo)
        if call.when == "call":
            rec = getattr(item, "_accelkit_recorder", None)
            whole = getattr(item, "_accelkit_whole", None) or Recorder()
            if rec is not None and not rec.measured:
                rec.paths, rec.fallback_ops, rec.measured = whole.paths, whole.fallback_ops, whole.measured
            info.update((rec or whole).as_record())
        report.user_properties = [*report.user_properties, (_PROPERTY, info)]


_FATAL = re.compile(r"Fatal Python error: (?P<what>[^\n]+)")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


_MAIN = re.compile(r"^main thread (0x[0-9a-f]+)$", re.MULTILINE)
_HUNG = re.compile(r"^Timeout \((?P<span>[^)]*)\)!", re.MULTILINE)


def crash_cause(log: str) -> tuple[str, str]:
    """(outcome, reason) for a worker that died, from its faulthandler log.

    The innermost frame named is the crashing thread's ("Current thread"), else the main
    thread's (the test runs there; the log's first line names it), else the first one dumped.
    """
    block = log.find("Current thread")
    main = _MAIN.search(log)
    if block < 0 and main:
        block = log.find(f"Thread {main.group(1)}")
    frames = _FRAME.findall(log[block:] if block >= 0 else log)
    where = f" in {frames[0][2]} ({Path(frames[0][0]).name}:{frames[0][1]})" if frames else ""
    hung = _HUNG.search(log)
    if hung:
        return schema.TIMEOUT, f"hung for {hung['span']} and was killed by the watchdog{where}"
    fatal = _FATAL.search(log)
    if fatal:
        return schema.CRASH, f"worker crashed: {fatal['what'].strip()}{where}"
    return schema.CRASH, "worker process died without a Python error (killed, or exited from native code)"


class _Controller:
    """Turns reports into records and writes them; runs where the session is controlled."""

    def __init__(self, config: pytest.Config, declared: expectations.Declared, profile: Any,
                 dtypes: tuple[str, ...], workers_dir: Path | None):
        from accelkit_conformance.results import ResultsWriter, environment

        self.config = config
        self.declared = declared
        self.workers_dir = workers_dir
        self.pending: dict[str, list[Any]] = {}
        self.started: dict[str, float] = {}
        self.total: int | None = None
        self.collection_crashes = 0
        self.collected_nodes: set[str] = set()
        self.writer = None
        out = config.getoption("accelkit_out")
        if out:
            jobs = getattr(config.option, "numprocesses", None) or 0
            env = environment(
                declared.backend, profile=profile.name, dtypes=list(dtypes), jobs=int(jobs),
                timeout=getattr(config.option, "timeout", None),
                expectations=declared.expectations.source,
                capabilities=dict(declared.expectations.capabilities),
            )
            self.writer = ResultsWriter(out, env)

    def _declared_dtype_gap(self, dtype_name: str | None) -> tuple[str, str] | None:
        """``(expectation key, reason)`` when ``dtype_name`` is one the backend declares it
        cannot hold, else None."""
        if dtype_name is None:
            return None
        reason = self.declared.expectations.unsupported_dtypes.get(dtype_name)
        if reason is None:
            return None
        return f'unsupported_dtypes "{dtype_name}"', f"needs {dtype_name}, which the backend does not hold: {reason}"

    # -- collection ------------------------------------------------------------------------

    def _collected(self, total: int) -> None:
        if self.total is None:
            self.total = total
            if self.writer:
                self.writer.event("collected", total=total)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.collected_nodes.add(node.gateway.id)
        self._collected(len(ids))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not _distributing(self.config):
            self._collected(len(session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        if error is None or node.gateway.id in self.collected_nodes:
            return
        self.collection_crashes += 1
        limit = max(2, 2 * (getattr(self.config.option, "numprocesses", 1) or 1))
        if self.collection_crashes >= limit:
            dsession = self.config.pluginmanager.getplugin("dsession")
            log = self._worker_log(node.gateway.id)
            if dsession is not None:
                dsession.shouldstop = (
                    f"{self.collection_crashes} workers died before finishing collection; "
                    f"the backend crashes while loading the suites. {crash_cause(log)[1] if log else ''}"
                )

    # -- reports ---------------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.started[nodeid] = time.monotonic()
        self.pending[nodeid] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "???":  # xdist: the worker died running this test
            self._finish(report.nodeid, self.pending.pop(report.nodeid, []), crash=report)
            return
        self.pending.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        if nodeid in self.pending:
            self._finish(nodeid, self.pending.pop(nodeid))

    def _worker_log(self, worker_id: str | None) -> str:
        if self.workers_dir is None or worker_id is None:
            return ""
        try:
            return (self.workers_dir / f"{worker_id}.log").read_text(errors="replace")
        except OSError:
            return ""

    def _finish(self, nodeid: str, reports: list[Any], crash: Any = None) -> None:
        record = self.record_for(nodeid, reports, crash)
        if self.writer is not None and record is not None:
            self.writer.record(record)

    def record_for(self, nodeid: str, reports: list[Any], crash: Any = None) -> dict[str, Any] | None:
        """The result record of ``nodeid`` from its phase reports (or its worker's death)."""
        case = parse_nodeid(nodeid, self.declared.backend)
        if case is None:
            return None
        rule = self.declared.lookup(case)
        phases = {r.when: r for r in reports}
        infos = {r.when: dict(r.user_properties).get(_PROPERTY, {}) for r in reports}
        duration = sum(r.duration for r in reports)
        measured = infos.get("call", {})
        # An upstream test's node id changes with what was instantiated before it: its record
        # is kept under the normalised name, so runs compare.
        shown_id = nodeid if case.suite != "upstream" else f"upstream/{case.op}" + (f"[{case.dtype}]" if case.dtype else "")
        record: dict[str, Any] = {
            "id": shown_id, "suite": case.suite, "op": case.op, "variant": case.variant,
            "dtype": case.dtype, "outcome": None, "reason": None, "expectation": None,
            "duration": round(duration, 4), "paths": measured.get("paths"),
            "fallback_ops": measured.get("fallback_ops", []), "compiles": measured.get("compiles"),
            "dynamic": measured.get("dynamic"), "float_reference": measured.get("float_reference", 0),
        }
        if crash is not None:
            worker = getattr(getattr(getattr(crash, "node", None), "gateway", None), "id", None)
            log = self._worker_log(worker)
            outcome, reason = crash_cause(log) if log else (schema.CRASH, str(crash.longrepr))
            started = self.started.pop(nodeid, None)
            if started is not None:
                record["duration"] = round(time.monotonic() - started, 4)
            record.update(outcome=outcome, reason=reason)
            return record
        self.started.pop(nodeid, None)
        setup, call, teardown = phases.get("setup"), phases.get("call"), phases.get("teardown")
        if setup is not None and setup.skipped:
            if rule is not None and rule.kind == "skip":
                record.update(outcome=schema.SKIP_DECLARED, reason=rule.reason, expectation=rule.key)
            else:
                record.update(outcome=schema.SKIP_OTHER, reason=infos["setup"].get("reason") or _longrepr(setup))
        elif setup is not None and setup.failed:
            record.update(outcome=infos["setup"].get("kind", schema.ERROR),
                          reason=infos["setup"].get("reason") or _longrepr(setup))
        elif call is not None:
            kind, reason = infos["call"].get("kind"), infos["call"].get("reason")
            xfailed = hasattr(call, "wasxfail") and rule is not None and rule.kind == "xfail"
            if kind == schema.TIMEOUT:
                record.update(outcome=schema.TIMEOUT, reason=reason)
            elif call.passed and xfailed:
                where = f" in {self.declared.expectations.source}" if self.declared.expectations.source else ""
                record.update(outcome=schema.XPASS, expectation=rule.key,
                              reason=f"passes although declared to fail ({rule.reason}): remove {rule.key}{where}")
            elif call.passed:
                record.update(outcome=schema.PASS)
            elif xfailed:
                record.update(outcome=schema.XFAIL, expectation=rule.key, reason=f"{rule.reason} [{reason}]")
            elif call.skipped:
                record.update(outcome=schema.SKIP_OTHER, reason=reason or _longrepr(call))
            elif (declared := self._declared_dtype_gap(infos["call"].get("refused_dtype"))) is not None:
                # A test in a supported dtype whose op needs a refused one internally (a float32
                # sample with a float64 argument, a complex intermediate): the declared gap.
                record.update(outcome=schema.SKIP_DECLARED, reason=declared[1], expectation=declared[0])
            else:
                record.update(outcome=kind or schema.ERROR, reason=reason or _longrepr(call))
        else:  # no setup report at all: the session was interrupted
            return None
        if teardown is not None and teardown.failed and record["outcome"] in (schema.PASS, schema.XPASS):
            why = infos["teardown"].get("reason") or _longrepr(teardown)
            record.update(outcome=schema.ERROR, reason=f"teardown: {why}")
        return record

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.writer is None:
            return
        complete = self.total is not None and self.writer.written >= self.total and \
            exitstatus not in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
        at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.writer.event("finished", complete=bool(complete), exitstatus=int(exitstatus), at=at)
        self.writer.close()


def _longrepr(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message)[:_REASON_LIMIT]
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")[:_REASON_LIMIT]
    return str(longrepr)[:_REASON_LIMIT] if longrepr else ""
