"""Capabilities: one short probe per capability the backend declares, run before the suites
that rely on it, so a false declaration is said plainly ("declared compile, but ..."). A
capability the backend does not declare is a declared skip with its reason (see
:mod:`accelkit_conformance.capabilities`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from accelkit_conformance import session
from accelkit_conformance.capabilities import NAMES
from accelkit_conformance.compare import assert_same

SETTINGS = session.current()
DEV = SETTINGS.device
NAME = DEV.type


def _compile() -> None:
    step = torch.compile(lambda x: x * 2 + 1, backend=NAME)
    x = torch.arange(6.0)
    assert_same(step(x.to(DEV)), x * 2 + 1)


def _dynamic_shapes() -> None:
    step = torch.compile(lambda x: x.sum(0) * 2, backend=NAME, dynamic=True)
    for rows in (3, 5, 7):
        x = torch.arange(rows * 4.0).reshape(rows, 4)
        assert_same(step(x.to(DEV)), x.sum(0) * 2)


def _distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this worker")
    dist.init_process_group(NAME, store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.arange(4.0).to(DEV)
        dist.all_reduce(t)
        assert_same(t, torch.arange(4.0))
    finally:
        dist.destroy_process_group()


def _device_generators() -> None:
    first, second = (torch.Generator(device=DEV).manual_seed(7) for _ in range(2))
    a = torch.rand(5, device=DEV, generator=first)
    b = torch.rand(5, device=DEV, generator=second)
    assert a.device.type == NAME and torch.equal(a.cpu(), b.cpu())


def _pinned_memory() -> None:
    pinned = torch.arange(4.0).pin_memory()
    assert pinned.is_pinned()
    assert_same(pinned.to(DEV, non_blocking=True), torch.arange(4.0))


def _multi_device() -> None:
    # Devices per process are fixed at activation: ask a fresh process for two.
    code = textwrap.dedent(f"""
        import torch, accelkit
        accelkit.select_device({NAME!r})
        module = torch.get_device_module({NAME!r})
        assert module.device_count() == 2, module.device_count()
        module.set_device(1)
        x = torch.arange(3.0, device={NAME!r})
        y = x.to("{NAME}:0") + 1
        assert (x.device.index, y.device.index) == (1, 0)
        print(y.cpu().tolist())
    """)
    env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"}
    env[f"ACCELKIT_{NAME.upper()}_DEVICES"] = "2"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[1.0, 2.0, 3.0]", done.stderr.strip().splitlines()[-1:]


def _streams_events() -> None:
    module = torch.get_device_module(NAME)
    stream = module.Stream()
    start, end = module.Event(enable_timing=True), module.Event(enable_timing=True)
    with module.stream(stream):
        start.record()
        y = torch.arange(4.0, device=DEV) * 3
        end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0
    assert_same(y, torch.arange(4.0) * 3)


def _sparse() -> None:
    dense = torch.eye(3)
    assert_same(dense.to(DEV).to_sparse().to_dense(), dense)


PROBES = {"compile": _compile, "dynamic_shapes": _dynamic_shapes, "distributed": _distributed,
          "device_generators": _device_generators, "pinned_memory": _pinned_memory, "multi_device": _multi_device,
          "streams_events": _streams_events, "sparse": _sparse}
assert tuple(PROBES) == NAMES


@pytest.mark.parametrize("capability", NAMES)
def test_capability(capability: str, recorder) -> None:
    """The probe of a declared capability; undeclared ones are skipped by the expectations."""
    try:
        with recorder.measure():
            PROBES[capability]()
    except (AssertionError, pytest.skip.Exception):
        raise
    except Exception as exc:  # noqa: BLE001 - the declaration is what failed
        raise AssertionError(f"{NAME} declares {capability}, but the probe raised "
                             f"{type(exc).__name__}: {exc}") from exc
