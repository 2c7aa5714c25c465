"""neuron's declared CPU-by-design ops (``kernels/cpu_by_design.py``): the coverage audit gives
them their own path with the reason, a run counts them as fallbacks and names them with the
reason in ``stats()``, and the fallback policy's refusal says why."""

from __future__ import annotations

import pytest
import torch

import accelkit
from accelkit.sdk import op_coverage

FFT = ("aten._fft_r2c.default", "aten._fft_r2c.out", "aten._fft_c2r.default", "aten._fft_c2c.out")


def test_the_audit_lists_declared_ops_apart_with_their_reason():
    coverage = op_coverage()
    for name in FFT:
        row = coverage[name]
        assert row["path"] == "cpu_by_design", name
        assert "no complex type" in row["detail"] and "FFT" in row["detail"]
    assert coverage["aten.from_file.default"]["path"] == "cpu_by_design"
    # an op with no kernel that neuron did not declare stays an accidental fallback
    undeclared = [row for row in coverage.values() if row["path"] == "fallback"]
    assert undeclared and all("declared" not in row["detail"] for row in undeclared)


def test_a_declared_op_runs_on_the_cpu_counted_as_a_fallback_with_its_reason(dev):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    with accelkit.fallback_policy("allow"):
        spectrum = torch.fft.rfft(x.to(dev))
        back = torch.fft.irfft(spectrum, n=16)
    torch.testing.assert_close(spectrum.cpu(), torch.fft.rfft(x))
    torch.testing.assert_close(back.cpu(), x, rtol=1e-5, atol=1e-5)
    stats = accelkit.stats()
    declared = stats["cpu_by_design"]
    assert set(declared) == {"aten._fft_r2c.default", "aten._fft_c2r.default"}
    for name, row in declared.items():
        assert row["fallback"] == stats["ops"][name]["fallback"] == 1
        assert "no complex type" in row["reason"]
    assert stats["totals"]["fallback"] >= 2  # still counted as fallbacks: a host round trip each


def test_an_undeclared_fallback_is_not_listed_as_by_design(dev):
    with accelkit.fallback_policy("allow"):
        torch.ops.aten._test_optional_intlist(torch.ones(3, dtype=torch.int32).to(dev), [1, 2, 3])
    stats = accelkit.stats()
    assert stats["ops"]["aten._test_optional_intlist.default"]["fallback"] == 1
    assert stats["cpu_by_design"] == {}


def test_deny_and_warn_say_the_declared_reason(dev):
    x = torch.randn(8).to(dev)
    with accelkit.fallback_policy("deny"), pytest.raises(accelkit.FallbackDeniedError,
                                                         match="by design on neuron .*no complex type"):
        torch.fft.rfft(x)
    with accelkit.fallback_policy("warn"), pytest.warns(UserWarning, match="by design on neuron: .*FFT"):
        torch.fft.fft(x.to(torch.complex64))
