"""``KernelTable.on_cpu``: a backend's declaration that its hardware cannot compute an op, and
why. The declaration's effects on a running backend (the audit's ``cpu_by_design`` path, the
``stats()`` section, the policy's messages) are tested with neuron, which declares FFT."""

from __future__ import annotations

import pytest
import torch

from accelkit.sdk import KernelTable

aten = torch.ops.aten


def test_declared_ops_keep_their_reason():
    table = KernelTable("demo")
    table.on_cpu(aten._fft_r2c, aten._fft_c2c.default, reason="  no complex type  ")
    assert dict(table.cpu_reasons) == {aten._fft_r2c.default: "no complex type", aten._fft_c2c.default: "no complex type"}
    assert aten._fft_r2c.default not in table  # a declaration is not a kernel


@pytest.mark.parametrize("reason", ["", "   ", None], ids=repr)
def test_a_declaration_needs_a_reason(reason):
    with pytest.raises(ValueError, match="reason"):
        KernelTable("demo").on_cpu(aten._fft_r2c.default, reason=reason)


def test_an_op_with_a_kernel_cannot_also_be_declared_and_not_twice():
    table = KernelTable("demo")
    table.add(aten.relu.default, lambda x: x)
    with pytest.raises(ValueError, match="already"):
        table.on_cpu(aten.relu.default, reason="no way")
    table.on_cpu(aten._fft_r2c.default, reason="no complex type")
    with pytest.raises(ValueError, match="already"):
        table.on_cpu(aten._fft_r2c.default, reason="again")
    with pytest.raises(TypeError):
        table.on_cpu("fft", reason="not an op")


def test_the_declarations_are_read_only():
    table = KernelTable("demo")
    table.on_cpu(aten._fft_r2c.default, reason="no complex type")
    with pytest.raises(TypeError):
        table.cpu_reasons[aten.relu.default] = "sneaked in"  # type: ignore[index]
