"""Session fixtures shared by the vLLM tests: the tiny models, written once, and generate.py's
runs, each configuration run once (vLLM's CPU platform reference serves both the platform tests
and the server test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """``tiny_model("llama" | "qwen3")``: the checkpoint directory of that tiny random model."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            sys.path.insert(0, str(HERE))
            import tiny_models

            made[name] = getattr(tiny_models, f"make_tiny_{name}")(tmp_path_factory.mktemp(f"tiny-{name}"))
        return made[name]

    return get


@pytest.fixture(scope="session")
def generate_run():
    """``generate_run(model_dir, device, dtype, *args)``: generate.py's RESULT (a dict) for that
    configuration, on ``device`` (None: vLLM's CPU platform), with a token budget of 16 per step
    (the longest prompt is prefilled in chunks) and ``args`` added; run once per session.

    :raises AssertionError: the run failed (its output's tail in the message).
    """
    runs: dict[tuple, dict] = {}

    def run(model_dir: Path, device: str | None, dtype: str = "float32", *args: str) -> dict:
        key = (str(model_dir), device, dtype, args)
        if key not in runs:
            env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"}
            env["HF_HUB_OFFLINE"] = "1"
            if device:
                env["ACCELKIT_DEVICE"] = device
            cmd = [sys.executable, str(HERE / "generate.py"), str(model_dir), "--dtype", dtype,
                   "--max-num-batched-tokens", "16", *args]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            assert proc.returncode == 0 and lines, (
                f"{device or 'cpu'} {dtype} {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
            )
            runs[key] = json.loads(lines[-1].removeprefix("RESULT "))
            if device is None:
                assert runs[key]["platform"] == "CpuPlatform"
        return runs[key]

    return run
