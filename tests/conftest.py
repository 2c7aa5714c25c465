"""The core's tests run on the ref backend, activated once for the whole session.

The shipped plugin :mod:`accelkit.sdk.testing.plugin` activates it (``ref`` unless
``--accelkit-device`` or ``ACCELKIT_TEST_DEVICE`` says otherwise) and provides the ``dev`` and
``no_gc`` fixtures. A run of this whole directory (``pytest tests``) also collects the
device-generic tests, which ship in :mod:`accelkit.sdk.testing.generic`.

One PrivateUse1 backend per process: tests about selection before activation, conflicts and
autoload run in subprocesses (see ``run_python``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# A small ref device, so out-of-memory tests stay cheap. Must be set before activation.
os.environ.setdefault("ACCELKIT_REF_MEMORY", "1GiB")

import pytest  # noqa: E402

import accelkit.sdk.testing.generic  # noqa: E402
from accelkit.sdk.testing import device_under_test, holds, require_dtype  # noqa: E402, F401 - for the tests

pytest_plugins = ["accelkit.sdk.testing.plugin"]

TESTS = Path(__file__).resolve().parent
GENERIC = Path(accelkit.sdk.testing.generic.__file__).resolve().parent


def __getattr__(name: str):
    # ``from conftest import DEVICE``: the device under test, which the plugin activates after
    # this module is imported.
    if name == "DEVICE":
        return device_under_test()
    raise AttributeError(name)


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """A run of this whole directory collects the generic tests too (once)."""
    args, here = session.config.args, session.config.invocation_params.dir
    paths = {(here / arg).resolve() for arg in args if "::" not in arg}
    if TESTS in paths and GENERIC not in paths:
        args.append(str(GENERIC))


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120,
               cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (no backend active) and return the finished process.

    ``cwd``: where it runs (default: here). ``python -c`` puts its working directory first on
    ``sys.path``, so in a source checkout with an editable install its ``accelkit.egg-info`` is
    found before anything on ``PYTHONPATH``.
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )

# PyTorch-style test files the conformance runner's upstream suite is tested on; pytest must not
# run them as tests of this directory (test_conformance_upstream.py runs them through the runner).
collect_ignore = ["upstream_style"]
