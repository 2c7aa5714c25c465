"""TorchTitan's startup on accelkit devices: launch to first step, cold and warm compile cache.

For each backend, TorchTitan 0.2's ``torchtitan.train`` trains its llama3 ``debugmodel`` (1
process, 3 steps, the debug configuration of ``tests/titan/launch.py``) three times in a row:

- ``cold``: a new, empty ``ACCELKIT_COMPILE_CACHE`` directory;
- ``warm``: the same directory again (tpu's eager programs and jax's compiled executables are
  read from it instead of compiled);
- ``none``: no compile cache at all, what a user who sets nothing gets.

``ref`` (CPU kernels, nothing to compile) is the baseline of the same run. Each figure is the
seconds from starting ``torchrun`` to TorchTitan's first logged step, and to its exit. Prints
JSON, then ratio lines. Needs the ``titan`` extra (``pip install -e '.[titan]'``).

    python bench/bench_titan_startup.py [--backends tpu,neuron] [--model llama3] [--flavor debugmodel]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "titan"))
import assets  # noqa: E402
import launch  # noqa: E402


def _timed(backend: str, model: str, flavor: str, workdir: Path, tree, cache: Path | None) -> dict:
    env = {"ACCELKIT_COMPILE_CACHE": str(cache)} if cache else {}
    run = launch.run(backend, model, flavor, workdir, steps=3, env=env, tree=tree)
    if not run.ok:
        raise SystemExit(f"{backend}: TorchTitan failed:\n{run.failure()}")
    return {"first_step_s": run.seconds_to_first_step, "total_s": run.seconds, "losses": run.losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="tpu,neuron")
    parser.add_argument("--model", default="llama3")
    parser.add_argument("--flavor", default="debugmodel")
    opts = parser.parse_args()

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="titan-startup-") as tmp:
        root = Path(tmp)
        tree = assets.write_titan_tree(root / "assets")
        results["ref"] = {"none": _timed("ref", opts.model, opts.flavor, root / "ref", tree, None)}
        for backend in opts.backends.split(","):
            cache = root / f"cache-{backend}"
            results[backend] = {
                "cold": _timed(backend, opts.model, opts.flavor, root / f"{backend}-cold", tree, cache),
                "warm": _timed(backend, opts.model, opts.flavor, root / f"{backend}-warm", tree, cache),
                "none": _timed(backend, opts.model, opts.flavor, root / f"{backend}-none", tree, None),
            }
    print(json.dumps(results, indent=1))
    base = results["ref"]["none"]["first_step_s"]
    print(f"\nlaunch -> first step of {opts.model} {opts.flavor}, 1 process (ref: {base:.1f} s)")
    for backend in opts.backends.split(","):
        for kind in ("cold", "warm", "none"):
            seconds = results[backend][kind]["first_step_s"]
            print(f"  {backend:7s} {kind:5s} {seconds:6.1f} s   {seconds / base:5.2f}x ref")


if __name__ == "__main__":
    main()
