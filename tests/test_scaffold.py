"""``accelkit new-backend``: which names it refuses, what it writes, and (end to end) that the
package it writes installs, is listed, and passes its own tests, the conformance contract suite
and accelkit's shipped device-generic tests.

The end-to-end test installs the package into this environment (editable, no dependencies)
and uninstalls it afterwards, whatever happened; a copy left by a run that was killed is
removed first. Each backend activation needs a process of its own, so everything it runs
runs in subprocesses.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import accelkit
from accelkit import hookspecs
from accelkit._cli import main as cli_main
from accelkit._errors import ScaffoldError
from accelkit._plugins import registry
from accelkit._scaffold import Names, check_name, default_directory, new_backend, render
from accelkit.sdk import BackendInfo, Expectations, hookimpl

REPO = Path(__file__).resolve().parents[1]
EXPECTED_FILES = {
    "pyproject.toml",
    "README.md",
    "accelkit_mychip/__init__.py",
    "accelkit_mychip/device.py",
    "accelkit_mychip/buffers.py",
    "accelkit_mychip/kernels.py",
    "accelkit_mychip/compiler.py",
    "accelkit_mychip/collectives.py",
    "accelkit_mychip/conformance.toml",
    "tests/conftest.py",
    "tests/test_backend.py",
}


# -- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mychip", "my_chip", "chip2", "x"])
def test_valid_names_are_accepted(name):
    check_name(name)


@pytest.mark.parametrize(("name", "culprit", "fix"), [
    ("My-Chip", "'My-Chip' is not a valid backend name", "try 'my_chip'"),
    ("MyChip", "lower-case Python identifier", "try 'mychip'"),
    ("2chip", "not a valid backend name", "try 'chip'"),
    ("_chip", "not a valid backend name", "try 'chip'"),
    ("my chip", "not a valid backend name", "try 'my_chip'"),
    ("chïp", "not a valid backend name", "a-z"),
    ("", "'' is not a valid backend name", "lower-case Python identifier"),
])
def test_names_that_are_not_lower_case_identifiers_are_refused_with_a_suggestion(name, culprit, fix):
    with pytest.raises(ScaffoldError) as info:
        check_name(name)
    assert culprit in str(info.value) and fix in str(info.value)


@pytest.mark.parametrize("name", ["class", "import", "lambda", "async"])
def test_python_keywords_are_refused(name):
    with pytest.raises(ScaffoldError, match=rf"'{name}' is a Python keyword.*choose another name"):
        check_name(name)


@pytest.mark.parametrize("name", ["cuda", "cpu", "meta", "xla", "mps", "hpu", "xpu", "mtia", "privateuseone"])
def test_pytorch_device_types_are_refused(name):
    with pytest.raises(ScaffoldError, match=rf"'{name}' is a device type PyTorch already defines"):
        check_name(name)


@pytest.mark.parametrize(("name", "clash"), [
    ("nn", "torch.nn"),
    ("fft", "torch.fft"),
    ("float", "torch.float"),
    ("leaf", "torch.Tensor.is_leaf"),
    ("quantized", "torch.Tensor.is_quantized"),
    ("train", "torch.nn.Module.train"),
    ("contrib", "the module torch.contrib"),
])
def test_names_activation_could_not_add_to_torch_are_refused(name, clash):
    with pytest.raises(ScaffoldError) as info:
        check_name(name)
    assert f"collides with {clash}" in str(info.value)
    assert "choose another name" in str(info.value)


@pytest.mark.parametrize("name", ["ref", "tpu", "neuron"])
def test_in_tree_backend_names_are_taken(name):
    with pytest.raises(ScaffoldError, match=rf"'{name}' is taken: it is accelkit's in-tree backend"):
        check_name(name)


def test_a_name_another_plugin_announces_is_taken():
    class Plugin:
        @hookimpl
        def accelkit_register_backend(self):
            return BackendInfo(name="scaffoldtaken")

    plugin = Plugin()
    accelkit.register_backend(plugin)
    try:
        with pytest.raises(ScaffoldError, match=r"'scaffoldtaken' is taken: the plugin .*Plugin object"):
            check_name("scaffoldtaken")
    finally:
        registry().unregister(plugin)


def test_a_name_whose_package_is_importable_is_refused(tmp_path, monkeypatch):
    (tmp_path / "accelkit_lookalike").mkdir()
    (tmp_path / "accelkit_lookalike" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ScaffoldError, match=r"a module named accelkit_lookalike is already importable"):
        check_name("lookalike")


def test_names_of_a_backend():
    names = Names.of("my_chip")
    assert (names.package, names.distribution, names.class_prefix) == ("accelkit_my_chip", "accelkit-my-chip", "MyChip")


# -- files ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package() -> dict[str, str]:
    return {str(path): text for path, text in render("mychip").items()}


def test_the_package_has_one_file_per_contract_area_tests_and_a_readme(package):
    assert set(package) == EXPECTED_FILES


def test_every_template_token_is_replaced(package):
    for path, text in package.items():
        assert "__BACKEND__" not in text and "__PACKAGE__" not in text, path
        for token in ("__DISTRIBUTION__", "__CLASS__", "__ACCELKIT_"):
            assert token not in text, (path, token)


def test_pyproject_declares_the_plugin_the_compiler_and_the_expectations(package):
    project = tomllib.loads(package["pyproject.toml"])
    meta = project["project"]
    assert meta["name"] == "accelkit-mychip"
    assert [d.split(">")[0] for d in meta["dependencies"]] == ["accelkit"]  # torch comes with accelkit
    assert meta["entry-points"]["accelkit.backends"] == {"mychip": "accelkit_mychip"}
    assert meta["entry-points"]["torch_dynamo_backends"] == {"mychip": "accelkit.sdk.dynamo_backends:mychip"}
    assert project["tool"]["setuptools"]["packages"] == ["accelkit_mychip"]
    assert project["tool"]["setuptools"]["package-data"] == {"accelkit_mychip": ["conformance.toml"]}


def test_python_files_parse_and_import_only_public_accelkit(package):
    for path, text in package.items():
        if not path.endswith(".py"):
            continue
        tree = ast.parse(text, filename=path)
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            for module in modules:
                if module.split(".")[0] == "accelkit":
                    assert not any(part.startswith("_") for part in module.split(".")), (path, module)


def _hook_spec_name(decorator: ast.expr) -> str | None:
    """``""`` for ``@hookimpl``, the spec's name for ``@hookimpl(specname=...)``, else None."""
    if ast.unparse(decorator) == "hookimpl":
        return ""
    if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "hookimpl":
        return next((k.value.value for k in decorator.keywords if k.arg == "specname"), "")
    return None


