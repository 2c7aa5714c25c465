"""A CPU ``backward()`` before ``select_device()`` in the same process.

PyTorch's autograd engine sets up its per-device queues once, at the first backward of a
process, from the device guards registered then. accelkit registers its PrivateUse1 guard when
it is imported (which torch's backend autoload does during ``import torch``), so comparing with
the CPU first and then moving to the device works. Where the engine was set up before accelkit
was imported, ``select_device`` refuses with the reason instead of letting the first device
backward reach PyTorch's internal assert. Each case needs a fresh interpreter.
"""

from __future__ import annotations

import pytest
from conftest import run_python

NO_TORCH_AUTOLOAD = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}

CPU_BACKWARD = """
def cpu_backward():
    a = torch.arange(3., requires_grad=True)
    (a * a).sum().backward()
    assert a.grad.tolist() == [0.0, 2.0, 4.0], a.grad
"""

DEVICE_BACKWARD = """
b = torch.arange(3., device=device, requires_grad=True)
(b * b).sum().backward()
print("grad", b.grad.cpu().tolist())
"""


def _program(backend: str, *, backward_before_import: bool) -> str:
    before = "cpu_backward()" if backward_before_import else ""
    after = "" if backward_before_import else "cpu_backward()"
    return (
        "import torch\n" + CPU_BACKWARD + f"{before}\nimport accelkit\n{after}\n"
        f"device = accelkit.select_device({backend!r})\n" + DEVICE_BACKWARD
    )


def _assert_device_backward_works(proc) -> None:
    assert proc.returncode == 0, proc.stderr
    assert "grad [0.0, 2.0, 4.0]" in proc.stdout
    assert "INTERNAL ASSERT" not in proc.stderr


@pytest.mark.parametrize("backend", ["ref", "tpu", "neuron"])
def test_cpu_backward_before_import_accelkit_then_device_backward(backend):
    # torch's autoload imported accelkit during `import torch`, before the CPU backward.
    _assert_device_backward_works(run_python(_program(backend, backward_before_import=True)))


@pytest.mark.parametrize("env", [{}, NO_TORCH_AUTOLOAD, {"ACCELKIT_AUTOLOAD": "0"}],
                         ids=["autoload", "no-torch-autoload", "no-accelkit-autoload"])
def test_cpu_backward_after_import_accelkit_then_device_backward(env):
    _assert_device_backward_works(run_python(_program("ref", backward_before_import=False), env=env))


def test_accelkit_autoload_off_still_registers_the_guard_at_import_torch():
    # ACCELKIT_AUTOLOAD=0 activates nothing, but loading the entry point imports accelkit.
    proc = run_python(_program("ref", backward_before_import=True), env={"ACCELKIT_AUTOLOAD": "0"})
    _assert_device_backward_works(proc)


def test_backend_activated_during_import_torch_then_cpu_then_device_backward():
    code = "import torch\n" + CPU_BACKWARD + "cpu_backward()\nimport accelkit\ndevice = accelkit.select_device()\n"
    proc = run_python(code + "assert device.type == 'ref', device\n" + DEVICE_BACKWARD, env={"ACCELKIT_DEVICE": "ref"})
    _assert_device_backward_works(proc)


def test_selection_under_no_grad_and_inference_mode_then_backward_on_a_thread():
    proc = run_python(
        "import threading, torch, accelkit\n"
        "with torch.inference_mode(), torch.no_grad():\n"
        "    device = accelkit.select_device('ref')\n"
        "def work():\n" + "\n".join("    " + line for line in DEVICE_BACKWARD.strip().splitlines()) + "\n"
        "t = threading.Thread(target=work); t.start(); t.join()\n"
    )
    _assert_device_backward_works(proc)


@pytest.mark.parametrize("backend", ["ref", "tpu", "neuron"])
def test_backward_before_accelkit_without_autoload_is_refused_at_selection(backend):
    code = "import torch\n" + CPU_BACKWARD + f"""
cpu_backward()
import accelkit
for attempt in range(2):
    try:
        accelkit.select_device({backend!r})
    except accelkit.DeviceUnavailableError as error:
        print("refused:", error)
    else:
        raise AssertionError("selected a device whose backward cannot run")
cpu_backward()  # the process keeps working on the CPU
print("fallback", accelkit.select_device("{backend},cpu"))
print("reason", [r.reason for r in accelkit.devices() if r.name == {backend!r}][0])
"""
    proc = run_python(code, env=NO_TORCH_AUTOLOAD)
    assert proc.returncode == 0, proc.stderr
    refusals = [line for line in proc.stdout.splitlines() if line.startswith("refused:")]
    assert len(refusals) == 2
    for line in refusals:
        assert f"{backend} cannot run backward() in this process" in line
        assert "a backward() ran before accelkit registered its device" in line
        assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in line and "`import accelkit` at the top" in line
    assert "fallback cpu" in proc.stdout
    assert "cannot run backward() in this process" in proc.stdout.split("reason", 1)[1]
    assert "INTERNAL ASSERT" not in proc.stdout + proc.stderr


