"""accelkit's shared conformance suite: PyTorch's OpInfo and module databases, accelkit's
contract checks and dynamic-shape cases, run against one backend per subprocess.

Run it with ``accelkit conformance run --backend NAME``; the result format is
:mod:`accelkit_conformance.schema`.
"""
