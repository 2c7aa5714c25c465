"""accelkit_conformance.once: work the xdist workers of one run share is done once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time


def test_work_shared_by_the_workers_of_a_run_is_done_once_and_read_by_the_others(tmp_path):
    # Two workers of one xdist run ask at once: one computes (slowly), the other waits and reads.
    code = textwrap.dedent(f"""
        import sys, time
        from accelkit_conformance.once import once_per_run

        def compute():
            with open({str(tmp_path / "computed")!r}, "a") as f:
                f.write("once\\n")
            time.sleep(1.0)
            return {{"value": [1, 2.5, "x"]}}

        print(once_per_run("scenario", compute))
        """)
    shared = tmp_path / "shared"  # the conformance runner names one per run, and removes it after
    env = {**os.environ, "PYTEST_XDIST_TESTRUNUID": f"test-{os.getpid()}-{time.time_ns()}",
           "ACCELKIT_CONFORMANCE_SHARED": str(shared)}
    workers = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    outputs = [worker.communicate(timeout=60)[0].strip() for worker in workers]
    assert all(worker.returncode == 0 for worker in workers)
    assert outputs == ["{'value': [1, 2.5, 'x']}"] * 2
    assert (tmp_path / "computed").read_text() == "once\n"
    assert (shared / "scenario.json").exists()
    # Outside xdist there is nothing to share: each call computes.
    del env["PYTEST_XDIST_TESTRUNUID"]
    alone = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert alone.returncode == 0, alone.stderr
    assert (tmp_path / "computed").read_text() == "once\nonce\n"
