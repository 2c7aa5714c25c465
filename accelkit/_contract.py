"""The contract's answers with the core's defaults filled in, where a plugin leaves a hook out
or answers ``None`` (the defaults each hook's spec in :mod:`accelkit.hookspecs` states).

The runtime, the conformance suite and :func:`accelkit.sdk.backends` read a backend's autocast
policy and expectations here, so a default is decided in one place.
"""

from __future__ import annotations

from pathlib import Path

from accelkit._plugins import BackendRecord
from accelkit.sdk._kernels import CUDA_LIKE_AUTOCAST, AutocastPolicy
from accelkit.sdk._records import Expectations

#: The expectations file the core reads next to a plugin's module when the plugin has no
#: ``accelkit_conformance_expectations`` hook.
EXPECTATIONS_FILE = "conformance.toml"


def autocast_policy(record: BackendRecord) -> AutocastPolicy:
    """The backend's autocast policy; :data:`~accelkit.sdk.CUDA_LIKE_AUTOCAST` by default.

    :raises PluginError: the hook raised or answered with another type.
    """
    return record.answer("accelkit_autocast_policy", AutocastPolicy) or CUDA_LIKE_AUTOCAST


def expectations(record: BackendRecord) -> Expectations:
    """The backend's declared gaps: its hook's answer, else the ``conformance.toml`` next to its
    plugin module, else none.

    :raises PluginError: the hook raised or answered with another type.
    :raises ValueError: the expectations file is malformed (the message names it).
    """
    if record.supports("accelkit_conformance_expectations"):
        return record.answer("accelkit_conformance_expectations", Expectations) or Expectations()
    module_file = record.plugin_file()
    if module_file is None:
        return Expectations()
    path = Path(module_file).with_name(EXPECTATIONS_FILE)
    return Expectations.from_toml(path) if path.is_file() else Expectations()

