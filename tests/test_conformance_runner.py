"""The conformance runner: crash and hang isolation, incremental results, the result schema,
declared skips and expected failures, and the ``accelkit conformance run`` command.

The runner is exercised as users run it, in subprocesses, against a fake backend written to
``tmp_path``: a plugin package found through a ``*.dist-info/entry_points.txt`` on PYTHONPATH,
exactly as an installed third-party backend is. Its kernels misbehave on purpose:

========  =======================================================================
``sin``   segfaults (reads address 0)
``cos``   sleeps (pytest-timeout interrupts it)
``tan``   blocks SIGALRM, then sleeps (only the watchdog can stop it)
``exp``   returns wrong values
``neg``   is correct, but declared as an expected failure (so it is an xpass)
``abs``   is declared unsupported (a declared skip)
``sqrt``  needs float64 internally, which fake declares it does not hold (a declared skip)
``rsqrt`` needs float16 internally, which fake does not declare (an error)
========  =======================================================================

The kill tests run the contract suite on ref with a pytest plugin that makes each worker hang in
its second test with a child process of its own, and find the run's processes by their process
group (the pytest subprocess leads one) through ``/proc``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from accelkit.sdk import Expectations
from accelkit_conformance import schema
from accelkit_conformance.cases import Case, parse_nodeid
from accelkit_conformance.plugin import crash_cause
from accelkit_conformance.recording import Recorder
from accelkit_conformance.results import ResultsWriter, drop_torn_tail

FAKE_PLUGIN = '''
import ctypes
import signal
import time

import torch

from accelkit.sdk import BackendInfo, DeviceProbe, KernelTable, hookimpl

NAME = "fake"
aten = torch.ops.aten
kernels = KernelTable(NAME)


@kernels.kernel(aten.sin.default)
def sin(x):
    ctypes.string_at(0)  # SIGSEGV


@kernels.kernel(aten.cos.default)
def cos(x):
    time.sleep(600)


@kernels.kernel(aten.tan.default)
def tan(x):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)


@kernels.kernel(aten.exp.default)
def exp(x):
    return torch.exp(x) + 1


@kernels.kernel(aten.neg.default)
def neg(x):
    return torch.neg(x)


@kernels.kernel(aten.sqrt.default)
def sqrt(x):
    from accelkit.sdk import UnsupportedDtypeError

    raise UnsupportedDtypeError("torch.float64 is not supported on fake:0", torch.float64)


@kernels.kernel(aten.rsqrt.default)
def rsqrt(x):
    from accelkit.sdk import UnsupportedDtypeError

    raise UnsupportedDtypeError("torch.float16 is not supported on fake:0", torch.float16)


@hookimpl
def accelkit_register_backend():
    return BackendInfo(name=NAME, description="misbehaving test backend", default_fallback="allow")


@hookimpl
def accelkit_probe():
    return DeviceProbe(available=True, simulated=True, device_count=1, target="fake-1")


@hookimpl
def accelkit_device_model():
    from accelkit_backends.ref.device import device_model

    return device_model()


@hookimpl
def accelkit_make_allocator(device_model):
    from accelkit_backends.ref.buffers import RefAllocator

    return RefAllocator(f"{NAME}:0", device_model.memory_bytes)


@hookimpl
def accelkit_kernels():
    return kernels

# No accelkit_conformance_expectations: the core reads the conformance.toml next to this file.
'''

FAKE_EXPECTATIONS = '''
[unsupported]
"ops/abs" = "abs is not implemented on fake"

[known_failures]
"ops/neg" = "neg is believed broken on fake"

[unsupported_dtypes]
float64 = "fake holds no float64"
'''


@pytest.fixture(scope="module")
def fake_site(tmp_path_factory) -> Path:
    """A directory that, on PYTHONPATH, installs the ``fake`` backend plugin."""
    site = tmp_path_factory.mktemp("site")
    package = site / "akfake"
    package.mkdir()
    (package / "__init__.py").write_text(FAKE_PLUGIN)
    (package / "conformance.toml").write_text(FAKE_EXPECTATIONS)
    dist = site / "akfake-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: akfake\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[accelkit.backends]\nfake = akfake\n")
    return site


def _env(site: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def _select(*names: str) -> str:
    return " or ".join(f"test_op[{n}]" for n in names)


def run_cli(*args: str, site: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "accelkit", "conformance", "run", *args],
        env=_env(site), capture_output=True, text=True, timeout=timeout,
    )


def _by_op(doc: dict) -> dict[str, dict]:
    return {f"{r['op']}-{r['variant']}": r for r in doc["results"]}


# -- one run of the fake backend: crash, failure, declared skip, xpass --------------------------


@pytest.fixture(scope="module")
def misbehaving_run(fake_site, tmp_path_factory):
    """One run of every misbehaviour (each costs a worker restart or a timeout, so they share it)."""
    out = tmp_path_factory.mktemp("out")
    started = time.monotonic()
    proc = run_cli(
        "--backend", "fake", "--suite", "ops", "--jobs", "2", "--out", str(out), "--timeout", "2",
        "-k", _select(*(f"{op}-float32-forward" for op in ("sin", "cos", "tan", "exp", "neg", "abs", "sqrt", "rsqrt", "add", "mul"))),
        "--", "--accelkit-hard-timeout", "5",
        site=fake_site,
    )
    return proc, out / "fake", time.monotonic() - started


def test_a_segfaulting_kernel_costs_one_test_recorded_as_crash(misbehaving_run):
    proc, out, _ = misbehaving_run
    doc = json.loads((out / "results.json").read_text())
    records = _by_op(doc)
    assert doc["complete"] is True, proc.stderr
    crash = records["sin-forward"]
    assert crash["outcome"] == "crash"
    assert "Segmentation fault" in crash["reason"]
    assert "string_at" in crash["reason"]  # the innermost frame, from the faulthandler log
    # the run went on after the crash: every other test has its own outcome
    assert len(doc["results"]) == 10
    assert records["add-forward"]["outcome"] == records["mul-forward"]["outcome"] == "pass"


def test_wrong_values_fail_and_the_exit_status_says_so(misbehaving_run):
    proc, out, _ = misbehaving_run
    record = _by_op(json.loads((out / "results.json").read_text()))["exp-forward"]
    assert record["outcome"] == "fail"
    assert "not close" in record["reason"] and "sample 0" in record["reason"]
    assert record["paths"]["native"] >= 1  # the wrong kernel ran, and was counted as native
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_declared_unsupported_op_is_a_declared_skip_with_its_reason(misbehaving_run):
    _, out, _ = misbehaving_run
    record = _by_op(json.loads((out / "results.json").read_text()))["abs-forward"]
    assert record["outcome"] == "skip-declared"
    assert record["reason"] == "abs is not implemented on fake"
    assert record["expectation"] == 'unsupported "ops/abs"'
    assert record["paths"] is None  # never ran


def test_a_test_needing_a_declared_unsupported_dtype_is_a_declared_skip(misbehaving_run):
    _, out, _ = misbehaving_run
    records = _by_op(json.loads((out / "results.json").read_text()))
    needs_float64, needs_float16 = records["sqrt-forward"], records["rsqrt-forward"]
    assert needs_float64["outcome"] == "skip-declared"
    assert needs_float64["reason"] == "needs float64, which the backend does not hold: fake holds no float64"
    assert needs_float64["expectation"] == 'unsupported_dtypes "float64"'
    assert needs_float16["outcome"] == "error"  # not declared: an error like any other
    assert "float16" in needs_float16["reason"]


def test_expected_failure_that_passes_is_an_xpass_naming_the_entry_to_remove(misbehaving_run):
    _, out, _ = misbehaving_run
    record = _by_op(json.loads((out / "results.json").read_text()))["neg-forward"]
    assert record["outcome"] == "xpass"
    assert record["expectation"] == 'known_failures "ops/neg"'
    assert "remove" in record["reason"] and "conformance.toml" in record["reason"]


def test_results_follow_the_schema_and_the_jsonl_matches_the_json(misbehaving_run):
    _, out, _ = misbehaving_run
    doc = json.loads((out / "results.json").read_text())
    schema.validate_results(doc)  # raises on any violation
    env = doc["environment"]
    assert (env["backend"], env["target"], env["simulated"]) == ("fake", "fake-1", True)
    assert env["fallback_policy"] == "allow"
    assert env["profile"] == "quick" and env["dtypes"] == ["float32"] and env["jobs"] == 2 and env["timeout"] == 2
    assert env["torch"] and env["python"] and env["accelkit"] and env["finished"]
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert lines[0] == {"schema": schema.SCHEMA, "environment": {k: v for k, v in env.items() if k != "finished"}}
    assert lines[1] == {"event": "collected", "total": 10}
    assert lines[-1]["event"] == "finished" and lines[-1]["complete"] is True
    assert [line for line in lines if "id" in line] == doc["results"]
    for record in doc["results"]:
        assert parse_nodeid(record["id"]) == Case("ops", record["op"], "float32", record["variant"])


def test_reports_are_written_next_to_the_results(misbehaving_run):
    proc, out, _ = misbehaving_run
    for name in ("results.jsonl", "results.json", "report.md", "report.html", "pytest.log"):
        assert (out / name).is_file(), name
    assert str(out / "results.json") in proc.stdout


# -- hangs ------------------------------------------------------------------------------------


def test_hung_tests_are_recorded_as_timeouts_and_the_run_goes_on(misbehaving_run):
    proc, out, elapsed = misbehaving_run
    records = _by_op(json.loads((out / "results.json").read_text()))
    # an interruptible hang: pytest-timeout fails the test and the worker survives
    assert records["cos-forward"]["outcome"] == "timeout", proc.stderr
    assert "Timeout" in records["cos-forward"]["reason"]
    # SIGALRM blocked: the watchdog kills the worker, and the test is still a timeout, not a crash
    assert records["tan-forward"]["outcome"] == "timeout"
    assert "watchdog" in records["tan-forward"]["reason"] and "in tan" in records["tan-forward"]["reason"]
    assert records["tan-forward"]["duration"] >= 5
    assert elapsed < 180  # two 600 s sleeps cost seconds


# -- a killed or interrupted run ---------------------------------------------------------------

HANG_PLUGIN = '''
"""A pytest plugin for the kill tests: in each worker, the second test starts a child process,
notes its pid and process group in $AKHANG_DIR, and hangs."""
import os
import subprocess
import sys
import time
from pathlib import Path

_ran = 0


def pytest_runtest_call(item):
    global _ran
    _ran += 1
    if _ran >= 2 and "PYTEST_XDIST_WORKER" in os.environ:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(os.environ["AKHANG_DIR"], str(child.pid)).write_text(str(os.getpgrp()))
        time.sleep(600)
'''


@pytest.fixture(scope="module")
def hang_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("hang-site")
    (site / "akhang.py").write_text(HANG_PLUGIN)
    return site


def _recorded_ids(jsonl: Path) -> list[str]:
    text = jsonl.read_text() if jsonl.exists() else ""
    return [json.loads(line)["id"] for line in text.splitlines(keepends=True) if line.endswith("\n") and '"id"' in line]


def _live_members(group: int) -> list[int]:
    """Processes of process group ``group`` that are alive (zombies are dead, waiting to be reaped)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if int(pgrp) == group and state != "Z":
            members.append(int(entry))
    return members


