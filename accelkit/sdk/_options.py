"""Backend options read from the environment, refused with a clear error when misspelt."""

from __future__ import annotations

import os
from collections.abc import Sequence


def env_choice(variable: str, choices: Sequence[str], default: str) -> str:
    """The value of the environment variable ``variable`` (case and surrounding blanks ignored),
    one of ``choices``; ``default`` when it is unset or empty.

    :raises ValueError: the value is not one of ``choices``; the message names the variable,
        the value and the choices.
    """
    value = os.environ.get(variable, "").strip().lower() or default
    if value not in choices:
        raise ValueError(f"{variable}={value!r}: use one of {', '.join(choices)}")
    return value


def env_count(variable: str, default: int, unit: str, lowest: int = 1, highest: int | None = None) -> int:
    """The whole number in the environment variable ``variable``; ``default`` when it is unset or
    empty. ``unit`` names what is counted, for the error message.

    :raises ValueError: the value is not a whole number from ``lowest`` to ``highest`` (no upper
        bound when None); the message names the variable, the value and the range.
    """
    value = os.environ.get(variable, "").strip()
    if not value:
        return default
    try:
        count = int(value)
    except ValueError:
        count = None
    if count is None or count < lowest or (highest is not None and count > highest):
        bounds = f"from {lowest} to {highest}" if highest is not None else f"of at least {lowest}"
        raise ValueError(f"{variable}={value!r}: use a whole number of {unit} {bounds}")
    return count


#: Set to ``1`` (tests, conformance runs): compile quickly, at the cost of the programs' speed.
FAST_COMPILE_ENV = "ACCELKIT_FAST_COMPILE"


def fast_compile() -> bool:
    """Whether ``ACCELKIT_FAST_COMPILE=1`` asks backends to compile quickly rather than well:
    for runs whose programs execute once or twice (tests, conformance), where compiling is most
    of the time. Floating-point results may differ by rounding (optimised code fuses
    multiply-adds and vectorises functions, as one program compiled for two CPUs may differ);
    dtypes, shapes, errors, integer and boolean results may not. A backend without such a
    trade-off ignores it.

    :raises ValueError: the value is not ``0`` or ``1``.
    """
    return env_choice(FAST_COMPILE_ENV, ("0", "1"), "0") == "1"


MAX_DEVICES = 64


def device_count_from_env(backend: str, default: int = 1) -> int:
    """How many devices of a simulated ``backend`` one process gets: ``ACCELKIT_<BACKEND>_DEVICES``
    (e.g. ``ACCELKIT_TPU_DEVICES=4``, the chips of a TPU host), else ``default``.

    More than one needs accelkit's native extension (:mod:`accelkit._native`), which the
    runtime loads at activation.

    :raises ValueError: the value is not a whole number from 1 to 64; the message names the
        variable and the value.
    """
    return env_count(f"ACCELKIT_{backend.upper()}_DEVICES", default, "devices", 1, MAX_DEVICES)
