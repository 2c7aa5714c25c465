"""``accelkit run``: run an unmodified PyTorch script on a backend and report on it at exit.

- :mod:`.launch` activates the backend, runs the script as ``python script.py`` would (or a
  module, as ``python -m``) and passes its exit code, exception or signal through;
- :mod:`.report` reduces :func:`accelkit.stats` and the run's memory samples to the report
  (a versioned JSON-ready dict) and renders it as text;
- :mod:`.render_html` renders the same report as one self-contained HTML page;
- :mod:`.compare` (``accelkit compare``) puts the estimates of several reports in one table.
"""

from accelkit._run.launch import RunOptions, run

__all__ = ["RunOptions", "run"]