def _left_after_grace(group: int, grace: float = 10.0) -> list[int]:
    deadline = time.monotonic() + grace
    while (left := _live_members(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture
def hanging_run(hang_site, tmp_path, request):
    """Start ``accelkit conformance run`` on ref whose workers each record one test, then hang in
    the next with a child process of their own; yields (runner, results.jsonl, the run's process
    group, recorded ids) once they all hang. Kills whatever of the group is left at the end.
    Parametrised indirectly with True, the runner starts with SIGINT ignored, as a background job
    of a shell script does."""
    hung = tmp_path / "hung"
    hung.mkdir()
    jobs = 2
    ignoring_sigint = ["-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                             "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"] \
        if getattr(request, "param", False) else []
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        runner = subprocess.Popen(
            [sys.executable, *ignoring_sigint, "-m", "accelkit", "conformance", "run", "--backend", "ref", "--suite", "contract",
             "--jobs", str(jobs), "--timeout", "120", "--out", str(tmp_path / "out"),
             "-k", "accelerator or transfer", "--", "-p", "akhang"],
            env={**_env(hang_site), "AKHANG_DIR": str(hung)}, stdout=stdout, stderr=stderr,
        )
    jsonl = tmp_path / "out" / "ref" / "results.jsonl"
    groups: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while len(groups := {int(f.read_text()) for f in hung.iterdir() if f.read_text()}) < 1 \
                or len(list(hung.iterdir())) < jobs or not _recorded_ids(jsonl):
            assert runner.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() < deadline, "the workers did not reach their hanging test in 180 s"
            time.sleep(0.2)
        (group,) = groups
        assert group not in (os.getpgrp(), runner.pid)  # the controller's own group
        assert len(_live_members(group)) >= 1 + 2 * jobs  # the controller, its workers and their children
        yield runner, jsonl, group, _recorded_ids(jsonl)
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait()
        for group in groups:
            if _live_members(group):
                os.killpg(group, signal.SIGKILL)


def _assert_whole_lines(jsonl: Path) -> list[dict]:
    text = jsonl.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]  # every line parses


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the run's processes through /proc")
@pytest.mark.parametrize("victims", ["runner", "controller, then runner"])
def test_a_sigkilled_run_leaves_no_process_behind_and_keeps_every_line_whole(hanging_run, victims):
    runner, jsonl, group, recorded = hanging_run
    if victims != "runner":
        os.kill(group, signal.SIGKILL)  # the controller leads the group; the runner cannot sweep it
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait(10)
    assert _left_after_grace(group) == []  # workers and the processes they started included
    lines = _assert_whole_lines(jsonl)
    assert not any(line.get("event") == "finished" for line in lines)
    doc = schema.read_jsonl(jsonl)
    schema.validate_results(doc)
    assert doc["complete"] is False
    assert set(recorded) <= {r["id"] for r in doc["results"]}  # nothing recorded was lost
    assert not (jsonl.parent / "results.json").exists()  # the runner never got to assemble it


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the run's processes through /proc")
def test_a_sigkilled_controller_is_swept_and_its_partial_run_reported(hanging_run, tmp_path):
    runner, jsonl, group, recorded = hanging_run
    os.kill(group, signal.SIGKILL)  # the pytest subprocess, which leads the group
    assert runner.wait(60) == 2
    assert _left_after_grace(group) == []
    _assert_whole_lines(jsonl)
    doc = schema.load_results(jsonl.parent / "results.json")
    assert doc["complete"] is False and set(recorded) <= {r["id"] for r in doc["results"]}
    assert "INCOMPLETE" in (jsonl.parent / "report.md").read_text()
    assert "ended early (pytest exit status -9)" in (tmp_path / "stderr").read_text()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the run's processes through /proc")
@pytest.mark.parametrize("hanging_run", [False, True], indirect=True, ids=["sigint-default", "sigint-ignored-inherited"])
def test_sigterm_stops_the_run_keeps_its_results_and_reports_it_incomplete(hanging_run, tmp_path):
    runner, jsonl, group, recorded = hanging_run
    os.kill(runner.pid, signal.SIGTERM)  # as Ctrl-C: interrupt the group, keep what it recorded
    assert runner.wait(60) == 130, (tmp_path / "stderr").read_text()
    assert _left_after_grace(group) == []
    lines = _assert_whole_lines(jsonl)
    assert lines[-1]["event"] == "finished" and lines[-1]["complete"] is False  # pytest saw the interruption
    doc = schema.load_results(jsonl.parent / "results.json")
    assert doc["complete"] is False and set(recorded) <= {r["id"] for r in doc["results"]}
    assert "INCOMPLETE (interrupted; results so far)" in (jsonl.parent / "report.md").read_text()
    stderr = (tmp_path / "stderr").read_text()
    assert "interrupted; the results so far are in" in stderr and "report.md" in stderr


def test_a_writer_closed_from_another_thread_stops_between_two_whole_lines(tmp_path):
    env = {"backend": "x"}
    writer = ResultsWriter(tmp_path, env)
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            writer.record(_record(id=f"suites/test_ops.py::test_op[op{n}-float32-forward]", reason="x" * 5000))
            n += 1

    thread = threading.Thread(target=write)
    thread.start()
    time.sleep(0.2)
    writer.close()  # what the lifeline does before it kills the run
    size = (tmp_path / "results.jsonl").stat().st_size
    time.sleep(0.1)
    stop.set()
    thread.join()
    assert (tmp_path / "results.jsonl").stat().st_size == size  # nothing written after close
    lines = _assert_whole_lines(tmp_path / "results.jsonl")
    assert len(lines) == 1 + writer.written and writer.written > 0


def test_a_torn_tail_is_cut_once_the_writer_is_dead(tmp_path):
    path = tmp_path / "results.jsonl"
    whole = json.dumps({"schema": schema.SCHEMA, "environment": {}}) + "\n" + json.dumps(_record()) + "\n"
    path.write_text(whole + '{"id": "suites/test_o')
    assert drop_torn_tail(path) is True and path.read_text() == whole
    assert drop_torn_tail(path) is False and path.read_text() == whole


# -- accelkit conformance run against ref -----------------------------------------------------


def test_run_against_ref_writes_results_and_reports(tmp_path):
    proc = run_cli("--backend", "ref", "--suite", "contract", "--jobs", "1", "--out", str(tmp_path),
                   "-k", "accelerator or transfer")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = schema.load_results(tmp_path / "ref" / "results.json")
    assert doc["complete"] and doc["environment"]["backend"] == "ref"
    assert {r["suite"] for r in doc["results"]} == {"contract"}
    assert len(doc["results"]) >= 5 and all(r["outcome"] == "pass" for r in doc["results"])
    assert all(r["paths"] is not None for r in doc["results"])
    assert Path(doc["environment"]["expectations"]).parts[-2:] == ("ref", "conformance.toml")
    assert doc["environment"]["fast_compile"] is True  # the quick profile's
    assert "| compiling | fast (ACCELKIT\\_FAST\\_COMPILE=1" in (tmp_path / "ref" / "report.md").read_text()
    assert (tmp_path / "ref" / "report.md").read_text().strip()
    assert "<html" in (tmp_path / "ref" / "report.html").read_text().lower()


@pytest.mark.parametrize("profile,preset,expected", [
    ("quick", None, "1"), ("full", None, None), ("quick", "0", "0"),
])
def test_the_quick_profile_asks_for_fast_compiles_unless_the_user_said_otherwise(monkeypatch, profile, preset,
                                                                                 expected):
    import argparse

    from accelkit_conformance import runner

    parser = argparse.ArgumentParser()
    runner.add_run_arguments(parser)
    args = parser.parse_args(["--backend", "ref", "--profile", profile])
    if preset is None:
        monkeypatch.delenv("ACCELKIT_FAST_COMPILE", raising=False)
    else:
        monkeypatch.setenv("ACCELKIT_FAST_COMPILE", preset)
    assert runner._environ(args, "ref").get("ACCELKIT_FAST_COMPILE") == expected


def test_unknown_backend_is_a_usage_error_naming_the_installed_ones(tmp_path):
    proc = run_cli("--backend", "nosuch", "--suite", "contract", "--jobs", "1", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "no accelkit backend named 'nosuch'" in proc.stderr and "ref" in proc.stderr


# -- units: node ids, expectations, crash logs, schema ----------------------------------------


NODE_IDS = [
    ("suites/test_ops.py::test_op[nn.functional.interpolate.nearest-exact-bfloat16-backward]",
     Case("ops", "nn.functional.interpolate.nearest-exact", "bfloat16", "backward")),
    ("suites/test_modules.py::test_module[nn.Linear-float32-forward]",
     Case("modules", "nn.Linear", "float32", "forward")),
    ("suites/test_contract.py::test_memory_oom_is_clear_and_recoverable",
     Case("contract", "memory_oom_is_clear_and_recoverable")),
    ("suites/test_contract.py::test_transfer_round_trips_exactly[int64]",
     Case("contract", "transfer_round_trips_exactly", "int64")),
    ("suites/test_contract.py::test_rng_manual_seed_reproduces[randn]",
     Case("contract", "rng_manual_seed_reproduces[randn]")),
    ("suites/test_dynamic.py::test_dynamic[mlp.compile_auto-float32]",
     Case("dynamic", "mlp.compile_auto", "float32")),
    ("tests/test_views.py::test_something", None),
]


@pytest.mark.parametrize(("nodeid", "case"), NODE_IDS)
def test_node_ids_carry_the_case(nodeid, case):
    assert parse_nodeid(nodeid) == case


def test_expectations_file_decides_skips_xfails_and_tolerances(tmp_path):
    path = tmp_path / "conformance.toml"
    path.write_text(textwrap.dedent('''
        [unsupported_dtypes]
        float64 = "no 64-bit floats"
        [unsupported]
        "ops/fft.*" = "no FFT"
        [known_failures]
        "nn.LSTM" = "fused cell missing"
        [[xfail]]
        match = "ops/add"
        dtypes = ["bfloat16"]
        variants = ["backward"]
        reason = "bf16 grads differ"
        [[tolerance]]
        match = "ops/matmul"
        atol = 0.5
        rtol = 0.25
        reason = "accumulates in bfloat16"
    '''))
    e = Expectations.from_toml(path)
    assert e.source == str(path)
    assert e.lookup("ops", "fft.rfft", "float32", "forward").key == 'unsupported "ops/fft.*"'
    assert e.lookup("modules", "fft.rfft", "float32", "forward") is None  # suite-qualified
    assert e.lookup("ops", "add", "float64", "forward").reason == "no 64-bit floats"  # dtype first
    assert e.lookup("modules", "nn.LSTM", "float32", "forward").kind == "xfail"  # bare: any suite
    rule = e.lookup("ops", "add", "bfloat16", "backward")
    assert rule.kind == "xfail" and rule.key == 'xfail "ops/add" (dtypes: bfloat16) (variants: backward)'
    assert e.lookup("ops", "add", "bfloat16", "forward") is None
    assert e.lookup("ops", "add", "float32", "backward") is None
    assert (e.tolerance("ops", "matmul", "float32").atol, e.tolerance("ops", "matmul", "float32").rtol) == (0.5, 0.25)
    assert e.tolerance("ops", "matmul", "float32").reason == "accumulates in bfloat16"
    assert e.tolerance("ops", "mm", "float32") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[unsupported]\n\"ops/x\" = \"\"\n", "needs a reason"),
        ("[unsupported]\n\"kernels/x\" = \"r\"\n", "unknown suite 'kernels'"),
        ("[unsupported_dtypes]\nfloat33 = \"r\"\n", "'float33' is not a torch dtype"),
        ("[[skip]]\nmatch = \"ops/x\"\nreason = \"r\"\nvariant = \"forward\"\n", "unknown keys ['variant']"),
        ("[skips]\n", "unknown table(s) ['skips']"),
        ("[[tolerance]]\nmatch = \"ops/x\"\natol = 1\nrtol = 1\n", "needs match, atol, rtol and reason"),
        ("[unsupported\n", "cannot read conformance expectations"),
        ("[capabilities]\nteleport = true\n", "'teleport' is not a capability"),
        ("[capabilities]\nsparse = false\n", "true, or the reason it is not supported"),
        ("[capabilities]\nsparse = \"\"\n", "true, or the reason it is not supported"),
    ],
)
def test_malformed_expectations_name_the_file_and_the_problem(tmp_path, text, message):
    path = tmp_path / "conformance.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        Expectations.from_toml(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_crash_logs_become_outcomes_and_reasons():
    segv = (
        "Fatal Python error: Segmentation fault\n\n"
        'Thread 0x2 (most recent call first):\n  File "/z/execnet/gateway_base.py", line 534 in read\n\n'
        'Current thread 0x1 (most recent call first):\n  File "/x/ctypes/__init__.py", line 519 in string_at\n'
        '  File "/y/akfake/__init__.py", line 17 in sin\n'
    )
    assert crash_cause(segv) == ("crash", "worker crashed: Segmentation fault in string_at (__init__.py:519)")
    hang = (
        "main thread 0x0000000000000001\nTimeout (0:00:08)!\n"
        'Thread 0x0000000000000002 (most recent call first):\n  File "/z/execnet/gateway_base.py", line 534 in read\n\n'
        'Thread 0x0000000000000001 (most recent call first):\n  File "/y/akfake/__init__.py", line 28 in tan\n'
    )
    assert crash_cause(hang) == ("timeout", "hung for 0:00:08 and was killed by the watchdog in tan (__init__.py:28)")
    assert crash_cause("")[0] == "crash"