def test_guard_is_registered_at_import_without_activating_a_backend():
    proc = run_python(
        "import torch\nimport accelkit\n"
        "print(accelkit.active_backend(), torch._C._get_privateuse1_backend_name())\n"
        # A second registration is refused: accelkit's guard already holds the slot.
        "from torch.utils.backend_registration import _DummyDeviceGuard\n"
        "print(torch._C._acc.register_python_privateuseone_device_guard(_DummyDeviceGuard()))\n",
        env=NO_TORCH_AUTOLOAD,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "privateuseone", "False"]


def test_no_guard_is_registered_when_another_backend_owns_privateuse1():
    proc = run_python(
        "import torch\ntorch.utils.rename_privateuse1_backend('othernpu')\nimport accelkit\n"
        "from torch.utils.backend_registration import _DummyDeviceGuard\n"
        "print(torch._C._acc.register_python_privateuseone_device_guard(_DummyDeviceGuard()))\n",
        env=NO_TORCH_AUTOLOAD,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"]


def test_a_child_forked_after_a_backward_can_select_and_compute_but_not_backward():
    # PyTorch refuses backward() in such a child (as with a GPU), with its own message; the
    # device is still usable for everything else there.
    code = "import os, torch, accelkit\n" + CPU_BACKWARD + """
cpu_backward()
pid = os.fork()
if pid == 0:
    device = accelkit.select_device("ref")
    print("forward", (torch.arange(3., device=device) * 2).cpu().tolist(), flush=True)
    b = torch.arange(3., device=device, requires_grad=True)
    try:
        (b * b).sum().backward()
    except RuntimeError as error:
        print("backward refused:", str(error).splitlines()[0], flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child status", status)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "forward [0.0, 2.0, 4.0]" in proc.stdout
    assert "backward refused: Unable to handle autograd's threading in combination with fork" in proc.stdout
    assert "child status 0" in proc.stdout
    assert "INTERNAL ASSERT" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("backend", ["ref", "tpu", "neuron"])
def test_backward_runs_on_the_thread_that_calls_it(backend):
    # PyTorch's engine would hand a device's backward to a thread of its own and wait for it.
    proc = run_python(
        "import threading, torch, accelkit\n"
        f"device = accelkit.select_device({backend!r})\n"
        "seen = []\n"
        "b = torch.arange(3., device=device, requires_grad=True)\n"
        "b.register_hook(lambda grad: seen.append(threading.get_ident()))\n"
        "(b * b).sum().backward()\n"
        "print('grad', b.grad.cpu().tolist(), 'same thread', seen == [threading.get_ident()])\n"
        "with torch.autograd.set_multithreading_enabled(True):  # PyTorch's device threads, on request\n"
        "    (b * b).sum().backward()\n"
        "print('device thread', seen[-1] != threading.get_ident())\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "grad [0.0, 2.0, 4.0] same thread True" in proc.stdout
    assert "device thread True" in proc.stdout


def test_device_threads_asked_for_before_the_first_backward_stay_asked_for():
    # The user's choice on the activating thread, made before any backward, is not undone.
    proc = run_python(
        "import threading, torch, accelkit\n"
        "device = accelkit.select_device('ref')\n"
        "seen = []\n"
        "b = torch.arange(3., device=device, requires_grad=True)\n"
        "b.register_hook(lambda grad: seen.append(threading.get_ident()))\n"
        "torch.autograd.set_multithreading_enabled(True)\n"
        "(b * b).sum().backward()\n"
        "print('device thread', seen == [t for t in seen if t != threading.get_ident()] and len(seen) == 1)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "device thread True" in proc.stdout


@pytest.mark.parametrize("backend", ["ref", "tpu", "neuron"])
def test_backward_on_any_thread_runs_on_that_thread_and_exit_is_clean(backend):
    # Off the activating thread, PyTorch would hand device backwards to autograd's device
    # thread, which drops the finished task just after backward() returns; if the interpreter
    # is finalizing by then, the process aborts (exit code 134, "terminate called without an
    # active exception"). A long switch interval makes the main thread finalize first.
    code = (
        "import sys\nsys.setswitchinterval(10)\nimport threading, torch, accelkit\n"
        "with torch.inference_mode():\n"
        f"    device = accelkit.select_device({backend!r})\n"
        "def work():\n"
        "    b = torch.arange(3., device=device, requires_grad=True)\n"
        "    ran_on = []\n"
        "    b.register_hook(lambda grad: ran_on.append(threading.get_native_id()))\n"
        "    for step in range(2):\n"
        "        (b * b).sum().backward()\n"
        "    print('same thread', ran_on == [threading.get_native_id()] * 2)\n"
        "    print('grad', (b.grad / 2).cpu().tolist())\n"
        "t = threading.Thread(target=work); t.start(); t.join()\n"
    )
    for attempt in range(2 if backend == "ref" else 1):
        proc = run_python(code)
        _assert_device_backward_works(proc)
        assert "same thread True" in proc.stdout
