"""The errors accelkit raises. Each message names the culprit and the fix."""


class AccelkitError(RuntimeError):
    """Base of accelkit's own errors."""


class UnknownDeviceError(AccelkitError, ValueError):
    """A device name that no backend and no built-in torch device answers to."""


class DeviceUnavailableError(AccelkitError):
    """A named device exists as a backend but cannot run in this process; says why."""


class BackendConflictError(AccelkitError):
    """Two backends compete for one slot: a second, different PrivateUse1 backend was asked for
    in a process that already has one, or a plugin announced a backend name another owns."""


class PluginError(AccelkitError):
    """A backend plugin's own code raised (at import or in a hook); names the plugin and the hook.

    Anything a plugin raises becomes this error, ``SystemExit``, ``GeneratorExit`` and other
    ``BaseException`` subclasses included; only ``KeyboardInterrupt`` passes through. The
    plugin's exception is the error's ``__cause__``.
    """


class FallbackDeniedError(AccelkitError, NotImplementedError):
    """An op has no native kernel or decomposition and the CPU-fallback policy is ``deny``."""


class ScaffoldError(AccelkitError, ValueError):
    """``accelkit new-backend`` refused its arguments (a name that cannot be a new backend's, a
    directory that is not new or empty); nothing was written."""
