"""tpu keeps a bounded number of XLA executables loaded (accelkit_backends.tpu.programs).

Each loaded executable holds host memory and memory mappings; without a bound, a process that
meets many shapes ends in "Cannot allocate memory" inside XLA. These run in fresh processes
with a small ``ACCELKIT_TPU_LIVE_PROGRAMS``.
"""

from __future__ import annotations

import json

from conftest import run_python

_MANY_SHAPES = """
    import json, torch, accelkit
    dev = accelkit.select_device("tpu")
    hot_cpu = torch.arange(5.0)
    hot = hot_cpu.to(dev)

    def maps():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    hot.neg().cpu()
    start = maps()
    wrong = []
    for n in range(1, 121):
        x = torch.arange(n) - 7
        if not torch.equal((torch.abs(x.to(dev)) * 3).cpu(), torch.abs(x) * 3):
            wrong.append(n)
        assert torch.equal(hot.neg().cpu(), -hot_cpu)  # used on every step: never unloaded
    # Shapes met again after their programs were unloaded compile again, to the same values.
    again = [(torch.abs(torch.arange(n).to(dev) - 7) * 3).cpu() for n in (1, 2, 3)]
    stats = accelkit.stats()
    print(json.dumps({
        "wrong": wrong,
        "again": [torch.equal(a, torch.abs(torch.arange(n) - 7) * 3) for a, n in zip(again, (1, 2, 3))],
        "loaded": stats["tpu"]["loaded_programs"],
        "ops": stats["tpu"]["compiled_programs"],
        "compiles": stats["compiles"],
        "maps_grew": maps() - start,
    }))
"""


def _many_shapes(limit: str | None) -> dict:
    done = run_python(_MANY_SHAPES, {"ACCELKIT_TPU_LIVE_PROGRAMS": limit} if limit else None, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_past_the_limit_the_least_recently_used_programs_are_unloaded_and_compile_again_when_met():
    bounded = _many_shapes("32")
    assert bounded["wrong"] == [] and all(bounded["again"])
    loaded = bounded["loaded"]
    assert loaded["limit"] == 32 and loaded["loaded"] <= 32
    assert loaded["unloads"] >= 1 and loaded["unloaded"] >= 120 * 2 - 32
    # The hot negation compiled once: it was never the least recently used.
    assert bounded["ops"]["aten.neg.default"] == 1
    # Recompiles are compiles: the count of abs programs covers the three shapes met again.
    assert bounded["ops"]["aten.abs.default"] >= 120 + 3

    unbounded = _many_shapes(None)
    assert unbounded["loaded"]["unloaded"] == 0 and unbounded["loaded"]["loaded"] >= 120 * 2
    # What the bound is for: the process's memory mappings stop growing with every new shape.
    assert bounded["maps_grew"] < unbounded["maps_grew"] / 3, (bounded["maps_grew"], unbounded["maps_grew"])


def test_a_misspelt_limit_fails_activation_naming_the_variable():
    done = run_python(
        """
        import accelkit
        accelkit.select_device("tpu")
        """,
        {"ACCELKIT_TPU_LIVE_PROGRAMS": "lots"},
    )
    assert done.returncode != 0
    assert "ACCELKIT_TPU_LIVE_PROGRAMS='lots': use a whole number of programs of at least 16" in done.stderr