def test_hook_implementations_take_no_name_and_check_none(package):
    """The core calls each hook on the owning plugin only, so a hook takes a subset of its spec's
    arguments and never the backend's name; each lives in its contract area's module and the
    package's __init__ lists them."""
    assert not any("if name" in text for path, text in package.items() if path.endswith(".py"))
    hooks = {}
    for path, text in package.items():
        if not path.startswith("accelkit_mychip/") or not path.endswith(".py"):
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef):
                for decorator in node.decorator_list:
                    spec = _hook_spec_name(decorator)
                    if spec is not None:
                        hooks[spec or node.name] = (path, node)
    assert set(hooks) == {
        "accelkit_register_backend", "accelkit_probe", "accelkit_device_model", "accelkit_make_allocator",
        "accelkit_kernels", "accelkit_make_compiler", "accelkit_make_process_group",
    }
    init = package["accelkit_mychip/__init__.py"]
    for spec, (path, hook) in hooks.items():
        args = {a.arg for a in hook.args.args + hook.args.kwonlyargs}
        assert "name" not in args, spec
        assert args <= set(inspect.signature(getattr(hookspecs, spec)).parameters), spec
        assert path == "accelkit_mychip/__init__.py" or f" {hook.name}" in init, (spec, "not listed in __init__")


def test_the_expectations_file_loads(tmp_path, package):
    path = tmp_path / "conformance.toml"
    path.write_text(package["accelkit_mychip/conformance.toml"])
    assert isinstance(Expectations.from_toml(path), Expectations)


def test_new_backend_writes_into_the_default_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root, files = new_backend("mychip")
    assert root == default_directory("mychip") == tmp_path / "accelkit-mychip"
    assert {str(f) for f in files} == EXPECTED_FILES
    written = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert written == EXPECTED_FILES


def test_new_backend_writes_into_an_empty_directory(tmp_path):
    new_backend("mychip", tmp_path)
    assert (tmp_path / "accelkit_mychip" / "kernels.py").is_file()


def test_a_non_empty_directory_is_refused_and_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ScaffoldError, match="exists and is not empty.*--dir"):
        new_backend("mychip", tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "pkg").write_text("")
    with pytest.raises(ScaffoldError, match="exists and is not a directory"):
        new_backend("mychip", tmp_path / "pkg")


