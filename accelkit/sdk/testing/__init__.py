"""Testing a backend against itself: shipped, so a third-party backend runs what the in-tree ones run.

- :mod:`accelkit.sdk.testing.generic`: the device-generic tests (views and aliasing, printing,
  training, bad input, ``out=``, edge inputs, Python scalars), each comparing the device with the
  CPU.
- :mod:`accelkit.sdk.testing.plugin`: the pytest plugin that activates the device under test
  and provides the ``dev`` and ``no_gc`` fixtures. Run the generic tests on a backend with::

      pytest -p accelkit.sdk.testing.plugin --pyargs accelkit.sdk.testing.generic --accelkit-device NAME

- :mod:`accelkit.sdk.testing.parity`: train a model on the device and on the CPU from the same
  start and compare losses, final state and inference outputs (needs no pytest).

The helpers below are for test modules that run under the plugin. Running the tests needs
``pytest`` and ``hypothesis`` (``pip install 'accelkit[test]'``).
"""

from accelkit.sdk.testing._device import device_under_test, holds, require_dtype

__all__ = ["device_under_test", "holds", "require_dtype"]