def _record(**changes):
    record = {
        "id": "suites/test_ops.py::test_op[add-float32-forward]", "suite": "ops", "op": "add", "variant": "forward",
        "dtype": "float32", "outcome": "pass", "reason": None, "expectation": None, "duration": 0.1,
        "paths": {"native": 1, "decomposed": 0, "fallback": 0}, "fallback_ops": [], "compiles": None, "dynamic": None,
    }
    record.update(changes)
    return record


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"outcome": "passed"}, "outcome 'passed' is not one of"),
        ({"suite": "kernels"}, "suite 'kernels'"),
        ({"duration": -1}, "duration must be a number >= 0"),
        ({"paths": {"native": 1, "decomposed": 0}}, "paths.fallback"),
        ({"fallback_ops": "aten.add"}, "fallback_ops must be a list"),
        ({"dynamic": {"shapes": [[2, 3]], "recompiles": [1], "correct": "yes"}}, "dynamic.correct"),
        ({"compiles": True}, "compiles must be an integer"),
    ],
)
def test_schema_rejects_malformed_records(changes, message):
    schema.validate_record(_record())
    with pytest.raises(schema.SchemaError, match=message.replace("(", r"\(").replace("[", r"\[")):
        schema.validate_record(_record(**changes))
    bad = dict(_record())
    del bad["expectation"]
    with pytest.raises(schema.SchemaError, match="missing fields"):
        schema.validate_record(bad)


