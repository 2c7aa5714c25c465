"""Work that the xdist workers of one pytest run share: done by the first worker that needs it,
read by the others (which wait for it), rather than done once per worker."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The id xdist gives every worker of one run (absent outside xdist).
RUN_ID_ENV = "PYTEST_XDIST_TESTRUNUID"
#: Where the workers share results: a directory the conformance runner makes for one run and
#: removes after it (else one under the system's temporary directory, per xdist run id).
SHARED_ENV = "ACCELKIT_CONFORMANCE_SHARED"


def once_per_run(name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s result (JSON-able), computed once per pytest run under ``name``.

    Outside xdist it is simply computed. The workers share it through a file (see
    :data:`SHARED_ENV`), written while a lock is held: a worker that asks while another computes
    waits for that result.
    """
    run = os.environ.get(RUN_ID_ENV)
    if not run:
        return compute()
    given = os.environ.get(SHARED_ENV)
    directory = Path(given) if given else Path(tempfile.gettempdir()) / f"accelkit-conformance-{run}"
    directory.mkdir(parents=True, exist_ok=True)
    shared = directory / f"{name}.json"
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shared.exists():
            return json.loads(shared.read_text())
        value = compute()
        shared.write_text(json.dumps(value))
        return value
