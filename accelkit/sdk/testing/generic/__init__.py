"""The device-generic tests: each holds the device under test to what the CPU does.

Run them on a backend (one backend per pytest process)::

    pytest -p accelkit.sdk.testing.plugin --pyargs accelkit.sdk.testing.generic --accelkit-device NAME

The device comes from ``--accelkit-device``, else ``$ACCELKIT_TEST_DEVICE``, else ``ref``; a
dtype the device's dtype rules refuse is skipped with the refusal as the reason. The modules
read the device at import (:func:`accelkit.sdk.testing.device_under_test`), so they are
importable only under the plugin :mod:`accelkit.sdk.testing.plugin`.
"""
