"""The conformance suites' samples get their values from the CPU's generator (see
``accelkit_conformance.sample_draws``): same values as a CPU draw, the device tensor keeps its
shape, dtype, layout and ``requires_grad``, and no device program is run to fill it."""

from __future__ import annotations

from conftest import run_python

PROGRAM = """
import torch, accelkit
from torch.testing import make_tensor
from accelkit_conformance.sample_draws import draw_on_the_cpu

device = accelkit.select_device("tpu")
draw_on_the_cpu(device.type)
draw_on_the_cpu(device.type)  # twice is once
torch.manual_seed(7)
want = make_tensor((4, 6), dtype=torch.float32, device="cpu", low=-3, high=3, noncontiguous=True)
torch.manual_seed(7)
accelkit.reset_stats()
got = make_tensor((4, 6), dtype=torch.float32, device=device, low=-3, high=3, noncontiguous=True,
                  requires_grad=True)
ops = accelkit.stats()["ops"]
print("same values", torch.equal(got.detach().cpu(), want))
print("layout", got.device.type, got.shape == want.shape, got.stride() == want.stride(), got.is_contiguous())
print("leaf with grad", got.is_leaf, got.requires_grad)
print("drawn on device", any(op.startswith("aten.uniform") for op in ops))
"""


def test_samples_are_drawn_on_the_cpu_and_copied_with_their_layout():
    proc = run_python(PROGRAM)
    assert proc.returncode == 0, proc.stderr
    assert "same values True" in proc.stdout
    assert "layout tpu True True False" in proc.stdout
    assert "leaf with grad True True" in proc.stdout
    assert "drawn on device False" in proc.stdout
