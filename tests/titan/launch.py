"""Run TorchTitan's own trainer under torchrun on an accelkit backend and read its losses back.

    run("tpu", "llama3", "tiny", nproc=2, steps=3, extra=["--parallelism.tensor-parallel-degree", "2"])

lays out TorchTitan's test assets (``assets.py``) in a working directory, writes the debug
configuration of TorchTitan 0.2's ``debug_model.toml`` (the wheel ships none) with the model
named, and starts ``python -m torch.distributed.run --standalone --nproc-per-node N -m
torchtitan.train --job.config-file ...`` there with ``ACCELKIT_DEVICE`` set: TorchTitan's own
command line, unchanged. Flavors of ``accelkit_flavors.py`` are importable by TorchTitan
(``--experimental.custom_import``). The :class:`TitanRun` holds the losses TorchTitan logged per
step, the seconds from launch to its first step, and for a failed run the first exception.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import assets  # noqa: E402

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([-+0-9.eE]+|nan|inf|-inf)")
_MEMORY = re.compile(r"memory:\s*([-0-9.]+)GiB")

# TorchTitan 0.2's debug_model.toml, values only, with the debug model's seed fixed so that a
# run on any backend and any number of ranks initialises the same weights.
_DEBUG_CONFIG = {
    "job": {"dump_folder": "./outputs", "description": "accelkit: TorchTitan's debug training"},
    "metrics": {"log_freq": 1},
    "model": {"hf_assets_path": "./tests/assets/tokenizer"},
    "optimizer": {"name": "AdamW", "lr": 8e-4, "eps": 1e-8},
    "lr_scheduler": {"warmup_steps": 2, "decay_ratio": 0.8, "decay_type": "linear", "min_lr_factor": 0.0},
    "training": {"local_batch_size": 2, "seq_len": 128, "max_norm": 1.0, "steps": 3, "dataset": "c4_test"},
    "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                    "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "context_parallel_degree": 1},
    "checkpoint": {"enable": False},
    "activation_checkpoint": {"mode": "selective", "selective_ac_option": "2"},
    "compile": {"enable": False},
    "validation": {"enable": False},
    "debug": {"seed": 0},
    "experimental": {"custom_import": "accelkit_flavors"},
}


@dataclass
class TitanRun:
    """One run: its exit code (None: killed at the timeout), the losses TorchTitan logged per
    step, the memory it logged, its times, and its output."""

    returncode: int | None
    losses: dict[int, float]
    memory_gib: list[float]
    seconds: float
    seconds_to_first_step: float | None
    log: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def failure(self) -> str:
        """The end of the output, for an assertion message."""
        lines = [_ANSI.sub("", line) for line in self.log.splitlines() if line.strip()]
        return "\n".join(lines[-40:])


def write_config(path: Path, model: str, flavor: str, overrides: dict | None = None) -> Path:
    """The debug configuration with ``model`` and ``flavor`` named and ``overrides`` merged in
    per section, written as TOML to ``path``."""
    sections = _merged(_DEBUG_CONFIG, {"model": {"name": model, "flavor": flavor}})
    sections = _merged(sections, overrides)
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _flux_config(tree: assets.TitanTree) -> dict:
    """flux's debug training: the cc12m-style shard, text encoders built with random weights from
    their configs (``test_mode``, which also tokenizes with ``hf_assets_path``), 64-pixel images."""
    return {
        "job": {"custom_config_module": "torchtitan.models.flux.job_config"},
        "training": {"dataset": "cc12m-test", "test_mode": True, "img_size": 64,
                     "classifier_free_guidance_prob": 0.447},
        "encoder": {"t5_encoder": str(tree.t5_encoder), "clip_encoder": str(tree.clip_encoder)},
        "activation_checkpoint": {"mode": "full"},
    }


def _merged(base: dict, overrides: dict | None) -> dict:
    """``base`` with each section of ``overrides`` merged into its own (a copy; neither changes)."""
    merged = {name: dict(values) for name, values in base.items()}
    for name, values in (overrides or {}).items():
        merged.setdefault(name, {}).update(values)
    return merged


def run(backend: str, model: str, flavor: str, workdir: Path, *, nproc: int = 1, steps: int = 3,
        extra: list[str] = (), env: dict[str, str] | None = None, config: dict | None = None,
        timeout: float = 900, tree: assets.TitanTree | None = None) -> TitanRun:
    """Run TorchTitan's trainer once on ``backend`` in ``workdir`` (see the module docstring).

    ``config`` overrides sections of the debug configuration; ``extra`` goes to TorchTitan's
    command line after it. ``tree``: assets laid out already (elsewhere: linked into
    ``workdir``), else they are written there.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if tree is None:
        tree = assets.write_titan_tree(workdir, flux=model == "flux")
    elif tree.root.resolve() != workdir.resolve() and not (workdir / "tests").exists():
        (workdir / "tests").symlink_to(tree.root / "tests", target_is_directory=True)
    entry = "torchtitan.train"
    if model == "flux":  # TorchTitan 0.2 trains flux from its own entry point, with its config extension
        entry = "torchtitan.models.flux.train"
        config = _merged(_flux_config(tree), config)
    toml = write_config(workdir / f"{model}_{flavor}.toml", model, flavor, config)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", entry, "--job.config-file", str(toml), "--training.steps", str(steps), *extra]
    # ACCELKIT_REF_MEMORY: the core tests' 1 GiB ref device (tests/conftest.py) is not TorchTitan's;
    # ref keeps its default capacity unless ``env`` names one.
    child_env = {key: value for key, value in os.environ.items()
                 if not key.startswith("ACCELKIT_DEVICE") and key != "ACCELKIT_REF_MEMORY"}
    child_env.update({
        "ACCELKIT_DEVICE": backend, "HF_HOME": str(workdir / "hf-home"), "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
    })
    if nproc > 1:  # TorchTitan 0.2 puts rank r on device f"{type}:{LOCAL_RANK}"
        child_env[f"ACCELKIT_{backend.upper()}_DEVICES"] = str(nproc)
    child_env.update(env or {})

    output: list[str] = []
    first_step: list[float] = []
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=workdir, env=child_env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)

    def pump() -> None:
        for line in process.stdout:
            output.append(line)
            if not first_step and _LOSS.search(_ANSI.sub("", line)):
                first_step.append(time.monotonic() - start)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        returncode = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        returncode = None
    reader.join(timeout=30)
    text = "".join(output)
    log = workdir / f"{model}_{flavor}_{backend}_{nproc}.log"
    for attempt in range(2, 100):  # a run resumed in the same directory keeps the first one's log
        if not log.exists():
            break
        log = workdir / f"{model}_{flavor}_{backend}_{nproc}.{attempt}.log"
    log.write_text(text)
    losses: dict[int, float] = {}
    memory = []
    for line in text.splitlines():
        line = _ANSI.sub("", line)
        match = _LOSS.search(line)
        if match:
            losses.setdefault(int(match.group(1)), float(match.group(2)))
            found = _MEMORY.search(line)
            if found:
                memory.append(float(found.group(1)))
    return TitanRun(returncode=returncode, losses=losses, memory_gib=memory,
                    seconds=round(time.monotonic() - start, 1),
                    seconds_to_first_step=round(first_step[0], 1) if first_step else None, log=text)


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend")
    parser.add_argument("model", nargs="?", default="llama3")
    parser.add_argument("flavor", nargs="?", default="tiny")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workdir")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # after --: TorchTitan's own flags
    opts = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    with tempfile.TemporaryDirectory(prefix="titan-") as tmp:
        done = run(opts.backend, opts.model, opts.flavor, Path(opts.workdir or tmp), nproc=opts.nproc,
                   steps=opts.steps, extra=extra)
    print(json.dumps({"returncode": done.returncode, "losses": done.losses, "memory_gib": done.memory_gib,
                      "seconds": done.seconds, "seconds_to_first_step": done.seconds_to_first_step}))
    if not done.ok:
        print(done.failure())
