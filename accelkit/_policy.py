"""Changing the CPU-fallback policy at run time."""

from __future__ import annotations

from types import TracebackType

from accelkit._errors import AccelkitError
from accelkit.sdk import FALLBACK_POLICIES


class fallback_policy:  # noqa: N801 - used like a function, as torch.set_grad_enabled is
    """Set the active backend's CPU-fallback policy: ``"deny"``, ``"warn"`` or ``"allow"``.

    Takes effect at once; used as a context manager it restores the previous policy on exit::

        with accelkit.fallback_policy("deny"):
            model(x)          # raises FallbackDeniedError on the first op run on the CPU

    :raises AccelkitError: no backend is active, or the policy is not one of the three.
    """

    def __init__(self, policy: str):
        from accelkit import _runtime

        if policy not in FALLBACK_POLICIES:
            raise AccelkitError(f"fallback policy must be one of {FALLBACK_POLICIES}, not {policy!r}")
        ctx = _runtime.active()
        if ctx is None:
            raise AccelkitError("no accelkit backend is active; call accelkit.select_device(...) first")
        self._ctx = ctx
        self._previous = ctx.fallback_policy
        ctx.fallback_policy = policy

    def __enter__(self) -> fallback_policy:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._ctx.fallback_policy = self._previous
