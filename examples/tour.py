"""The product tour (``make demo``): one training script, unmodified, on every backend here.

    python examples/tour.py [--steps 20] [--out demo-reports]

Runs ``examples/train_mlp.py`` under ``accelkit run`` on each available accelkit device (tpu,
neuron; ref only when neither is), eager and with ``--compile``, each next to the same run on
the CPU. Then it puts the losses side by side and compares what each run reported: how much ran
on the device, what compiled, peak memory, and the estimated time on the target (an estimate,
from the backend's model of the chip). Each run's HTML report is in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import accelkit
from accelkit.sdk import format_bytes

EXAMPLE = Path(__file__).resolve().parent / "train_mlp.py"
TOURED = ("tpu", "neuron")


def available_devices() -> tuple[list[str], list[str]]:
    """The toured devices that can run here, and a line for each that cannot."""
    rows = {r.name: r for r in accelkit.devices()}
    here, missing = [], []
    for name in TOURED:
        row = rows.get(name)
        if row is not None and row.available:
            here.append(name)
        else:
            missing.append(f"{name}: {row.reason if row else 'not installed'}")
    return (here or ["ref"]), missing


def run(device: str, compiled: bool, steps: int, out: Path) -> dict:
    """One ``accelkit run`` of the example; its losses and report."""
    name = f"{device}-compiled" if compiled else device
    directory = out / name
    directory.mkdir(parents=True, exist_ok=True)
    losses = directory / "losses.json"
    command = [sys.executable, "-m", "accelkit", "run", "--device", device, "--report", str(directory),
               str(EXAMPLE), "--device", device, "--steps", str(steps), "--json", str(losses)]
    if compiled:
        command.append("--compile")
    env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"}
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"tour: the {name} run failed (exit {result.returncode}); its output is above")
    return {"name": name, "losses": json.loads(losses.read_text()),
            "report": json.loads((directory / "report.json").read_text()), "html": directory / "report.html"}


def print_losses(runs: list[dict]) -> None:
    cpu = runs[0]["losses"]["cpu_losses"]
    names = ["cpu", *(r["name"] for r in runs)]
    print("  ".join(f"{n:>15}" for n in ["step", *names]))
    for step, reference in enumerate(cpu):
        cells = [f"{step:>15}", f"{reference:>15.6f}", *(f"{r['losses']['losses'][step]:>15.6f}" for r in runs)]
        print("  ".join(cells))
    worst = [max(abs(a - b) for a, b in zip(r["losses"]["losses"], r["losses"]["cpu_losses"])) for r in runs]
    print("  ".join([f"{'max |diff|':>15}", f"{'-':>15}", *(f"{w:>15.2e}" for w in worst)]))


def print_comparison(runs: list[dict], steps: int) -> None:
    def cells(run: dict) -> list[str]:
        report = run["report"]
        ops, memory, compiled, estimate = report["ops"], report["memory"], report["compile"], report["estimate"]
        device = report["device"]
        return [
            f"{device['target']} ({'simulated' if device['simulated'] else 'real'})",
            f"{100 * ops['device_share']:.1f}%",
            str(ops["totals"]["fallback"]),
            f"{compiled['graphs_captured']} / {compiled['programs_compiled']}",
            format_bytes(memory["peak_bytes"]),
            *((f"{estimate[key] / steps * 1e6:.1f} µs" for key in ("seconds", "launch_seconds", "total_seconds"))
              if estimate else ["no estimate"] * 3),
            f"{report['wall_seconds']:.1f} s",
        ]

    labels = ["target", "ran on the device", "CPU-fallback runs", "graphs / programs", "peak memory",
              "est. device time/step", "est. launch time/step", "est. total/step", "wall time (here)"]
    columns = [cells(r) for r in runs]
    print("  ".join([f"{'':>22}", *(f"{r['name']:>22}" for r in runs)]))
    for i, label in enumerate(labels):
        print("  ".join([f"{label:>22}", *(f"{c[i]:>22}" for c in columns)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="demo-reports", help="where each run's report goes")
    args = parser.parse_args()
    out = Path(args.out)

    devices, missing = available_devices()
    print(f"accelkit tour: {EXAMPLE.name}, {args.steps} Adam steps of a small MLP, unmodified, under "
          f"`accelkit run` on {', '.join(devices)}, eager and compiled, each next to the same run on the CPU.")
    for line in missing:
        print(f"  not toured: {line}")
    runs = [run(device, compiled, args.steps, out) for device in devices for compiled in (False, True)]

    print("\nlosses, from the same weights and batches:")
    print_losses(runs)
    print("\nwhat each run reported (accelkit run). Times are estimates, not measurements. Device time is "
          "each backend's model of its chip (tpu: a roofline per XLA program; neuron: a simulation of the "
          "engines with each kernel's fixed costs); launch time is the same rule on both (each program "
          "handed to the device costs the target's published per-launch time; see docs/estimates.md).")
    print_comparison(runs, args.steps)
    print("\nHTML reports (ops by path, estimated time by op family, memory over the run):")
    for r in runs:
        print(f"  {r['html']}")


if __name__ == "__main__":
    main()
