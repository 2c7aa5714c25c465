"""Modules: every ModuleInfo of PyTorch's ``module_db`` on the device, compared with the CPU.

One test per (module, dtype, variant), following PyTorch's ``TestModule.test_cpu_gpu_parity``:
the module is built on the CPU from each module input's constructor arguments, copied to the
device with its parameters and buffers, and both copies run the same forward inputs in eval
mode.

- ``forward``: outputs must match the CPU's;
- ``backward``: gradients of the inputs and of every parameter, for the same random output
  gradients, must match the CPU's.

Module inputs that PyTorch skips in ``test_cpu_gpu_parity`` on every device are skipped with
its reason.
"""

from __future__ import annotations

import copy
import itertools
import zlib

import pytest
import torch
from torch.testing._internal.common_modules import module_db

from accelkit_conformance import session, upstream
from accelkit_conformance.cases import Case, param_id
from accelkit_conformance.compare import (
    assert_same,
    map_tensors,
    tensors_in,
    to_device_leaf,
)

SETTINGS = session.current()
upstream.skip_test_fn_lookup()


def _cases():
    for info in module_db:
        supported = info.supported_dtypes(SETTINGS.device.type) if hasattr(info, "supported_dtypes") else info.dtypes
        for dtype, name in zip(SETTINGS.torch_dtypes, SETTINGS.dtypes):
            if dtype not in supported:
                continue
            skip = upstream.skip_reason(info.decorators, upstream.MODULE_TEST, dtype, info.name)
            marks = [pytest.mark.skip(reason=skip)] if skip else []
            variants = ["forward", "backward"] if SETTINGS.profile.module_backward else ["forward"]
            for variant in variants:
                yield pytest.param(info, dtype, variant, id=param_id(info.name, name, variant), marks=marks)


def _to_device(value):
    return map_tensors(value, lambda t: to_device_leaf(t, SETTINGS.device))


@pytest.mark.parametrize("info, dtype, variant", list(_cases()))
def test_module(info, dtype, variant, recorder):
    case = Case("modules", info.name, str(dtype).removeprefix("torch."), variant)
    tolerance = SETTINGS.declared.tolerance(case) or upstream.tolerance(info.decorators, upstream.MODULE_TEST, dtype)
    backward = variant == "backward"
    seed = zlib.crc32(info.name.encode())
    torch.manual_seed(seed)
    inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=backward, training=False)
    # An expected failure runs every input: passing on the profile's first few says nothing.
    declared = SETTINGS.declared.lookup(case)
    limit = None if declared is not None and declared.kind == "xfail" else SETTINGS.profile.module_inputs
    ran = 0
    for i, module_input in enumerate(itertools.islice(inputs, limit)):
        if module_input.forward_input is None:
            continue
        where = f"module input {i} ({module_input.desc or 'default'})"
        args, kwargs = module_input.constructor_input.args, module_input.constructor_input.kwargs
        torch.manual_seed(seed + i)
        cpu_module = info.module_cls(*args, **kwargs).to(dtype)
        cpu_module.eval()
        fargs, fkwargs = module_input.forward_input.args, module_input.forward_input.kwargs
        if info.is_lazy:  # materialise the parameters once, so both copies share them
            with torch.no_grad():
                cpu_module(*copy.deepcopy(fargs), **copy.deepcopy(fkwargs))
        dev_module = copy.deepcopy(cpu_module).to(SETTINGS.device)
        dev_args, dev_kwargs = _to_device(fargs), _to_device(fkwargs)
        expected = cpu_module(*fargs, **fkwargs)
        with recorder.measure():
            actual = dev_module(*dev_args, **dev_kwargs)
        assert_same(actual, expected, where=f"{where}: output", tolerance=tolerance)
        if backward:
            ran += _check_backward(cpu_module, dev_module, (fargs, fkwargs), (dev_args, dev_kwargs),
                                   expected, actual, where, recorder, tolerance, seed + i)
        else:
            ran += 1
    if not ran:
        why = "no module input has a differentiable output" if backward else "the ModuleInfo has no forward inputs"
        pytest.skip(f"{info.name} {case.dtype} {variant}: {why}")


def _check_backward(cpu_module, dev_module, cpu_inputs, dev_inputs, expected, actual, where, recorder,
                    tolerance, seed) -> int:
    cpu_outs = [t for t in tensors_in(expected)]
    dev_outs = [t for t in tensors_in(actual)]
    wanted = [k for k, t in enumerate(cpu_outs) if t.requires_grad and t.is_floating_point()]
    cpu_leaves = [t for t in tensors_in(cpu_inputs) if t.requires_grad] + list(cpu_module.parameters())
    dev_leaves = [t for t in tensors_in(dev_inputs) if t.requires_grad] + list(dev_module.parameters())
    if not wanted or not cpu_leaves:
        return 0
    missing = [k for k in wanted if not dev_outs[k].requires_grad]
    if missing:
        raise AssertionError(f"{where}: output tensor(s) {missing} do not require grad on the device (they do on CPU)")
    generator = torch.Generator().manual_seed(seed)
    grads_out = [torch.randn(cpu_outs[k].shape, dtype=cpu_outs[k].dtype, generator=generator) for k in wanted]
    cpu_grads = torch.autograd.grad([cpu_outs[k] for k in wanted], cpu_leaves, grads_out, allow_unused=True)
    with recorder.measure():
        dev_grads = torch.autograd.grad(
            [dev_outs[k] for k in wanted], dev_leaves,
            [to_device_leaf(g, SETTINGS.device) for g in grads_out], allow_unused=True,
        )
    names = [f"input {k}" for k in range(len(cpu_leaves) - len(list(cpu_module.parameters())))]
    names += [f"parameter {n}" for n, _ in cpu_module.named_parameters()]
    for name, got, want, leaf in zip(names, dev_grads, cpu_grads, cpu_leaves):
        want = torch.zeros_like(leaf) if want is None else want
        got = torch.zeros_like(leaf) if got is None else got
        assert_same(got, want, where=f"{where}: gradient of {name}", tolerance=tolerance)
    return 1
