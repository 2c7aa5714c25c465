"""The tpu backend's conformance expectations (backends/tpu/conformance.toml), as the suite reads
them: through the core's default, the expectations file next to the plugin."""

from __future__ import annotations

from pathlib import Path

from accelkit.sdk import Expectations, backends


def test_tpu_declares_its_64_bit_dtypes_unsupported_with_reasons():
    expectations = backends()["tpu"].expectations()
    for dtype in ("float64", "complex128"):
        assert "64-bit" in expectations.unsupported_dtypes[dtype]
    assert "float32" not in expectations.unsupported_dtypes


def test_the_expectations_are_the_file_next_to_the_plugin():
    view = backends()["tpu"]
    assert not view.implements("accelkit_conformance_expectations")
    shipped = Expectations.from_toml(Path(__file__).parents[1] / "conformance.toml")
    assert view.expectations() == shipped != backends()["neuron"].expectations()
