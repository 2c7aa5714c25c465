"""``accelkit new-backend NAME``: write an installable plugin package for a new device backend.

The package is rendered from the templates in ``accelkit/_scaffold-template/`` (shipped as
package data): every ``*.tmpl`` file, with its path and text carrying upper-case tokens such as
``__BACKEND__`` and ``__PACKAGE__`` (:func:`tokens`). As written it is a complete backend that
delegates to CPU torch, as ``ref`` does: straight after ``pip install -e DIR`` it is listed by
``accelkit devices``, its own tests pass, and so does every test of the quick conformance profile
that runs (the gaps it declares, each with a reason, are the runtime's).

A name is refused, and nothing is written, when it could not become a device of its own
(:func:`check_name`): it is not a lower-case identifier, is a Python keyword, is announced by an
installed plugin (the in-tree ``ref``, ``tpu``, ``neuron`` included), is a device type PyTorch
already parses, collides with what activation adds to torch (``torch.<name>``,
``Tensor.<name>()``, ``Tensor.is_<name>``, ``Module.<name>()``), or its package name is importable.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import keyword
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
from torch.nn.utils.rnn import PackedSequence

from accelkit._errors import ScaffoldError
from accelkit._plugins import _torch_device_type, registry

TEMPLATE_DIR = "_scaffold-template"
TEMPLATE_SUFFIX = ".tmpl"

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_TOKEN = re.compile(r"__[A-Z][A-Z_]*[A-Z]__")


@dataclass(frozen=True)
class Names:
    """The names one backend name gives the package: ``my_chip`` is imported as
    ``accelkit_my_chip``, installed as ``accelkit-my-chip`` and has a ``MyChipAllocator``."""

    backend: str
    package: str
    distribution: str
    class_prefix: str

    @classmethod
    def of(cls, backend: str) -> Names:
        return cls(
            backend=backend,
            package=f"accelkit_{backend}",
            distribution="accelkit-" + backend.replace("_", "-"),
            class_prefix="".join(part.capitalize() for part in backend.split("_")),
        )


def check_name(name: str) -> None:
    """Refuse a name that cannot be a new backend's.

    :raises ScaffoldError: the message names the culprit and how to choose another name.
    """
    if not _NAME.match(name):
        suggestion = _suggest(name)
        raise ScaffoldError(
            f"{name!r} is not a valid backend name: a backend name is a lower-case Python "
            "identifier (a-z, then a-z, 0-9 or '_'), because it becomes the device type "
            f"(torch.device('<name>')), the module torch.<name> and the package accelkit_<name>"
            + (f"; try {suggestion!r}" if suggestion else "")
        )
    if keyword.iskeyword(name):
        raise ScaffoldError(
            f"{name!r} is a Python keyword, so torch.{name} could not be written in code; "
            f"choose another name, such as {'my' + name!r}"
        )
    # Before torch's own names: in a process where a backend is active, its name is torch's too.
    owner = _owner(name)
    if owner:
        raise ScaffoldError(f"backend name {name!r} is taken: {owner}")
    if _torch_device_type(name):
        raise ScaffoldError(
            f"{name!r} is a device type PyTorch already defines (torch.device({name!r}) parses), "
            f"so a backend cannot take it; choose another name, such as {'my' + name!r}"
        )
    clash = _torch_attribute_clash(name)
    if clash:
        raise ScaffoldError(
            f"{name!r} collides with {clash}: activating a backend adds torch.{name}, "
            f"Tensor.{name}(), Tensor.is_{name} and Module.{name}(), and PyTorch refuses to "
            f"replace what exists; choose another name, such as {'my' + name!r}"
        )
    package = Names.of(name).package
    where = _importable(package)
    if where:
        raise ScaffoldError(
            f"a module named {package} is already importable ({where}), and the new package "
            f"would have that name; uninstall or remove it, or choose another backend name"
        )


def default_directory(name: str) -> Path:
    """Where ``accelkit new-backend NAME`` writes without ``--dir``: ``./accelkit-NAME``."""
    return Path.cwd() / Names.of(name).distribution


def tokens(names: Names) -> dict[str, str]:
    """What each template token becomes for ``names``."""
    version = _accelkit_version()
    bound = f">={version}" if version else ""
    return {
        "__BACKEND__": names.backend,
        "__PACKAGE__": names.package,
        "__DISTRIBUTION__": names.distribution,
        "__CLASS__": names.class_prefix,
        "__ACCELKIT_REQUIREMENT__": f"accelkit{bound}",
        "__ACCELKIT_TEST_REQUIREMENT__": f"accelkit[conformance]{bound}",
    }


def render(name: str) -> dict[PurePosixPath, str]:
    """The package for backend ``name``: relative path -> text. Checks nothing about ``name``.

    :raises RuntimeError: a template uses a token :func:`tokens` does not define (a bug here).
    """
    values = tokens(Names.of(name))

    def substitute(text: str, where: str) -> str:
        def value(match: re.Match) -> str:
            try:
                return values[match.group(0)]
            except KeyError:
                raise RuntimeError(f"scaffold template {where}: unknown token {match.group(0)}") from None

        return _TOKEN.sub(value, text)

    files: dict[PurePosixPath, str] = {}
    for relative, template in _templates():
        target = PurePosixPath(substitute(str(relative), str(relative))[: -len(TEMPLATE_SUFFIX)])
        files[target] = substitute(template.read_text(encoding="utf-8"), str(relative))
    return files


def new_backend(name: str, directory: str | Path | None = None) -> tuple[Path, list[PurePosixPath]]:
    """Write the package for a new backend ``name`` into ``directory`` (default: ./accelkit-NAME).

    The name and the directory are checked first; on any refusal nothing is written. A write
    that fails part-way removes what it wrote.

    :returns: the directory and the files written, relative to it.
    :raises ScaffoldError: the name is refused (:func:`check_name`), the directory exists and is
        not an empty directory, or it could not be written.
    """
    check_name(name)
    root = Path(directory) if directory is not None else default_directory(name)
    _check_directory(root)
    files = render(name)
    existed = root.is_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        for relative, text in files.items():
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    except OSError as exc:
        _remove_written(root, existed)
        raise ScaffoldError(f"could not write the package into {root}: {exc}; nothing was left there") from exc
    return root, sorted(files)


# -- helpers ---------------------------------------------------------------------------------------


def _templates() -> list[tuple[PurePosixPath, importlib.resources.abc.Traversable]]:
    """Every template file, with its path relative to the template directory, in a fixed order."""
    found = []

    def walk(node, prefix: PurePosixPath) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                walk(child, prefix / child.name)
            elif child.name.endswith(TEMPLATE_SUFFIX):
                found.append((prefix / child.name, child))

    walk(importlib.resources.files("accelkit").joinpath(TEMPLATE_DIR), PurePosixPath())
    if not found:
        raise RuntimeError(f"accelkit is installed without its {TEMPLATE_DIR} package data")
    return found


def _suggest(name: str) -> str | None:
    """A valid name close to ``name`` ("My-Chip" -> "my_chip"), or None."""
    candidate = re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_").lstrip("0123456789_")
    return candidate if _NAME.match(candidate) and not keyword.iskeyword(candidate) else None


def _torch_attribute_clash(name: str) -> str | None:
    """What of torch's already has a name that activating backend ``name`` would add, or None."""
    # The attributes torch.utils.generate_methods_for_privateuse1_backend and
    # torch._register_device_module add at activation, and refuse to overwrite.
    places = [
        (torch, name, f"torch.{name}"),
        (torch.Tensor, name, f"torch.Tensor.{name}"),
        (torch.Tensor, f"is_{name}", f"torch.Tensor.is_{name}"),
        (torch.nn.Module, name, f"torch.nn.Module.{name}"),
        (PackedSequence, name, f"PackedSequence.{name}"),
        (PackedSequence, f"is_{name}", f"PackedSequence.is_{name}"),
    ]
    for owner, attribute, shown in places:
        if hasattr(owner, attribute):
            return shown
    if _importable(f"torch.{name}"):  # a submodule not imported yet
        return f"the module torch.{name}"
    return None


