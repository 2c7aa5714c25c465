"""Checks of a process with two devices of one backend, run as ``python multi_device_cases.py NAME``
with ``ACCELKIT_<NAME>_DEVICES=2``; prints one JSON object: check name -> "ok" or what went wrong.

Every value is compared with the same computation on the CPU.
"""

from __future__ import annotations

import io
import json
import sys
import traceback
from collections.abc import Callable

import torch

import accelkit


def main(name: str) -> dict[str, str]:
    dev = accelkit.select_device(name)
    module = getattr(torch, name)
    d0, d1 = torch.device(name, 0), torch.device(name, 1)
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    checks: dict[str, Callable[[], None]] = {}

    def check(fn: Callable[[], None]) -> Callable[[], None]:
        checks[fn.__name__] = fn
        return fn

    @check
    def counts() -> None:
        assert module.device_count() == 2, module.device_count()
        assert torch.accelerator.device_count() == 2, torch.accelerator.device_count()
        assert dev == d0, dev

    @check
    def ops_stay_on_their_device() -> None:
        a = x.to(d1)
        out = (a * 2 + 1).t().matmul(a).softmax(-1)
        assert a.device == d1 and out.device == d1, (a.device, out.device)
        torch.testing.assert_close(out.cpu(), (x * 2 + 1).t().matmul(x).softmax(-1))
        view = a[1:, ::2]
        view.mul_(-1)
        expected = x.clone()
        expected[1:, ::2].mul_(-1)
        torch.testing.assert_close(a.cpu(), expected)

    @check
    def two_devices_in_one_op_is_an_error() -> None:
        try:
            x.to(d0) + x.to(d1)
        except RuntimeError as exc:
            assert "Expected all tensors to be on the same device" in str(exc), exc
            assert f"{name}:0" in str(exc) and f"{name}:1" in str(exc), exc
        else:
            raise AssertionError("an op on two devices ran")

    @check
    def copies_between_devices() -> None:
        a = x.to(d1)
        b = a.to(d0)
        assert b.device == d0
        torch.testing.assert_close(b.cpu(), x)
        c = torch.zeros(7, 5, device=d0)
        c.copy_(a.t())
        torch.testing.assert_close(c.cpu(), x.t())
        d = torch.empty(5, 7, device=d1).copy_(b)
        torch.testing.assert_close(d.cpu(), x)

    @check
    def current_device_and_its_context() -> None:
        assert module.current_device() == 0
        assert torch.zeros(1, device=name).device == d0
        with module.device(1):
            assert module.current_device() == 1
            assert torch.zeros(1, device=name).device == d1
            assert torch.accelerator.current_device_index() == 1
        assert module.current_device() == 0
        module.set_device(1)
        try:
            assert torch.ones(2, device=name).device == d1
            assert module.current_stream().device == d1
        finally:
            module.set_device(0)

    @check
    def memory_is_accounted_per_device() -> None:
        before = [module.memory_allocated(i) for i in range(2)]
        big = torch.empty(1 << 18, device=d1)  # 1 MiB
        after = [module.memory_allocated(i) for i in range(2)]
        assert after[0] == before[0], (before, after)
        assert after[1] - before[1] >= 1 << 20, (before, after)
        free, total = module.mem_get_info(1)
        assert total == module.get_device_properties(1).total_memory, (free, total)
        del big

    @check
    def autograd_on_the_second_device() -> None:
        w = torch.randn(7, 3, generator=torch.Generator().manual_seed(1), requires_grad=True)
        w1 = w.detach().to(d1).requires_grad_()
        (x.to(d1) @ w1).tanh().sum().backward()
        (x @ w).tanh().sum().backward()
        assert w1.grad.device == d1
        torch.testing.assert_close(w1.grad.cpu(), w.grad)

    @check
    def a_missing_index_names_the_setting() -> None:
        try:
            torch.zeros(1, device=f"{name}:2")
        except RuntimeError as exc:
            assert f"ACCELKIT_{name.upper()}_DEVICES" in str(exc), exc
        else:
            raise AssertionError(f"{name}:2 was created")

    @check
    def save_and_load_keep_the_device() -> None:
        buffer = io.BytesIO()
        torch.save(x.to(d1), buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)
        assert loaded.device == d1, loaded.device
        torch.testing.assert_close(loaded.cpu(), x)

    @check
    def storage_resize_keeps_the_device() -> None:
        a = x.to(d1)
        storage = a.untyped_storage()
        storage.resize_(0)
        storage.resize_(x.numel() * 4)
        assert storage.device == d1 and a.device == d1

    if name in ("tpu", "ref"):
        @check
        def compiled_training_step_on_the_second_device() -> None:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(7, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
            model(x).sum().backward()
            grad = model[0].weight.grad.clone()
            model.zero_grad()
            on_device = model.to(d1)
            out = torch.compile(on_device, backend=name)(x.to(d1)).sum()
            out.backward()
            assert out.device == d1 and on_device[0].weight.grad.device == d1
            torch.testing.assert_close(on_device[0].weight.grad.cpu(), grad)

    results = {}
    for check_name, fn in checks.items():
        try:
            fn()
            results[check_name] = "ok"
        except Exception:
            results[check_name] = traceback.format_exc(limit=4)
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
