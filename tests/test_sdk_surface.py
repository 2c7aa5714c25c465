"""accelkit.sdk is the whole surface a backend uses: the in-tree backends and the conformance
package import no private accelkit module, and what the SDK offers them works."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest
import torch

import accelkit
from accelkit import sdk
from conftest import run_python

ROOT = Path(__file__).resolve().parents[1]
#: Backend code and the conformance package; a backend's own tests may look inside the runtime.
CHECKED = [p for d in ("backends", "conformance") for p in sorted((ROOT / d).rglob("*.py"))
           if "tests" not in p.relative_to(ROOT).parts]


def _private_imports(path: Path) -> list[str]:
    """``module:line name`` for every import of a private accelkit module (``accelkit._x``,
    ``from accelkit import _x``) in ``path``, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "accelkit" and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_the_checked_files_exist():
    assert len(CHECKED) > 30
    assert any(p.name == "custom_ops.py" for p in CHECKED)


def test_backends_and_conformance_import_no_private_accelkit_module():
    offending = [line for path in CHECKED for line in _private_imports(path)]
    assert not offending, "use accelkit.sdk instead:\n" + "\n".join(offending)


def test_the_scan_finds_private_imports(tmp_path, monkeypatch):
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from accelkit._runtime.device import tensors\n    import accelkit._plugins\n"
                      "from accelkit import _errors, sdk\nfrom accelkit.sdk import meta_tensor\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(line.split()[-1] for line in _private_imports(sample)) == [
        "accelkit._errors", "accelkit._plugins", "accelkit._runtime.device", "accelkit._runtime.device.tensors",
    ]


def test_every_public_sdk_name_is_importable():
    for name in sdk.__all__:
        assert getattr(sdk, name) is not None, name


# -- what the SDK gives a backend --------------------------------------------------------------


def test_active_backend_and_device_model(dev):
    assert sdk.active_backend() == dev.type
    assert sdk.active_device_model().memory_bytes == torch.ref.get_device_properties().total_memory


def test_device_generator_is_the_one_manual_seed_seeds(dev):
    torch.manual_seed(7)
    state = sdk.device_generator().get_state()
    torch.manual_seed(8)
    assert not torch.equal(state, sdk.device_generator().get_state())
    torch.manual_seed(7)
    assert torch.equal(state, sdk.device_generator().get_state())


def test_backends_is_a_read_only_view():
    found = sdk.backends()
    assert {"ref", "tpu", "neuron"} <= set(found)
    with pytest.raises(TypeError):
        found["ref"] = None
    view = found["ref"]
    assert view.in_tree and view.info.name == "ref" and view.probe().available
    with pytest.raises(AttributeError):
        view.name = "other"
    assert view.implements("accelkit_make_compiler")
    assert view.implements("accelkit_make_process_group")
    assert not view.implements("accelkit_autocast_policy")


def test_defaults_fill_hooks_a_backend_leaves_out():
    view = sdk.backends()["ref"]
    assert not view.implements("accelkit_autocast_policy")
    assert view.autocast_policy() is sdk.CUDA_LIKE_AUTOCAST
    # No expectations hook: the conformance.toml next to the plugin is read.
    assert not view.implements("accelkit_conformance_expectations")
    expected = sdk.Expectations.from_toml(ROOT / "backends" / "ref" / "conformance.toml")
    assert view.expectations() == expected


