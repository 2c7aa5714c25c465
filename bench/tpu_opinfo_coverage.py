"""How much of PyTorch's OpInfo database runs natively on tpu: a standalone measuring tool.

    python bench/tpu_opinfo_coverage.py                  # every OpInfo supporting float32
    python bench/tpu_opinfo_coverage.py --ops index      # OpInfos whose name contains "index"
    python bench/tpu_opinfo_coverage.py --json out.json  # also write every op's record

For each OpInfo (``op_db``) that supports float32 on CPU, its float32 sample inputs run forward
on CPU and on tpu copies, the tpu run under ``accelkit.fallback_policy("deny")``. An OpInfo

- **passes** when every sample matches CPU (PyTorch's device-vs-CPU rule of ``test_compare_cpu``:
  ``atol = rtol = 1e-3``, same dtypes) with no CPU fallback;
- **falls back** when a sample raises ``FallbackDeniedError`` — the aten op it names is recorded;
- **fails** otherwise (a mismatch or an error), with the first reason.

Samples CPU itself rejects are skipped. Sample tensors are copied to tpu (all of them, also
those an op wants on the CPU); samples without tensors (factories) get ``device="tpu"``.
Nondeterministic ops (``empty*``, ``rand*``, ``normal``, ``bernoulli``, dropout, ...) and
attention samples that draw dropout compare shapes and dtypes only. After ``--op-seconds``
(10 s) an op's remaining samples are skipped. OpInfos run in worker subprocesses, a fresh one per
chunk, so an op that crashes the interpreter is recorded as ``crash`` and the run continues
after it.

Not the conformance suite (``conformance/``): no gradients, no other dtypes, no error matching.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NONDETERMINISTIC = re.compile(
    r"empty|rand|normal|bernoulli|dropout|uniform|multinomial|exponential|geometric|cauchy|"
    r"log_normal|poisson|rrelu"
)
#: OpInfos some of whose samples draw dropout (from the device's stream, not the CPU's): those
#: samples compare shapes and dtypes only.
DRAWS_DROPOUT = {
    "nn.functional.scaled_dot_product_attention": lambda s: (s.kwargs.get("dropout_p") or 0) > 0,
    # multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight,
    # in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, ...): args[9] is dropout_p.
    "nn.functional.multi_head_attention_forward":
        lambda s: s.kwargs.get("training", True) and len(s.args) > 9 and s.args[9] > 0,
}
DENIED = re.compile(r"(\S+) has no kernel or decomposition on tpu")
TOLERANCE = {"atol": 1e-3, "rtol": 1e-3}


# ---------------------------------------------------------------------------------------------
# Worker: runs a list of OpInfos (by index in op_db) with tpu active, one JSON line per OpInfo
# ---------------------------------------------------------------------------------------------


def _worker(indices: list[int], out_path: str, op_seconds: float) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.utils._pytree import tree_flatten, tree_map

    import accelkit

    dev = accelkit.select_device("tpu")

    def to_device(value):
        if isinstance(value, torch.Tensor):
            return value.detach().to(dev)
        return value

    def device_kwargs(kwargs):
        return {k: dev if k == "device" else tree_map(to_device, v) for k, v in kwargs.items()}

    def clone(value):
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    def compare(actual, expected, shapes_only: bool) -> None:
        got, _ = tree_flatten(actual)
        want, _ = tree_flatten(expected)
        if len(got) != len(want):
            raise AssertionError(f"{len(got)} results, CPU gives {len(want)}")
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor):
                if not isinstance(g, torch.Tensor):
                    raise TypeError(f"result {type(g).__name__}, CPU gives a tensor")
                if g.device.type != "tpu":
                    raise AssertionError(f"result on {g.device}, not tpu")
                g = g.cpu()
                if shapes_only:
                    if g.shape != w.shape or g.dtype != w.dtype:
                        raise AssertionError(f"{tuple(g.shape)} {g.dtype} vs CPU {tuple(w.shape)} {w.dtype}")
                else:
                    torch.testing.assert_close(g, w, equal_nan=True, **TOLERANCE)
            elif isinstance(w, float) and isinstance(g, float):
                both_nan = math.isnan(g) and math.isnan(w)
                if not (both_nan or abs(g - w) <= TOLERANCE["atol"] + TOLERANCE["rtol"] * abs(w)):
                    raise AssertionError(f"{g} vs CPU {w}")
            elif g != w and not shapes_only:
                raise AssertionError(f"{g!r} vs CPU {w!r}")

    def denied_op(error: BaseException) -> str | None:
        while error is not None:
            found = DENIED.search(str(error))
            if found:
                return found.group(1)
            error = error.__cause__ or error.__context__
        return None

    with open(out_path, "a") as out:
        for index in indices:
            op = op_db[index]
            record = {"index": index, "name": op.name, "variant": op.variant_test_name,
                      "samples": 0, "skipped": 0, "fallbacks": [], "failure": None, "timed_out": False}
            shapes_only = bool(NONDETERMINISTIC.search(op.name))
            start = time.monotonic()
            try:
                samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
            except Exception as error:  # noqa: BLE001 - a broken sample generator is recorded
                samples = []
                record["failure"] = f"sample generation: {type(error).__name__}: {error}"[:300]
            for sample in samples:
                if time.monotonic() - start > op_seconds:
                    record["timed_out"] = True
                    break
                args = (sample.input, *sample.args)
                random_sample = shapes_only or DRAWS_DROPOUT.get(op.name, lambda _: False)(sample)
                try:
                    on_device = (tree_map(to_device, args), device_kwargs(sample.kwargs))
                    if not any(isinstance(v, torch.Tensor) for v in tree_flatten((args, sample.kwargs))[0]):
                        on_device[1].setdefault("device", dev)  # a factory: make it on tpu
                except Exception as error:  # noqa: BLE001 - e.g. a float64 input tpu refuses
                    on_device = error
                try:
                    torch.manual_seed(0)
                    expected = op(*tree_map(clone, args), **tree_map(clone, sample.kwargs))
                except Exception:  # noqa: BLE001 - CPU rejects this sample: not a tpu question
                    record["skipped"] += 1
                    continue
                record["samples"] += 1
                try:
                    torch.manual_seed(0)
                    if isinstance(on_device, Exception):
                        raise on_device
                    with accelkit.fallback_policy("deny"):
                        try:
                            actual = op(*on_device[0], **on_device[1])
                        except TypeError as error:  # not a factory after all (broadcast_shapes)
                            if "'device'" not in str(error) or "device" in sample.kwargs:
                                raise
                            actual = op(*on_device[0], **{k: v for k, v in on_device[1].items() if k != "device"})
                    compare(actual, expected, random_sample)
                except Exception as error:  # noqa: BLE001 - every outcome is recorded
                    name = denied_op(error)
                    if name is not None:
                        if name not in record["fallbacks"]:
                            record["fallbacks"].append(name)
                    elif record["failure"] is None:
                        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
                        record["failure"] = f"{type(error).__name__}: {first_line}"[:300]
            record["seconds"] = round(time.monotonic() - start, 2)
            out.write(json.dumps(record) + "\n")
            out.flush()


# ---------------------------------------------------------------------------------------------
# Driver: chunks of OpInfos to fresh workers; a crashed worker's op is recorded and skipped
# ---------------------------------------------------------------------------------------------


def _outcome(record: dict) -> str:
    if record.get("crash"):
        return "crash"
    if record["fallbacks"]:
        return "fallback"
    if record["failure"] is not None:
        return "fail"
    if record["samples"] == 0:
        return "no samples"
    return "pass"


def _run_chunk(indices: list[int], names: dict[int, str], op_seconds: float, stall_seconds: float,
               lock: threading.Lock, progress: list) -> list[dict]:
    records: list[dict] = []
    remaining = list(indices)
    while remaining:
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as handle:
            path = handle.name
        command = [sys.executable, __file__, "--worker", ",".join(map(str, remaining)), "--out", path,
                   "--op-seconds", str(op_seconds)]
        env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_FALLBACK"}
        worker = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        done_count, last_change = 0, time.monotonic()
        while worker.poll() is None:
            time.sleep(1)
            with open(path) as lines:
                count = sum(1 for _ in lines)
            if count != done_count:
                done_count, last_change = count, time.monotonic()
            elif time.monotonic() - last_change > stall_seconds:
                worker.kill()
                worker.wait()
                break
        stderr = worker.stderr.read() if worker.stderr else ""
        with open(path) as lines:
            finished = [json.loads(line) for line in lines if line.strip()]
        os.unlink(path)
        records.extend(finished)
        remaining = remaining[len(finished):]
        crashed = bool(remaining)
        if crashed:  # the worker died (or stalled) on remaining[0]
            tail = stderr.strip().splitlines()[-1:] if stderr.strip() else ["stalled"]
            index = remaining.pop(0)
            records.append({"index": index, "name": names[index], "variant": "", "samples": 0, "skipped": 0,
                            "fallbacks": [], "failure": f"crash: {tail[0][:200]}", "crash": True})
        with lock:
            progress[0] += len(finished) + crashed
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="only OpInfos whose name contains this text")
    parser.add_argument("--chunk", type=int, default=30, help="OpInfos per worker process")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes at a time")
    parser.add_argument("--op-seconds", type=float, default=10.0, help="time limit per OpInfo")
    parser.add_argument("--stall-seconds", type=float, default=180.0, help="kill a worker silent this long")
    parser.add_argument("--json", help="write every OpInfo's record here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker is not None:
        _worker([int(i) for i in args.worker.split(",")], args.out, args.op_seconds)
        return

    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    chosen = [i for i, op in enumerate(op_db)
              if torch.float32 in op.supported_dtypes("cpu") and (not args.ops or args.ops in op.name)]
    names = {i: op_db[i].name for i in chosen}
    chunks = [chosen[i:i + args.chunk] for i in range(0, len(chosen), args.chunk)]
    print(f"{len(chosen)} OpInfos supporting float32, in {len(chunks)} chunks, {args.jobs} at a time", flush=True)

    started, lock, progress = time.monotonic(), threading.Lock(), [0]
    records: list[dict] = []
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(_run_chunk, chunk, names, args.op_seconds, args.stall_seconds, lock, progress)
                   for chunk in chunks]
        for future in futures:
            records.extend(future.result())
            print(f"  {progress[0]}/{len(chosen)} OpInfos done, {time.monotonic() - started:.0f} s", flush=True)
    report(records, time.monotonic() - started)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


def report(records: list[dict], seconds: float) -> None:
    outcomes = collections.Counter(_outcome(r) for r in records)
    total = len(records)
    print(f"\ntpu OpInfo coverage (float32, forward), {total} OpInfos in {seconds:.0f} s")
    print(f"  passing natively: {outcomes['pass']}/{total} = {outcomes['pass'] / max(total, 1):.1%}")
    for outcome in ("pass", "fail", "fallback", "crash", "no samples"):
        print(f"  {outcome:10s} {outcomes[outcome]}")
    timed_out = sum(1 for r in records if r.get("timed_out"))
    print(f"  (samples cut short by the per-op time limit in {timed_out} OpInfos)")

    by_op = collections.Counter(name for r in records for name in r["fallbacks"])
    by_family = collections.Counter()
    for name, count in by_op.items():
        by_family[name.removeprefix("aten.").split(".")[0].rstrip("_")] += count
    print("\nmissing op families (OpInfos whose samples hit a fallback on them):")
    for family, count in by_family.most_common(30):
        overloads = sorted(n for n in by_op if n.removeprefix("aten.").split(".")[0].rstrip("_") == family)
        print(f"  {count:4d}  {family:32s} {', '.join(overloads)[:90]}")

    reasons = collections.Counter(
        re.sub(r"\d+(\.\d+)?", "N", r["failure"].split(":")[0] + ":" + ":".join(r["failure"].split(":")[1:2]))[:90]
        for r in records if _outcome(r) == "fail")
    print("\ncommonest failure reasons:")
    for reason, count in reasons.most_common(12):
        print(f"  {count:4d}  {reason}")


if __name__ == "__main__":
    main()
