"""accelkit's in-tree device backends; each registers through the ``accelkit.backends`` entry point."""
