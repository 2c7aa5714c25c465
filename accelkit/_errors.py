"""The errors accelkit raises. Each message names the culprit and the fix."""


class AccelkitError(RuntimeError):
    """Base of accelkit's own errors."""


class UnknownDeviceError(AccelkitError, ValueError):
    """A device name that no backend and no built-in torch device answers to."""


class DeviceUnavailableError(AccelkitError):
    """A named device exists as a backend but cannot run in this process; says why."""


class BackendConflictError(AccelkitError):
    """A second, different PrivateUse1 backend was asked for in a process that already has one."""


class FallbackDeniedError(AccelkitError, NotImplementedError):
    """An op has no native kernel or decomposition and the CPU-fallback policy is ``deny``."""
