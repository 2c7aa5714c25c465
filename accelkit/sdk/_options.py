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