def test_a_torn_last_line_of_a_killed_writer_is_ignored(tmp_path):
    header = {"schema": schema.SCHEMA, "environment": {"backend": "x"}}
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(_record()) + "\n" + '{"id": "suites/test_o')
    doc = schema.read_jsonl(path)
    assert doc["complete"] is False and doc["results"] == [_record()]


def test_recorder_counts_the_paths_and_fallbacks_of_the_measured_block_only(dev):
    import torch

    x = torch.ones(4, device=dev)
    rec = Recorder()
    x * 2  # outside the block: not counted
    with rec.measure():
        x + x  # ref has a native add
        torch.special.i1e(x)  # no ref kernel: decomposed or run on the CPU
    assert rec.as_record()["paths"]["native"] == 1
    counted = rec.as_record()["paths"]["decomposed"] + rec.as_record()["paths"]["fallback"]
    assert counted >= 1
    assert rec.as_record()["compiles"] is None  # ref reports no compilations
    assert all(op.startswith("aten.") for op in rec.as_record()["fallback_ops"])
    assert Recorder().as_record()["paths"] is None  # nothing measured: no counts, not zeros
    rec.settled_by_float_reference()
    assert rec.as_record()["float_reference"] == 1


def test_recorder_takes_compile_counts_from_the_backends_stats(monkeypatch):
    import accelkit

    snapshots = iter([
        {"ops": {"aten.mm.default": {"native": 2, "decomposed": 0, "fallback": 1}}, "compiles": 3},
        {"ops": {"aten.mm.default": {"native": 5, "decomposed": 0, "fallback": 2},
                 "aten.sum.default": {"native": 0, "decomposed": 1, "fallback": 0}}, "compiles": 7},
    ])
    monkeypatch.setattr(accelkit, "stats", lambda: next(snapshots))
    rec = Recorder()
    with rec.measure():
        pass
    assert rec.as_record() == {
        "paths": {"native": 3, "decomposed": 1, "fallback": 1},
        "fallback_ops": ["aten.mm.default"],
        "compiles": 4,
        "dynamic": None,
        "float_reference": 0,
    }