@pytest.mark.parametrize("value,expected", [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_fast_compile_follows_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(sdk.FAST_COMPILE_ENV, raising=False)
    else:
        monkeypatch.setenv(sdk.FAST_COMPILE_ENV, value)
    assert sdk.fast_compile() is expected


def test_a_misspelt_fast_compile_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(sdk.FAST_COMPILE_ENV, "yes")
    with pytest.raises(ValueError, match="ACCELKIT_FAST_COMPILE='yes': use one of 0, 1"):
        sdk.fast_compile()


def test_fallback_policy_follows_the_environment(monkeypatch):
    view = sdk.backends()["ref"]
    monkeypatch.delenv("ACCELKIT_FALLBACK", raising=False)
    assert view.fallback_policy() == "allow"
    monkeypatch.setenv("ACCELKIT_FALLBACK", "deny")
    assert view.fallback_policy() == "deny"


def test_env_choice(monkeypatch):
    monkeypatch.delenv("ACCELKIT_TEST_CHOICE", raising=False)
    assert sdk.env_choice("ACCELKIT_TEST_CHOICE", ("a", "b"), "a") == "a"
    monkeypatch.setenv("ACCELKIT_TEST_CHOICE", " B ")
    assert sdk.env_choice("ACCELKIT_TEST_CHOICE", ("a", "b"), "a") == "b"
    monkeypatch.setenv("ACCELKIT_TEST_CHOICE", "c")
    with pytest.raises(ValueError, match=r"ACCELKIT_TEST_CHOICE='c': use one of a, b"):
        sdk.env_choice("ACCELKIT_TEST_CHOICE", ("a", "b"), "a")


def test_env_count(monkeypatch):
    monkeypatch.delenv("ACCELKIT_TEST_COUNT", raising=False)
    assert sdk.env_count("ACCELKIT_TEST_COUNT", 7, "widgets") == 7
    monkeypatch.setenv("ACCELKIT_TEST_COUNT", " 12 ")
    assert sdk.env_count("ACCELKIT_TEST_COUNT", 7, "widgets", 2, 12) == 12
    for bad, bounds in (("13", "from 2 to 12"), ("1", "from 2 to 12"), ("2.5", "from 2 to 12")):
        monkeypatch.setenv("ACCELKIT_TEST_COUNT", bad)
        with pytest.raises(ValueError, match=rf"ACCELKIT_TEST_COUNT='{bad}': use a whole number of widgets {bounds}"):
            sdk.env_count("ACCELKIT_TEST_COUNT", 7, "widgets", 2, 12)
    monkeypatch.setenv("ACCELKIT_TEST_COUNT", "ten")
    with pytest.raises(ValueError, match=r"'ten': use a whole number of widgets of at least 16"):
        sdk.env_count("ACCELKIT_TEST_COUNT", 7, "widgets", 16)


def test_meta_helpers():
    t = sdk.meta_tensor((2, 3), torch.float16, (1, 2))
    assert t.device.type == "meta" and t.stride() == (1, 2) and t.dtype == torch.float16
    out = sdk.meta_call(torch.ops.aten.mm.default, sdk.meta_tensor((2, 3), torch.float32),
                        sdk.meta_tensor((3, 5), torch.float32))
    assert out.shape == (2, 5) and out.device.type == "meta"
    made = sdk.meta_call(torch.ops.aten.zeros.default, [4], dtype=torch.int8, device="ref")
    assert made.shape == (4,) and made.dtype == torch.int8 and made.device.type == "meta"
    # A device-hook op without a Meta kernel is answered through its CPU equivalent.
    conv = sdk.meta_call(
        torch.ops.aten.convolution_overrideable.default,
        sdk.meta_tensor((1, 2, 5, 5), torch.float32), sdk.meta_tensor((4, 2, 3, 3), torch.float32),
        None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
    )
    assert conv.shape == (1, 4, 3, 3)


def test_as_overload():
    aten = torch.ops.aten
    assert sdk.as_overload(aten.mm) is aten.mm.default
    assert sdk.as_overload(aten.mm.default) is aten.mm.default
    with pytest.raises(TypeError, match="custom op"):
        sdk.as_overload("mm")


@torch.library.custom_op("accelkit_sdk_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


def test_register_kernel_after_activation(dev):
    sdk.register_kernel(_twice, lambda x: x * 2)  # ref's arrays are CPU tensors
    accelkit.reset_stats()
    result = _twice(torch.arange(3.0, device=dev))
    assert result.device == dev and result.cpu().tolist() == [0.0, 2.0, 4.0]
    assert accelkit.stats()["ops"]["accelkit_sdk_test.twice.default"]["native"] == 1
    with pytest.raises(accelkit.AccelkitError, match="already has a ref kernel"):
        sdk.register_kernel(_twice, lambda x: x)


def test_register_kernel_before_activation_is_refused():
    proc = run_python("""
        import accelkit, accelkit.sdk as sdk, torch
        try:
            sdk.register_kernel(torch.ops.aten.mm.default, lambda a, b: a)
        except accelkit.AccelkitError as e:
            print("refused:", e)
    """)
    assert "refused: registering a kernel for aten.mm.default needs an active backend" in proc.stdout, proc.stderr


def test_hook_implementations_take_no_name():
    """The in-tree backends implement plain hooks: none takes ``name`` (the core routes)."""
    import accelkit_backends.neuron
    import accelkit_backends.ref
    import accelkit_backends.tpu

    for plugin in (accelkit_backends.ref, accelkit_backends.tpu, accelkit_backends.neuron):
        for attr in vars(plugin).values():
            if isinstance(attr, types.FunctionType) and hasattr(attr, "accelkit_impl"):
                assert "name" not in attr.__code__.co_varnames[: attr.__code__.co_argcount], attr


def test_the_sdk_reaches_the_runtime_through_one_module():
    sdk_dir = ROOT / "accelkit" / "sdk"
    reaching = sorted({
        str(path.relative_to(ROOT))
        for path in sdk_dir.rglob("*.py") if "testing" not in path.relative_to(sdk_dir).parts
        for line in _private_imports(path) if line.split()[-1].startswith("accelkit._runtime")
    })
    assert reaching == ["accelkit/sdk/_runtime_link.py"]
