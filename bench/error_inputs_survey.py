"""Does a device refuse bad input as CPU does? PyTorch's OpInfo ``error_inputs``, run on a device.

    python bench/error_inputs_survey.py --device tpu                 # one backend
    python bench/error_inputs_survey.py --device ref --device neuron # side by side
    python bench/error_inputs_survey.py --device tpu --ops index     # OpInfos whose name contains "index"
    python bench/error_inputs_survey.py --device tpu --json out.json # also every error input's record

Many OpInfos of ``op_db`` carry *error inputs*: samples the op must refuse with a given exception
type and a message matching a regex (PyTorch's ``TestCommon.test_errors`` runs them on each
device; sparse ones, ``error_inputs_sparse``, are not run here). Each error input is generated on
the CPU and first run there: one that CPU itself does not refuse as declared is skipped ("cpu
disagrees"). Its CPU tensors are copied to the device — one copy per storage, every tensor the
same view of it, so strides, overlaps (an expanded input), aliasing between arguments (``out=``
the input) and ``requires_grad`` are the sample's; a ``device=`` argument naming the CPU names
the device — and the op runs there. The device is synchronised inside the check (outputs read
back, then the device module's ``synchronize()``): a backend may raise a device-side check's
error at the next synchronisation. Outcomes, worst first:

- ``crash``: the worker process died, or went silent past ``--stall-seconds``;
- ``silent``: no error at all, the op returned a result (the worst kind of defect: wrong numbers);
- ``wrong type``: an exception that is not an instance of the declared type;
- ``other message``: the declared type, a message the regex does not match;
- ``match``: the declared type and a matching message.

Two flags are counted beside the outcome: ``wrote`` (the op raised, but left a device input
changed where CPU left it as it was: a refused in-place op must write nothing) and ``type
differs from CPU`` (the error matches as declared but is not an instance of the type CPU raised,
e.g. a ``ValueError`` where CPU raises ``RuntimeError`` and the OpInfo declares ``Exception``).
Error inputs whose tensors the device cannot hold (a dtype it refuses) are counted as
``unplaceable``, not run. After ``--op-seconds`` an OpInfo's remaining error inputs are counted
as ``timed out``.

OpInfos run in worker subprocesses (fresh ones per chunk), so a crash costs the rest of one
OpInfo's error inputs. float64 is accepted in the workers unless the environment says otherwise
(``ACCELKIT_TPU_FLOAT64=emulate``, ``ACCELKIT_NEURON_FLOAT64=downcast``), as in the test suites.
The conformance ops suite holds every backend to the same rule (``test_errors`` in
``conformance/suites/test_ops.py``); this tool is the full, per-input measurement.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Outcomes, worst first (the order of the report's rows).
OUTCOMES = ("crash", "silent", "wrong type", "other message", "match", "unplaceable", "timed out",
            "cpu disagrees")
#: Outcomes that count as the device not behaving as CPU does.
DEFECTS = ("crash", "silent", "wrong type", "other message")
WORKER_ENV = {"ACCELKIT_TPU_FLOAT64": "emulate", "ACCELKIT_NEURON_FLOAT64": "downcast"}


# ---------------------------------------------------------------------------------------------
# Worker: runs the error inputs of a list of OpInfos (by index in op_db), one JSON line each
# ---------------------------------------------------------------------------------------------


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else "")[:300]


def _worker(device_name: str, indices: list[int], out_path: str, op_seconds: float) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    import accelkit
    from accelkit_conformance.compare import copy_sample, tensors_in

    dev = accelkit.select_device(device_name)
    module = getattr(torch, dev.type, None)

    def synchronize() -> None:
        if dev.type != "cpu" and module is not None and hasattr(module, "synchronize"):
            module.synchronize()

    def inputs_of(sample) -> list:
        return list(tensors_in((sample.input, sample.args, sample.kwargs)))

    def same(a, b) -> bool:
        if a.shape != b.shape:
            return False
        a, b = a.detach().reshape(-1).cpu(), b.detach().reshape(-1).cpu()  # flat: also past 64 dims
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.is_floating_point or a.dtype.is_complex:
            return bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
        return bool(torch.equal(a, b))

    def run(op, sample):
        """The error the call raises, synchronising inside; None if it returns a result."""
        try:
            out = op(sample.input, *sample.args, **sample.kwargs)
            for t in tensors_in(out if isinstance(out, (list, tuple, dict)) else (out,)):
                t.detach().cpu()  # a host read: a pending device-side error surfaces here
            synchronize()
        except Exception as error:  # noqa: BLE001 - every outcome is recorded
            return error
        return None

    with open(out_path, "a") as out:
        for index in indices:
            op = op_db[index]
            start = time.monotonic()
            try:
                error_inputs = list(op.error_inputs("cpu"))
            except Exception as error:  # noqa: BLE001 - a broken generator is recorded
                out.write(json.dumps({"index": index, "op": op.full_name, "input": -1, "outcome": "crash",
                                      "got": f"error input generation: {type(error).__name__}: {_first_line(error)}"})
                          + "\n")
                out.flush()
                continue
            # Error inputs share tensors, and a CPU run may change them (an out= resized):
            # each runs from its own copy, taken before any of them runs.
            pristine = []
            for error_input in error_inputs:
                try:
                    pristine.append(copy_sample(error_input.sample_input))
                except Exception as error:  # noqa: BLE001 - recorded as unplaceable below
                    pristine.append(error)
            for k, (error_input, sample) in enumerate(zip(error_inputs, pristine)):
                record = {"index": index, "op": op.full_name, "input": k,
                          "expected": f"{error_input.error_type.__name__}: {error_input.error_regex}"[:300],
                          "summary": " ".join(error_input.sample_input.summary().split())[:200],
                          "wrote": False, "cpu_type": None, "got": None}
                if time.monotonic() - start > op_seconds:
                    record["outcome"] = "timed out"
                    out.write(json.dumps(record) + "\n")
                    continue
                try:
                    if isinstance(sample, Exception):
                        raise sample
                    before, cpu_sample = inputs_of(copy_sample(sample)), copy_sample(sample)
                    dev_sample = copy_sample(sample, dev)
                except Exception as error:  # noqa: BLE001 - e.g. a dtype the device refuses
                    record["outcome"] = "unplaceable"
                    record["got"] = f"{type(error).__name__}: {_first_line(error)}"
                    out.write(json.dumps(record) + "\n")
                    continue
                cpu_error = run(op, cpu_sample)
                if not (isinstance(cpu_error, error_input.error_type)
                        and re.search(error_input.error_regex, str(cpu_error))):
                    record["outcome"] = "cpu disagrees"
                    record["got"] = "no error" if cpu_error is None else f"{type(cpu_error).__name__}: {_first_line(cpu_error)}"
                    out.write(json.dumps(record) + "\n")
                    continue
                record["cpu_type"] = type(cpu_error).__name__
                out.write(json.dumps({**record, "outcome": "crash", "got": "(running)"}) + "\n")
                out.flush()  # if the worker dies now, this line names the error input
                error = run(op, dev_sample)
                if error is None:
                    record["outcome"], record["got"] = "silent", "no error"
                else:
                    record["got"] = f"{type(error).__name__}: {_first_line(error)}"
                    if not isinstance(error, error_input.error_type):
                        record["outcome"] = "wrong type"
                    elif not re.search(error_input.error_regex, str(error)):
                        record["outcome"] = "other message"
                    else:
                        record["outcome"] = "match"
                    record["type_differs"] = not isinstance(error, type(cpu_error))
                    try:
                        cpu_after, dev_after = inputs_of(cpu_sample), inputs_of(dev_sample)
                        record["wrote"] = any(same(c, b) and not same(d, b)
                                              for c, d, b in zip(cpu_after, dev_after, before)
                                              if b.device.type == "cpu" and b.layout == torch.strided)
                    except Exception as error:  # noqa: BLE001 - reading back failed: say so
                        record["wrote"] = True
                        record["got"] += f" (then reading the inputs back: {type(error).__name__}: {_first_line(error)})"
                record["seconds"] = round(time.monotonic() - start, 3)
                out.write(json.dumps(record) + "\n")
                out.flush()
            out.write(json.dumps({"index": index, "done": True}) + "\n")  # also for no error inputs
            out.flush()


# ---------------------------------------------------------------------------------------------
# Driver: chunks of OpInfos to fresh workers; a crashed worker's error input is recorded
# ---------------------------------------------------------------------------------------------


def _read_records(path: str) -> tuple[list[dict], set[int]]:
    """The worker's records, the last line per error input winning (a provisional ``crash``
    line is written before each device call and replaced by its outcome), and the OpInfos it
    finished."""
    by_key: dict[tuple, dict] = {}
    done: set[int] = set()
    with open(path) as lines:
        for line in lines:
            if line.strip():
                record = json.loads(line)
                if record.get("done"):
                    done.add(record["index"])
                else:
                    by_key[(record["index"], record["input"])] = record
    return list(by_key.values()), done


def run_device(device: str, indices: list[int], args: argparse.Namespace) -> list[dict]:
    records: list[dict] = []
    remaining = list(indices)
    env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"}
    for key, value in WORKER_ENV.items():
        env.setdefault(key, value)
    while remaining:
        chunk, rest = remaining[:args.chunk], remaining[args.chunk:]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as handle:
            path = handle.name
        command = [sys.executable, __file__, "--device", device, "--worker", ",".join(map(str, chunk)),
                   "--out", path, "--op-seconds", str(args.op_seconds)]
        worker = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        size, last_change = 0, time.monotonic()
        while worker.poll() is None:
            time.sleep(0.5)
            now = os.path.getsize(path)
            if now != size:
                size, last_change = now, time.monotonic()
            elif time.monotonic() - last_change > args.stall_seconds:
                worker.kill()
                break
        worker.wait()
        stderr = worker.stderr.read() if worker.stderr else ""
        finished, done = _read_records(path)
        os.unlink(path)
        done |= {r["index"] for r in finished}  # an OpInfo a dead worker was in is not retried
        tail = stderr.strip().splitlines()[-1][:200] if stderr.strip() else f"silent for {args.stall_seconds:.0f} s"
        crashed = [r for r in finished if r["outcome"] == "crash" and r.get("got") == "(running)"]
        for record in crashed:
            record["got"] = f"worker died: {tail}"
        records.extend(finished)
        remaining = [i for i in chunk if i not in done] + rest
        if worker.returncode != 0 and not crashed and remaining and remaining[0] in chunk:
            index = remaining.pop(0)  # died outside a device call: count the OpInfo once
            records.append({"index": index, "op": args.names[index], "input": -1, "outcome": "crash",
                            "got": f"worker died outside a device call: {tail}"})
        finished_count = len(indices) - len(remaining)
        print(f"  {device}: {finished_count}/{len(indices)} OpInfos", flush=True)
    return records


def summary(by_device: dict[str, list[dict]], seconds: dict[str, float]) -> str:
    devices = list(by_device)
    lines = ["| outcome | " + " | ".join(devices) + " |", "|---|" + "---:|" * len(devices)]
    counts = {d: collections.Counter(r["outcome"] for r in rs) for d, rs in by_device.items()}
    for outcome in OUTCOMES:
        lines.append(f"| {outcome} | " + " | ".join(str(counts[d][outcome]) for d in devices) + " |")
    flags = {
        "wrote (refused, but changed an input)": lambda r: r.get("wrote"),
        "type differs from CPU's": lambda r: r.get("type_differs") and r["outcome"] == "match",
    }
    for label, test in flags.items():
        lines.append(f"| {label} | " + " | ".join(str(sum(1 for r in by_device[d] if test(r))) for d in devices) + " |")
    ran = {d: sum(counts[d][o] for o in DEFECTS + ("match",)) for d in devices}
    lines.append("| **matching / run** | " + " | ".join(
        f"{counts[d]['match']}/{ran[d]} = {counts[d]['match'] / max(ran[d], 1):.1%}" for d in devices) + " |")
    lines.append("| seconds | " + " | ".join(f"{seconds[d]:.0f}" for d in devices) + " |")
    return "\n".join(lines)


def details(device: str, records: list[dict], limit: int) -> str:
    lines = []
    for outcome in DEFECTS:
        found = sorted((r for r in records if r["outcome"] == outcome), key=lambda r: (r["op"], r["input"]))
        if not found:
            continue
        lines.append(f"\n{device}: {outcome} ({len(found)})")
        for r in found[:limit]:
            lines.append(f"  {r['op']}#{r['input']}: expected {r.get('expected', '?')[:90]}")
            lines.append(f"      got {str(r.get('got'))[:150]}   [{r.get('summary', '')[:100]}]")
        if len(found) > limit:
            lines.append(f"  ... {len(found) - limit} more (--json has them all)")
    wrote = [r for r in records if r.get("wrote")]
    if wrote:
        lines.append(f"\n{device}: wrote although refused ({len(wrote)})")
        lines.extend(f"  {r['op']}#{r['input']}: {str(r.get('got'))[:120]}" for r in wrote[:limit])
    differs = [r for r in records if r.get("type_differs") and r["outcome"] == "match"]
    if differs:
        lines.append(f"\n{device}: matching, but not CPU's exception type ({len(differs)})")
        lines.extend(f"  {r['op']}#{r['input']}: CPU {r['cpu_type']}, got {str(r.get('got'))[:110]}"
                     for r in differs[:limit])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", action="append", help="an accelkit backend (repeat for several); default ref")
    parser.add_argument("--ops", help="only OpInfos whose name contains this text")
    parser.add_argument("--chunk", type=int, default=40, help="OpInfos per worker process")
    parser.add_argument("--op-seconds", type=float, default=20.0, help="time limit per OpInfo")
    parser.add_argument("--stall-seconds", type=float, default=120.0, help="kill a worker silent this long")
    parser.add_argument("--limit", type=int, default=40, help="error inputs listed per outcome")
    parser.add_argument("--json", help="write every error input's record here (by device)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    devices = args.device or ["ref"]

    if args.worker is not None:
        _worker(devices[0], [int(i) for i in args.worker.split(",")], args.out, args.op_seconds)
        return

    import warnings

    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    chosen = [i for i, op in enumerate(op_db)
              if op.error_inputs_func is not None and (not args.ops or args.ops in op.full_name)]
    args.names = {i: op_db[i].full_name for i in chosen}
    print(f"{len(chosen)} OpInfos with error inputs, on {', '.join(devices)}", flush=True)
    by_device, seconds = {}, {}
    for device in devices:
        started = time.monotonic()
        by_device[device] = run_device(device, chosen, args)
        seconds[device] = time.monotonic() - started
    print("\nerror inputs of PyTorch's OpInfos, device against the declared error (CPU agreeing)\n")
    print(summary(by_device, seconds))
    for device, records in by_device.items():
        print(details(device, records, args.limit))
    if args.json:
        Path(args.json).write_text(json.dumps(by_device, indent=1))


if __name__ == "__main__":
    main()
