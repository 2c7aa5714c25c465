"""The ``torch.backends`` entry point: runs at the end of ``import torch``.

It must never make ``import torch`` fail, so every error becomes a warning (``SystemExit`` and
other ``BaseException`` subclasses included; only ``KeyboardInterrupt`` passes through). It
activates a backend only when ``ACCELKIT_DEVICE`` names one or exactly one real accelerator
plugin is present; ``ACCELKIT_AUTOLOAD=0`` turns it off.
"""

from __future__ import annotations

import os
import warnings


def autoload() -> None:
    if os.environ.get("ACCELKIT_AUTOLOAD", "1").strip() == "0":
        return
    try:
        from accelkit._selection import autoload as activate_if_unambiguous

        activate_if_unambiguous()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - an exception here would abort `import torch`
        warnings.warn(
            f"accelkit did not activate a device while torch was imported: "
            f"{type(exc).__name__}: {str(exc).rstrip('.') or 'no message'}. Call "
            "accelkit.select_device() to see the full error, or set ACCELKIT_AUTOLOAD=0.",
            RuntimeWarning,
            stacklevel=2,
        )
