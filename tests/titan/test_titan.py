"""TorchTitan trains unchanged on tpu and neuron: its own trainer, command line and configs,
compared with the same configuration on ``ref`` (CPU kernels, the same random stream).

Every run is TorchTitan 0.2's ``torchtitan.train`` under ``torchrun`` (``launch.py``): dense
(llama3), mixture-of-experts (qwen3) and diffusion (flux) families; FSDP2 (sharded parameters
built on the meta device, initialised after sharding), tensor parallelism, expert parallelism,
FlexAttention with document masking, a DCP checkpoint resumed, ``--compile``.

Tolerance for tpu and neuron against ref: losses agree to ``rtol=2e-3``. All three start from
the same weights and data and compute with TorchTitan's default mixed precision (bfloat16
matmuls, float32 reductions); they differ in the order in which matmuls and reductions
accumulate (XLA's and the NeuronCore's tiling against the CPU's kernels) and in the last bit of
transcendental functions, which bfloat16 rounding and AdamW's first, sign-like steps carry into
the next steps: measured at most 3e-4 relative over the runs here (and 0 between ranks counts on one backend where the order is
the same). A wrong gradient, a missed reduction or another initialisation moves the loss by far
more (another seed: 2e-2 at step 1; a lost gradient reduction: 5e-2 by step 3).
"""

from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("torchtitan", reason="TorchTitan is a test dependency: pip install -e '.[titan]'")

import assets  # noqa: E402
import launch  # noqa: E402

#: The full matrix runs with ACCELKIT_TITAN=full (make titan); the quick tests always.
FULL = os.environ.get("ACCELKIT_TITAN", "").strip().lower() == "full"
titan_full = pytest.mark.skipif(not FULL, reason="the full TorchTitan matrix runs with ACCELKIT_TITAN=full (make titan)")

RTOL = 2e-3
BACKENDS = ["tpu", "neuron"]


def _trained(run: launch.TitanRun, steps: int) -> dict[int, float]:
    assert run.ok, f"TorchTitan failed (exit {run.returncode}):\n{run.failure()}"
    assert sorted(run.losses) == list(range(1, steps + 1)), run.losses
    assert all(math.isfinite(v) for v in run.losses.values()), run.losses
    return run.losses


def _close(got: dict[int, float], want: dict[int, float], rtol: float = RTOL) -> None:
    assert got.keys() == want.keys(), (got, want)
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
    print(f"losses {got}\nagainst {want}\nworst relative difference {worst:.1e} (rtol {rtol:.0e})")  # make titan's log
    assert worst <= rtol, f"losses {got} against {want}: {worst:.2e} relative"


class _Runs:
    """Runs of one configuration, cached: ref's serves every backend's comparison."""

    def __init__(self, tree, tmp_path_factory):
        self.tree, self.tmp = tree, tmp_path_factory
        self._done: dict[tuple, launch.TitanRun] = {}

    def __call__(self, backend: str, model: str, flavor: str, *, nproc: int = 1, steps: int = 3,
                 extra: tuple = (), config: dict | None = None, env: dict | None = None) -> launch.TitanRun:
        key = (backend, model, flavor, nproc, steps, extra, repr(config), repr(env))
        if key not in self._done:
            workdir = self.tmp.mktemp(f"{model}-{flavor}-{backend}-{nproc}")
            self._done[key] = launch.run(backend, model, flavor, workdir, nproc=nproc, steps=steps,
                                         extra=list(extra), config=config, env=env, tree=self.tree)
        return self._done[key]


@pytest.fixture(scope="module")
def titan_tree(tmp_path_factory):
    """TorchTitan's test assets, written once, linked into every run's directory."""
    return assets.write_titan_tree(tmp_path_factory.mktemp("titan-assets"), flux=FULL)


@pytest.fixture(scope="module")
def titan(titan_tree, tmp_path_factory):
    return _Runs(titan_tree, tmp_path_factory)


# -- quick (CI): a few steps of a tiny TorchTitan llama3 on 2 ranks, each backend -----------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tiny_llama_trains_on_two_ranks_with_fsdp2_as_on_ref(titan, backend):
    want = _trained(titan("ref", "llama3", "tiny", nproc=2), 3)
    run = titan(backend, "llama3", "tiny", nproc=2)
    _close(_trained(run, 3), want)
    assert all(gib > 0 for gib in run.memory_gib), run.memory_gib  # TorchTitan reads memory_stats()


# -- the full matrix (make titan) -----------------------------------------------------------------