def test_a_refused_name_writes_nothing(tmp_path):
    with pytest.raises(ScaffoldError):
        new_backend("cuda", tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


def test_a_write_that_fails_part_way_leaves_nothing(tmp_path, monkeypatch):
    real = Path.write_text
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(self)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing)
    with pytest.raises(ScaffoldError, match="could not write the package.*No space left"):
        new_backend("mychip", tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


def test_cli_reports_a_refused_name_and_exits_2(tmp_path, capsys):
    assert cli_main(["new-backend", "cuda", "--dir", str(tmp_path / "pkg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelkit: error: 'cuda' is a device type")
    assert not (tmp_path / "pkg").exists()


def test_cli_writes_the_package_and_says_what_next(tmp_path, capsys):
    assert cli_main(["new-backend", "mychip", "--dir", str(tmp_path / "pkg")]) == 0
    out = capsys.readouterr().out
    assert f"pip install -e {tmp_path / 'pkg'}" in out
    assert "accelkit conformance run --backend mychip --profile quick" in out
    assert (tmp_path / "pkg" / "pyproject.toml").is_file()


def test_the_templates_ship_as_package_data():
    """Every template matches accelkit's package-data patterns (the editable install used by
    the tests reads them from the source tree either way)."""
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["accelkit"]
    templates = {p for p in (REPO / "accelkit" / "_scaffold-template").rglob("*") if p.is_file()}
    shipped = {p for pattern in patterns for p in (REPO / "accelkit").glob(pattern)}
    assert templates and templates == shipped


# -- end to end -----------------------------------------------------------------------------------

E2E_NAME = "scaffoldcheck"
E2E_DISTRIBUTION = Names.of(E2E_NAME).distribution


def _run(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELKIT_", "PYTEST_"))}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _uninstall(cwd: Path) -> None:
    proc = _run("-m", "pip", "uninstall", "--yes", E2E_DISTRIBUTION, cwd=cwd, timeout=120)
    assert proc.returncode == 0, f"could not uninstall {E2E_DISTRIBUTION}:\n{proc.stdout}\n{proc.stderr}"


def _installed() -> bool:
    importlib.invalidate_caches()
    return any(True for _ in importlib.metadata.distributions(name=E2E_DISTRIBUTION))


@pytest.fixture
def installed_scaffold(tmp_path):
    """The scaffolded package, installed editable into this environment; uninstalled at the end."""
    if importlib.util.find_spec("setuptools") is None or importlib.util.find_spec("pip") is None:
        pytest.skip("installing the scaffold needs pip and setuptools in this environment")
    if _installed():  # left by a run that was killed before its clean-up
        _uninstall(tmp_path)
    root = tmp_path / "pkg"
    proc = _run("-m", "accelkit", "new-backend", E2E_NAME, "--dir", str(root), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    try:
        proc = _run("-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "--quiet",
                    "-e", str(root), cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, f"pip install -e failed:\n{proc.stdout}\n{proc.stderr}"
        yield root
    finally:
        if _installed():
            _uninstall(tmp_path)
        assert not _installed()


def test_scaffolded_backend_is_listed_passes_its_tests_the_contract_suite_and_the_generic_tests(installed_scaffold, tmp_path):
    root = installed_scaffold
    started = time.monotonic()

    proc = _run("-m", "accelkit", "devices", "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = {entry["name"]: entry for entry in json.loads(proc.stdout)}
    assert listed[E2E_NAME]["available"] and listed[E2E_NAME]["simulated"], listed.get(E2E_NAME)
    assert listed[E2E_NAME]["origin"].startswith(f"accelkit_{E2E_NAME} ({E2E_DISTRIBUTION})")

    proc = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", cwd=root, timeout=300)
    assert proc.returncode == 0, f"the package's own tests failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout and "skipped" not in proc.stdout

    # The contract suite only: the whole quick profile (every OpInfo) takes far longer than a test should.
    out = tmp_path / "conformance"
    proc = _run("-m", "accelkit", "conformance", "run", "--backend", E2E_NAME, "--profile", "quick",
                "--suite", "contract", "--out", str(out), "--jobs", "2", "--no-report", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, f"conformance run failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    results = json.loads((out / E2E_NAME / "results.json").read_text())
    assert results["complete"]
    outcomes = [r["outcome"] for r in results["results"]]
    assert outcomes and set(outcomes) == {"pass"}, [r for r in results["results"] if r["outcome"] != "pass"][:5]

    # accelkit's shipped device-generic tests, as a third party runs them against its backend.
    proc = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "accelkit.sdk.testing.plugin",
                "--pyargs", "accelkit.sdk.testing.generic", "--accelkit-device", E2E_NAME, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, f"the generic tests failed on the scaffold:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout
    print(f"end to end: {len(outcomes)} contract tests and the generic suite passed; "
          f"{time.monotonic() - started:.0f}s after install")
