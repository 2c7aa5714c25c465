"""``accelkit run``, as a user runs it: unmodified scripts in fresh processes, compared with
``python script.py`` (same output, exit status, traceback, signal) and with ``accelkit.stats()``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accelkit._run.report import format_seconds

TIMEOUT = 180


def run(*args: str, cwd: Path, env: dict[str, str] | None = None, python: bool = False):
    """``accelkit run ARGS`` (or, with ``python=True``, ``python ARGS``) in a fresh process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELKIT_", "ACCELERATE_"))}
    full_env.update(env or {})
    command = [sys.executable, *args] if python else [sys.executable, "-m", "accelkit", "run", *args]
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=TIMEOUT)


def script(tmp_path: Path, body: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


SELECTING = """
    import accelkit, torch
    dev = accelkit.select_device()
    x = torch.arange(6.0).to(dev)
    print(dev, (x * 2).sum().item())
"""


def test_a_script_that_selects_lands_on_the_named_device(tmp_path):
    path = script(tmp_path, SELECTING)
    result = run("--device", "ref", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ref:0 30.0\n"
    assert "accelkit run:" in result.stderr and "on ref:0" in result.stderr


def test_a_script_that_reads_accelkit_device_lands_on_it(tmp_path):
    path = script(tmp_path, """
        import os, torch
        dev = torch.device(os.environ["ACCELKIT_DEVICE"])
        print(dev.type, os.environ["ACCELERATE_TORCH_DEVICE"], torch.ones(3, device=dev).device)
    """)
    result = run("--device", "ref", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ref ref ref:0\n"


def test_arguments_argv_and_the_script_directory_are_the_scripts(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    path = script(tmp_path, """
        import sys, helper
        print(sys.argv, helper.VALUE, __name__)
    """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run("--device", "ref", str(path), "--lr", "0.1", "-x", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{[str(path), '--lr', '0.1', '-x']} 7 __main__\n"


def test_a_module_runs_as_python_dash_m(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys, accelkit\nprint(accelkit.active_backend(), sys.argv[1:])\n")
    result = run("--device", "ref", "-m", "pkg.train", "a", "--b", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ref ['a', '--b']\n"
    # The module's options, even those named as the launcher's, are the module's (vllm's --model).
    result = run("--device", "ref", "-m", "pkg.train", "--model", "x", "--device", "cpu", "-h", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ref ['--model', 'x', '--device', 'cpu', '-h']\n"


@pytest.mark.parametrize("ending", [
    "sys.exit(3)", "sys.exit('bad input')", "raise ValueError('boom')", "raise KeyboardInterrupt",
    "os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)", "sys.exit(0)",
])
def test_every_ending_passes_through_as_python_would(tmp_path, ending):
    path = script(tmp_path, f"""
        import os, signal, sys, time
        print("before", flush=True)
        def main():
            {ending}
        main()
    """)
    plain = run(str(path), cwd=tmp_path, python=True)
    wrapped = run("--device", "ref", str(path), cwd=tmp_path)
    assert wrapped.returncode == plain.returncode
    assert wrapped.stdout == plain.stdout == "before\n"
    report_at = wrapped.stderr.find("accelkit run:")
    assert report_at >= 0, wrapped.stderr  # the report is made whatever the ending
    # What Python printed (traceback, sys.exit message) comes first and is Python's own.
    assert wrapped.stderr[:report_at].rstrip("\n") == plain.stderr.rstrip("\n")


def test_a_failing_script_is_reported_with_its_exception(tmp_path):
    path = script(tmp_path, "raise RuntimeError('out of ideas')\n")
    result = run("--device", "ref", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert "exit 1, RuntimeError: out of ideas" in result.stderr


def test_a_bad_device_or_script_is_refused_before_anything_runs(tmp_path):
    path = script(tmp_path, "print('ran')\n")
    unknown = run("--device", "nosuchdevice", str(path), cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert "nosuchdevice" in unknown.stderr
    missing = run("--device", "ref", str(tmp_path / "missing.py"), cwd=tmp_path)
    assert missing.returncode == 2 and "no such script" in missing.stderr


FALLING_BACK = """
    import accelkit, torch
    dev = accelkit.select_device()
    x = torch.linspace(-0.5, 0.5, 5).to(dev)
    for _ in range(3):
        y = torch.erfinv(x)
    print(y.cpu().sum().item() == torch.erfinv(x.cpu()).sum().item())
"""


def test_fallback_policy_deny_stops_at_the_first_cpu_op(tmp_path):
    path = script(tmp_path, FALLING_BACK)
    result = run("--device", "ref", "--fallback", "deny", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert "FallbackDeniedError" in result.stderr and "erfinv" in result.stderr


def test_the_report_names_fallback_ops_with_advice(tmp_path):
    path = script(tmp_path, FALLING_BACK)
    result = run("--device", "ref", "--fallback", "allow", "--report", str(tmp_path / "out"), str(path),
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "True\n"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    top = report["ops"]["top_fallback"]
    assert top[0]["op"] == "aten.erfinv.out" and top[0]["count"] == 3
    assert "kernel" in top[0]["advice"]
    assert report["ops"]["policy"] == "allow"
    assert "fallback  aten.erfinv.out ×3" in result.stderr


STATS_SCRIPT = """
    import json, sys, accelkit, torch
    from torch import nn
    dev = accelkit.select_device()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(4, 8).to(dev)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad()
    print(loss.item())
    with open(sys.argv[1], "w") as f:
        json.dump(accelkit.stats(), f)
"""


@pytest.mark.parametrize("device", ["ref", "neuron"])
def test_the_reports_figures_are_the_stats_at_the_end(tmp_path, device):
    path = script(tmp_path, STATS_SCRIPT)
    out = tmp_path / "out"
    result = run("--device", device, "--report", str(out), str(path), str(tmp_path / "stats.json"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    stats = json.loads((tmp_path / "stats.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "accelkit-run-report/1"
    # Equal but for the frees after the script's last line: its tensors die with its globals;
    # the peak and every other count are the same.
    def after_the_frees(key: str) -> bool:  # what a free changes: current figures, counts of frees
        return key.endswith((".current", ".freed")) or (key.startswith("num_") and "free" in key)

    for snapshot in (report["stats"], stats):
        for key in [k for k in snapshot["memory"] if after_the_frees(k)]:
            snapshot["memory"].pop(key)
    assert report["stats"] == stats
    assert report["device"]["backend"] == device and report["device"]["device"] == f"{device}:0"
    ops = report["ops"]
    assert ops["totals"] == stats["totals"] and ops["executions"] == sum(stats["totals"].values()) > 0
    assert ops["device_share"] == pytest.approx(
        (stats["totals"]["native"] + stats["totals"]["decomposed"]) / ops["executions"])
    busiest = [sum(stats["ops"][row["op"]].values()) for row in ops["top_ops"]]
    assert busiest == sorted(busiest, reverse=True) and busiest[0] == max(sum(c.values()) for c in stats["ops"].values())
    for row in ops["top_ops"]:
        assert stats["ops"][row["op"]] == {k: row[k] for k in ("native", "decomposed", "fallback")}
    memory = report["memory"]
    assert memory["peak_bytes"] == stats["memory"]["allocated_bytes.peak"] > 0
    assert memory["capacity_bytes"] == stats["memory"]["capacity_bytes"]
    points = memory["timeline"]["points"]
    assert len(points) >= 2 and all(0 <= b <= memory["peak_bytes"] for _, b in points)
    if device == "neuron":
        estimate = report["estimate"]
        assert estimate["seconds"] == stats["estimate"]["seconds"] > 0
        assert estimate["target"] == stats["estimate"]["target"] == report["device"]["target"]
        assert sum(estimate["by_family"].values()) == pytest.approx(
            sum(row["seconds"] for row in stats["estimate"]["per_op"].values()))
        assert "estimate" in result.stderr and estimate["target"] in result.stderr
        # device + launch = total, in the report, in stats and in both renderings
        for key in ("launch_seconds", "total_seconds", "launches", "syncs"):
            assert estimate[key] == stats["estimate"][key]
        assert estimate["launches"] > 0 and estimate["syncs"] > 0 and estimate["launch_seconds"] > 0
        assert estimate["total_seconds"] == pytest.approx(estimate["seconds"] + estimate["launch_seconds"])
        line = f"{format_seconds(estimate['seconds'])} device + {format_seconds(estimate['launch_seconds'])} launch"
        assert line in result.stderr and line in (out / "report.html").read_text()
    else:
        assert report["estimate"] is None and stats["estimate"] is None
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    executions = f"{ops['executions']} executions"
    assert executions in result.stderr and executions in (out / "report.html").read_text()


def test_compile_redirects_torch_compile_to_the_device(tmp_path):
    path = script(tmp_path, """
        import accelkit, torch
        dev = accelkit.select_device()
        model = torch.nn.Linear(4, 3).to(dev)
        step = torch.compile(model, mode="max-autotune")   # written for a GPU: inductor
        x = torch.randn(2, 4).to(dev)
        print(torch.allclose(step(x).cpu(), model(x).cpu()))
    """)
    out = tmp_path / "out"
    result = run("--device", "ref", "--compile", "--report", str(out), str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "True\n"
    compiled = json.loads((out / "report.json").read_text())["compile"]
    assert compiled["redirected_calls"] == 1
    assert compiled["graphs_captured"] >= 1  # ref compiles no programs: it runs graphs op by op


def test_compile_says_when_the_script_compiles_nothing(tmp_path):
    path = script(tmp_path, SELECTING)
    result = run("--device", "ref", "--compile", str(path), cwd=tmp_path)
    assert result.returncode == 0
    assert "this script compiled nothing" in result.stderr


def test_a_script_on_the_cpu_gets_a_short_report(tmp_path):
    path = script(tmp_path, SELECTING)
    result = run("--device", "cpu", "--report", str(tmp_path / "out"), str(path), cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == "cpu 30.0\n"
    assert "no accelkit backend ran this script" in result.stderr
    assert json.loads((tmp_path / "out" / "report.json").read_text())["ops"] is None


HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>&amp;\"'"


def test_hostile_strings_stay_text_in_the_html(tmp_path):
    path = script(tmp_path, f"""
        import accelkit, torch
        dev = accelkit.select_device()
        torch.ones(2).to(dev).sum().item()
        raise ValueError({HOSTILE!r})
    """)
    out = tmp_path / "out"
    result = run("--device", "neuron", "--report", str(out), str(path), HOSTILE, cwd=tmp_path)
    assert result.returncode == 1
    page = (out / "report.html").read_text()
    assert "<img" not in page and "<script" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def _run_under_torchrun(tmp_path: Path, path: Path, device: str, out: Path) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node 2 -m accelkit run --device DEVICE --report OUT PATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELKIT_", "ACCELERATE_"))}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "accelkit", "run", "--device", device, "--report", str(out), str(path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def test_under_torchrun_each_rank_writes_its_report(tmp_path):
    path = script(tmp_path, """
        import accelkit, torch, torch.distributed as dist
        dev = accelkit.select_device()
        dist.init_process_group(dev.type)   # the device's own process group
        t = torch.tensor([float(dist.get_rank() + 1)]).to(dev)
        dist.all_reduce(t)
        with open(f"rank{dist.get_rank()}.txt", "w") as f:  # the ranks' stdout interleave
            f.write(f"{(t * 1).item()}")
        dist.destroy_process_group()
    """)
    out = tmp_path / "out"
    result = _run_under_torchrun(tmp_path, path, "ref", out)
    assert result.returncode == 0, result.stderr
    assert [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)] == ["3.0", "3.0"]
    for rank in (0, 1):
        report = json.loads((out / f"report-rank{rank}.json").read_text())
        assert (report["rank"], report["world_size"]) == (rank, 2)
        assert report["ops"]["executions"] > 0
        all_reduce = report["collectives"]["by_kind"]["all_reduce"]
        assert all_reduce == report["stats"]["distributed"]["collectives"]["all_reduce"]
        assert (all_reduce["calls"], all_reduce["bytes"], all_reduce["world"]) == (1, 4, 2)
    assert result.stderr.count("accelkit run:") == 1  # the text report is rank 0's


def test_a_distributed_run_on_tpu_reports_compute_and_communication_side_by_side(tmp_path):
    path = script(tmp_path, """
        import accelkit, torch, torch.distributed as dist
        dev = accelkit.select_device()
        dist.init_process_group(dev.type)
        x = torch.ones(256, 256, device=dev)
        y = x @ x
        dist.all_reduce(y)
        dist.all_gather_into_tensor(torch.empty(512, 256, device=dev), y)
        dist.destroy_process_group()
    """)
    out = tmp_path / "out"
    result = _run_under_torchrun(tmp_path, path, "tpu", out)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report-rank0.json").read_text())
    coll = report["collectives"]
    assert set(coll["by_kind"]) == {"all_reduce", "all_gather"}
    for row in coll["by_kind"].values():
        assert row["world"] == 2 and row["estimated_seconds"] > 0
    assert coll["estimated_seconds"] == pytest.approx(sum(r["estimated_seconds"] for r in coll["by_kind"].values()))
    split = [line for line in result.stderr.splitlines() if line.strip().startswith("split")]
    assert len(split) == 1 and "compute" in split[0] and "communication" in split[0], result.stderr[-2000:]
    assert "over 2 ranks" in result.stderr


def test_processes_the_script_starts_report_their_device_work_after_it(tmp_path):
    # As vLLM's API server does: the device work runs in a process the script spawns.
    path = script(tmp_path, """
        import multiprocessing, torch, accelkit

        def device_work(n):
            dev = accelkit.select_device()
            x = torch.ones(n, n, device=dev)
            print("child", (x @ x).sum().item())

        def host_work():
            print("host", sum(range(10)))

        if __name__ == "__main__":
            spawn = multiprocessing.get_context("spawn")
            for target, args in ((device_work, (8,)), (host_work, ())):
                child = spawn.Process(target=target, args=args, name=target.__name__)
                child.start(); child.join()
                assert child.exitcode == 0
    """)
    out = tmp_path / "out"
    result = run("--device", "ref", "--report", str(out), str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "child 512.0" in result.stdout and "host 45" in result.stdout
    reports = sorted(out.glob("report-pid*.json"))
    assert len(reports) == 1  # the host-only child ran no device ops: no report
    child = json.loads(reports[0].read_text())
    assert child["command"] == ["device_work"] and child["exit"]["code"] is None
    assert child["ops"]["executions"] >= 2 and child["ops"]["totals"]["fallback"] == 0
    assert child["stats"]["totals"]["native"] == child["ops"]["totals"]["native"]
    launcher = json.loads((out / "report.json").read_text())
    assert launcher["ops"]["executions"] == 0  # the launcher's own process ran nothing
    text = result.stderr.split("accelkit run:")
    assert len(text) == 3 and f"process {child['pid']} of the run, device_work on ref:0" in text[2]
    assert ": ended," in text[2] and "ops " in text[2]


def test_a_process_killed_after_destroying_its_process_group_still_reports(tmp_path):
    # How Ray Train ends its workers: their process group destroyed, then the process killed, so
    # no exit handler runs. The child that is killed without the destroy is the control: no report.
    path = script(tmp_path, """
        import multiprocessing, os, torch, accelkit

        def train_then_killed(destroy):
            import torch.distributed as dist
            dev = accelkit.select_device()
            dist.init_process_group(dev.type, store=dist.HashStore(), rank=0, world_size=1)
            t = torch.ones(4, device=dev)
            dist.all_reduce(t)
            print(multiprocessing.current_process().name, t.sum().item(), flush=True)
            if destroy:
                dist.destroy_process_group()
            os._exit(0)

        if __name__ == "__main__":
            spawn = multiprocessing.get_context("spawn")
            for name, destroy in (("destroyed", True), ("killed_first", False)):
                child = spawn.Process(target=train_then_killed, args=(destroy,), name=name)
                child.start(); child.join()
                assert child.exitcode == 0
    """)
    out = tmp_path / "out"
    result = run("--device", "ref", "--report", str(out), str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["destroyed 4.0", "killed_first 4.0"]
    reports = [json.loads(p.read_text()) for p in out.glob("report-pid*.json")]
    assert [r["command"] for r in reports] == [["destroyed"]], result.stderr
    assert reports[0]["collectives"]["by_kind"]["all_reduce"]["calls"] == 1
    assert reports[0]["ops"]["executions"] > 0


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="needs POSIX signals")
def test_sigterm_from_outside_ends_the_run_as_it_would_python(tmp_path):
    path = script(tmp_path, """
        import time
        print("ready", flush=True)
        time.sleep(60)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELKIT_", "ACCELERATE_"))}
    process = subprocess.Popen([sys.executable, "-m", "accelkit", "run", "--device", "ref", str(path)],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == -signal.SIGTERM
    assert "killed by SIGTERM" in stderr


def test_an_unmodified_hugging_face_trainer_script_trains_on_the_device(tmp_path):
    path = script(tmp_path, """
        import json, tempfile, torch
        from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

        torch.manual_seed(0)
        config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32, num_labels=2)
        data = [{"input_ids": torch.randint(0, 64, (12,)), "labels": torch.tensor(i % 2)} for i in range(8)]
        seen = []

        class Watched(Trainer):
            def training_step(self, model, inputs, *args, **kwargs):
                seen.append(sorted({t.device.type for t in inputs.values()}))
                return super().training_step(model, inputs, *args, **kwargs)

        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(output_dir=out, max_steps=2, per_device_train_batch_size=4, report_to=[],
                                     save_strategy="no", disable_tqdm=True)
            trainer = Watched(model=BertForSequenceClassification(config), args=args, train_dataset=data)
            trainer.train()
        print(json.dumps({"device": str(next(trainer.model.parameters()).device), "batches": seen}))
    """)
    out = tmp_path / "out"
    result = run("--device", "ref", "--report", str(out), str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    trained = json.loads(result.stdout.strip().splitlines()[-1])
    assert trained == {"device": "ref:0", "batches": [["ref"], ["ref"]]}
    report = json.loads((out / "report.json").read_text())
    ops = report["stats"]["ops"]
    assert sum(ops.get(op, {}).get("native", 0) for op in ("aten.mm.default", "aten.addmm.default")) > 0