FAMILIES = {
    # name: (model, flavor, ranks, TorchTitan flags)
    "llama3_debugmodel": ("llama3", "debugmodel", 1, ()),
    "llama3_debugmodel_fsdp2": ("llama3", "debugmodel", 2, ()),
    "llama3_debugmodel_tp2": ("llama3", "debugmodel", 2, ("--parallelism.tensor-parallel-degree", "2")),
    "llama3_flex_documents_fsdp2": ("llama3", "tiny_flex", 2, ()),
    "qwen3_debugmodel_tp2": ("qwen3", "debugmodel", 2, ("--parallelism.tensor-parallel-degree", "2")),
    "qwen3_moe_ep2": ("qwen3", "tiny_moe", 2, ("--parallelism.expert-parallel-degree", "2")),
    "flux_tiny": ("flux", "tiny", 1, ()),
}


@titan_full
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FAMILIES)
def test_torchtitan_configurations_train_as_on_ref(titan, name, backend):
    model, flavor, nproc, extra = FAMILIES[name]
    want = _trained(titan("ref", model, flavor, nproc=nproc, extra=extra), 3)
    _close(_trained(titan(backend, model, flavor, nproc=nproc, extra=extra), 3), want)


@titan_full
def test_flux_debug_trains_on_tpu_as_on_ref(titan):
    # TorchTitan's own flux-debug (256-pixel images, 1536-wide blocks). On neuron it needs more
    # host memory than the simulator has here (docs/torchtitan.md); neuron trains flux "tiny".
    want = _trained(titan("ref", "flux", "flux-debug", steps=2, config={"training": {"img_size": 256}}), 2)
    _close(_trained(titan("tpu", "flux", "flux-debug", steps=2, config={"training": {"img_size": 256}}), 2), want)


@titan_full
@pytest.mark.parametrize("backend", ["ref", *BACKENDS])
def test_two_ranks_fsdp2_equal_one_rank_at_the_same_global_batch(titan, titan_tree, tmp_path_factory, backend):
    data = assets.write_equal_samples(tmp_path_factory.mktemp("equal-samples"), titan_tree.tokenizer, seq_len=128)
    # AdamW with eps=1 moves each weight by lr * g / (|g| + 1), about lr * g for these gradients:
    # linear in the gradient, so a missed or doubled reduction (or divide factor) shows in the
    # losses, and rounding noise in a near-zero gradient is not amplified to a step of lr, as
    # Adam's usual sign-like first step does (with eps=1e-8 the two runs part by 3e-4 by step 3).
    optimizer = {"lr": 0.5, "eps": 1.0}
    # float32 throughout: TorchTitan's default bfloat16 is autocast in 1 process and bfloat16
    # parameters under FSDP2, two different computations (they part by 1e-5 at step 1).
    training = {"dataset_path": str(data), "seq_len": 128, "mixed_precision_param": "float32"}
    one = titan(backend, "llama3", "tiny", nproc=1, steps=4,
                config={"training": {**training, "local_batch_size": 4}, "optimizer": optimizer})
    two = titan(backend, "llama3", "tiny", nproc=2, steps=4,
                config={"training": {**training, "local_batch_size": 2}, "optimizer": optimizer})
    # The same samples, weights and float32 math: only the order in which the batch's gradient
    # and loss are summed differs.
    _close(_trained(two, 4), _trained(one, 4), rtol=1e-5)
    losses = _trained(one, 4)
    assert losses[4] < losses[1] - 0.01, losses  # the steps did train


@titan_full
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_resumed_from_its_dcp_checkpoint_equals_the_uninterrupted_run(titan, tmp_path_factory, backend):
    workdir = tmp_path_factory.mktemp(f"resume-{backend}")
    # last_save_model_only: TorchTitan's last step saves only the model by default; the 2-step run
    # ends on its checkpoint, which must hold the optimizer and the dataloader to be resumed.
    checkpoint = {"checkpoint": {"enable": True, "interval": 2, "folder": "checkpoint", "last_save_model_only": False}}
    whole = launch.run(backend, "llama3", "tiny", workdir / "whole", nproc=2, steps=4, tree=titan.tree)
    first = launch.run(backend, "llama3", "tiny", workdir / "parts", nproc=2, steps=2, config=checkpoint,
                       tree=titan.tree)
    resumed = launch.run(backend, "llama3", "tiny", workdir / "parts", nproc=2, steps=4, config=checkpoint,
                         tree=titan.tree)
    want = _trained(whole, 4)
    assert _trained(first, 2) == {1: want[1], 2: want[2]}
    assert resumed.ok, resumed.failure()
    assert sorted(resumed.losses) == [3, 4], resumed.losses  # it started after the saved step 2
    assert resumed.losses == {3: want[3], 4: want[4]}


@titan_full
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_training_equals_eager(titan, backend):
    eager = _trained(titan(backend, "llama3", "tiny", nproc=2), 3)
    compiled = titan(backend, "llama3", "tiny", nproc=2, extra=("--compile.enable", "--compile.backend", backend))
    _close(_trained(compiled, 3), eager, rtol=1e-4)
