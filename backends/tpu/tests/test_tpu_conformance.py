"""The tpu backend's conformance expectations (backends/tpu/conformance.toml), as the suite reads them."""

from __future__ import annotations

from accelkit_backends import tpu


def test_tpu_declares_its_64_bit_dtypes_unsupported_with_reasons():
    expectations = tpu.accelkit_conformance_expectations("tpu")
    for dtype in ("float64", "complex128"):
        assert "64-bit" in expectations.unsupported_dtypes[dtype]
    assert "float32" not in expectations.unsupported_dtypes


def test_expectations_are_only_for_tpu():
    assert tpu.accelkit_conformance_expectations("ref") is None