def _importable(module: str) -> str | None:
    """Where ``module`` would be imported from, or None when it cannot be imported."""
    try:
        spec = importlib.util.find_spec(module)
    except ValueError:  # imported already, without a spec
        return "already imported"
    except ImportError:
        return None
    if spec is None:
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or ()) or "unknown location"


def _owner(name: str) -> str | None:
    """Who already announces backend ``name`` (installed plugins, in-tree ones included), or None."""
    record = registry().get(name)
    if record is None:
        return None
    if record.in_tree:
        return f"it is accelkit's in-tree backend ({record.origin}); choose another name"
    return f"the plugin {record.origin} announces it; choose another name, or uninstall that plugin first"


def _accelkit_version() -> str | None:
    """The running accelkit's public version (no local label: a ``>=`` bound cannot carry one)."""
    try:
        return importlib.metadata.version("accelkit").split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def _check_directory(root: Path) -> None:
    if root.is_symlink() or root.exists():
        if not root.is_dir():
            raise ScaffoldError(f"{root} exists and is not a directory; give a new or empty directory with --dir")
        if any(root.iterdir()):
            raise ScaffoldError(
                f"{root} exists and is not empty, and new-backend never overwrites files; give a new "
                "or empty directory with --dir, or remove that one"
            )


def _remove_written(root: Path, existed: bool) -> None:
    """Undo a failed write: ``root`` was new, or an empty directory (checked before writing)."""
    if not existed:
        shutil.rmtree(root, ignore_errors=True)
        return
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
