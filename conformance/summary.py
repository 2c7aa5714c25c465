"""Reducing one loaded run to the figures a conformance report shows.

Pure standard library: a report can be rendered on a machine without torch.

Definitions used everywhere in the report (and pinned by the tests):

* **ran** — records that are not skips (``skip-declared``/``skip-other``); xfail and xpass ran.
* **pass rate** — ``pass`` records / ran. An ``xpass`` is not counted as a pass: it is listed
  as *fixed* until its expectation entry is removed, after which it becomes a ``pass``.
* **native coverage** (the headline) — ``pass`` records whose ``paths.fallback == 0`` / ran.
  Decompositions count as native (they run on the device); a pass without a measurement
  (``paths`` null) is not counted as native.
* **bad** — ``fail``, ``error``, ``crash``, ``timeout``: the outcomes that count against a backend.
* **verdict** — ``FAIL`` if any record is bad or an xpass (a strict xfail that passed),
  else ``INCOMPLETE`` if the run did not reach its end, else ``EMPTY`` if nothing ran,
  else ``PASS``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .capabilities import rows as capability_rows
from .remedies import remedy
from .schema import (
    BAD_OUTCOMES,
    CRASH,
    ERROR,
    FAIL,
    OUTCOMES,
    PASS,
    SKIP_OUTCOMES,
    SUITES,
    TIMEOUT,
    XPASS,
)

#: Order in which problems are listed: worst first.
PROBLEM_ORDER = (CRASH, TIMEOUT, ERROR, FAIL)
#: How many op families the "worst families" table keeps per suite and backend.
WORST_FAMILIES = 8
#: How many distinct skip reasons are kept per suite and backend (the rest are summed).
SKIP_REASONS = 12

# -- op families -----------------------------------------------------------------------------

#: Namespaces whose ops form one family each (``linalg.svd`` -> ``linalg``).
_NAMESPACES = ("signal.windows", "linalg", "fft", "special", "masked", "sparse", "_refs", "_prims")
#: Word -> family for names whose leading word says little (``max_pool2d`` -> ``pool``).
_KEYWORDS = {
    "pool": "pool", "unpool": "pool", "norm": "norm", "conv": "conv", "loss": "loss",
    "entropy": "loss", "dropout": "dropout", "attention": "attention", "interpolate": "interpolate",
    "upsample": "interpolate", "shuffle": "shuffle", "softmax": "softmax",
    "pad": "pad", "rnn": "rnn", "gru": "rnn", "lstm": "rnn",
}
#: Leading words that say nothing about the op (``as_strided`` -> ``strided``).
_STOPWORDS = {"as", "is", "to"}
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+[a-z]*")
_DIMS = re.compile(r"\d+d$")


@functools.lru_cache(maxsize=8192)
def op_family(op: str | None) -> str:
    """The family an op, module or check belongs to, for the "worst families" table.

    The rule, applied in order:

    1. no op -> ``"(none)"``; a leading ``torch.`` or ``aten.`` is dropped;
    2. a namespaced op (``linalg.``, ``fft.``, ``special.``, ``masked.``, ``sparse.``,
       ``signal.windows.``, ``_refs.``, ``_prims.``) belongs to its namespace: ``linalg.svd`` ->
       ``linalg``;
    3. otherwise ``nn.functional.`` / ``nn.`` are dropped and the first dotted component is
       the name (``max.reduction_with_dim`` -> ``max``; a contract check ``aliasing.views`` ->
       ``aliasing``); it is split into lowercase words at ``_`` and CamelCase boundaries, and
       a dimension suffix (``2d``) is dropped, a one-letter word joins the next (``PReLU`` ->
       ``prelu``) and a leading ``as``/``is``/``to`` is dropped (``as_strided`` -> ``strided``);
    4. if a word is one of a few well-known kinds (pool, norm, conv, loss/entropy, dropout,
       attention, interpolate/upsample, shuffle, softmax, pad, rnn/gru/lstm), that kind is the family:
       ``nn.functional.max_pool2d`` and ``torch.nn.AdaptiveAvgPool1d`` -> ``pool``,
       ``nn.CrossEntropyLoss`` -> ``loss``;
    5. else the first word: ``index_put`` -> ``index``, ``bitwise_and`` -> ``bitwise``,
       ``addmm`` -> ``addmm``.
    """
    if not op:
        return "(none)"
    name = op
    for prefix in ("torch.", "aten."):
        name = name.removeprefix(prefix)
    for ns in _NAMESPACES:
        if name.startswith(ns + "."):
            return ns
    for prefix in ("nn.functional.", "nn."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    head = name.split(".", 1)[0] or name
    words: list[str] = []
    for part in head.replace("ReLU", "Relu").replace("SiLU", "Silu").strip("_").split("_"):
        for word in _CAMEL.findall(part) or [part]:
            word = _DIMS.sub("", word.lower())
            if words and len(words[-1]) == 1 and words[-1].isalpha():
                words[-1] += word  # PReLU -> prelu, not p
            elif word:
                words.append(word)
    while len(words) > 1 and words[0] in _STOPWORDS:
        words.pop(0)
    if not words:
        return head
    for word in words:
        if word in _KEYWORDS:
            return _KEYWORDS[word]
    return words[0]


# -- summarizing -----------------------------------------------------------------------------


def _is_native_pass(record: Mapping[str, Any]) -> bool:
    paths = record.get("paths")
    return record["outcome"] == PASS and paths is not None and paths.get("fallback", 0) == 0


def rate(part: int, whole: int) -> float | None:
    """``part / whole``, or None when ``whole`` is 0 (nothing ran: no rate, not 0%)."""
    return part / whole if whole else None


def one_line(text: str | None, limit: int = 160) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters (``…`` marks a cut)."""
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _suite_summary(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    counts = dict.fromkeys(OUTCOMES, 0)
    for r in records:
        counts[r["outcome"]] += 1
    ran = len(records) - sum(counts[o] for o in SKIP_OUTCOMES)
    native = sum(1 for r in records if _is_native_pass(r))
    return {
        "total": len(records),
        "counts": counts,
        "ran": ran,
        "passed": counts[PASS],
        "native": native,
        "bad": sum(counts[o] for o in BAD_OUTCOMES),
        "pass_rate": rate(counts[PASS], ran),
        "native_rate": rate(native, ran),
        "skips": _skips(records),
        "families": _worst_families(records),
        "dynamic": _dynamic_rows(records),
        "float_reference": _float_reference_rows(records),
    }


def _skips(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    grouped = Counter((r["outcome"], one_line(r["reason"]) or "(no reason given)")
                      for r in records if r["outcome"] in SKIP_OUTCOMES)
    ordered = sorted(grouped.items(), key=lambda kv: (-kv[1], kv[0]))
    rows = [{"outcome": o, "reason": reason, "count": n} for (o, reason), n in ordered[:SKIP_REASONS]]
    rest = ordered[SKIP_REASONS:]
    if rest:
        rows.append({"outcome": "", "reason": f"({len(rest)} other reasons)", "count": sum(n for _, n in rest)})
    return rows


def _worst_families(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    fams: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["outcome"] in SKIP_OUTCOMES:
            continue
        f = fams.setdefault(op_family(r["op"]), {"ran": 0, "passed": 0, "native": 0, "bad": 0,
                                                 "fallback": Counter()})
        f["ran"] += 1
        f["passed"] += r["outcome"] == PASS
        f["native"] += _is_native_pass(r)
        f["bad"] += r["outcome"] in BAD_OUTCOMES
        f["fallback"].update(r.get("fallback_ops") or ())
    rows = [
        {
            "family": name, "ran": f["ran"], "passed": f["passed"], "native": f["native"], "bad": f["bad"],
            "pass_rate": f["passed"] / f["ran"], "native_rate": f["native"] / f["ran"],
            "fallback_ops": [op for op, _ in sorted(f["fallback"].items(), key=lambda kv: (-kv[1], kv[0]))[:3]],
        }
        for name, f in fams.items()
        if f["native"] < f["ran"]
    ]
    rows.sort(key=lambda row: (row["pass_rate"], row["native_rate"], -row["ran"], row["family"]))
    return rows[:WORST_FAMILIES]


def _float_reference_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The passes that needed the float32 reference somewhere, most comparisons first."""
    rows = [{"id": r["id"], "op": r["op"], "dtype": r["dtype"], "variant": r["variant"],
             "comparisons": r["float_reference"]}
            for r in records if r["outcome"] == PASS and r.get("float_reference")]
    return sorted(rows, key=lambda row: (-row["comparisons"], row["id"]))


def _dynamic_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        if r["suite"] != "dynamic":
            continue
        dyn = r.get("dynamic") or {}
        recompiles, programs = dyn.get("recompiles"), dyn.get("programs")
        case, _, mode = (r["op"] or "").rpartition(".")
        rows.append({
            "id": r["id"], "op": r["op"], "case": case or r["op"], "mode": mode, "dtype": r["dtype"],
            "outcome": r["outcome"], "shapes": dyn.get("shapes"), "recompiles": recompiles,
            "total_recompiles": sum(recompiles) if recompiles is not None else None,
            "programs": programs, "total_programs": sum(programs) if programs is not None else None,
            "correct": dyn.get("correct"), "compiles": r.get("compiles"),
        })
    return rows


def _wall_seconds(env: Mapping[str, Any]) -> float | None:
    try:
        start = _dt.datetime.fromisoformat(str(env["started"]))
        end = _dt.datetime.fromisoformat(str(env["finished"]))
        return (end - start).total_seconds()
    except (KeyError, ValueError, TypeError):  # no end time, or times that cannot be compared
        return None


def _provenance(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    env = run["environment"]

    def show(value: Any) -> str:
        return "-" if value is None or value == "" else str(value)

    torch = show(env.get("torch"))
    if env.get("torch_git"):
        torch += f" (git {str(env['torch_git'])[:10]})"
    mode = {True: "simulated", False: "real"}.get(env.get("simulated"), "unknown")
    wall = _wall_seconds(env)
    rows = [
        ("accelkit", show(env.get("accelkit"))),
        ("torch", torch),
        ("jax", show(env.get("jax"))),
        ("python", show(env.get("python"))),
        ("platform", show(env.get("platform"))),
        ("backend", show(env.get("backend"))),
        ("target", show(env.get("target"))),
        ("mode", mode),
        ("fallback policy", show(env.get("fallback_policy"))),
        ("profile", show(env.get("profile"))),
        ("expectations", show(env.get("expectations"))),
        ("dtypes", ", ".join(env.get("dtypes") or ()) or "-"),
        ("jobs / timeout", f"{show(env.get('jobs'))} / {show(env.get('timeout'))} s"),
        ("compiling", {True: "fast (ACCELKIT_FAST_COMPILE=1: quick compiles over fast programs; same results)",
                       False: "as users compile"}.get(env.get("fast_compile"), "-")),
        ("started", show(env.get("started"))),
        ("finished", show(env.get("finished")) + (f" ({format_seconds(wall)})" if wall is not None else "")),
        ("run", "complete" if run.get("complete") else "INCOMPLETE (interrupted; results so far)"),
        ("source", show(run.get("source"))),
    ]
    return rows


def format_seconds(seconds: float) -> str:
    """``12.3s``, ``4m 05s`` or ``1h 02m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    return f"{minutes // 60}h {minutes % 60:02d}m"


def summarize(run: Mapping[str, Any]) -> dict[str, Any]:
    """Reduce one loaded run (see :func:`~accelkit_conformance.report_load.load_results`) to the
    figures a report shows.

    Returns a dict with:

    * ``backend``, ``complete``, ``verdict`` (see the module docstring), ``wall_seconds``
      (finished - started, or None), ``provenance`` (ordered ``(label, text)`` pairs);
    * ``overall`` and ``suites`` (``{suite: ...}`` for the suites present, in
      :data:`~accelkit_conformance.schema.SUITES` order), each with ``total``, ``counts``
      (every outcome), ``ran``, ``passed``, ``native``, ``bad``, ``pass_rate`` and
      ``native_rate`` (None when nothing ran), ``skips`` (grouped by outcome and reason,
      most frequent first), ``families`` (the worst :data:`WORST_FAMILIES` families that are
      not fully native, by pass rate then native rate; see :func:`op_family`) and ``dynamic``
      (one row per dynamic-shape case: ``id``, ``op``, ``dtype``, ``outcome``, ``shapes``,
      ``recompiles``, ``total_recompiles``, ``correct``, ``compiles``; None where not measured)
      and ``float_reference`` (passes with comparisons that missed CPU's kernel and matched the
      float32 reference: ``id``, ``op``, ``dtype``, ``variant``, ``comparisons``);
    * ``problems``: bad records, worst outcome first, as ``{id, suite, outcome, reason}`` with a
      one-line reason;
    * ``fixed``: xpass records as ``{id, suite, expectation}`` — expectation entries to remove.
    """
    records = run["results"]
    by_suite = {s: [r for r in records if r["suite"] == s] for s in SUITES}
    overall = _suite_summary(records)
    if overall["bad"] or overall["counts"][XPASS]:
        verdict = "FAIL"
    elif not run.get("complete"):
        verdict = "INCOMPLETE"
    elif overall["ran"] == 0:
        verdict = "EMPTY"
    else:
        verdict = "PASS"
    rank = {o: i for i, o in enumerate(PROBLEM_ORDER)}
    problems = sorted((r for r in records if r["outcome"] in BAD_OUTCOMES),
                      key=lambda r: (rank[r["outcome"]], r["suite"], r["id"]))
    return {
        "backend": run["environment"]["backend"],
        "complete": bool(run.get("complete")),
        "verdict": verdict,
        "wall_seconds": _wall_seconds(run["environment"]),
        "provenance": _provenance(run),
        "overall": overall,
        "suites": {s: _suite_summary(rs) for s, rs in by_suite.items() if rs},
        "capabilities": capability_rows(run["environment"].get("capabilities") or {}, records),
        "problems": [{"id": r["id"], "suite": r["suite"], "outcome": r["outcome"], "reason": one_line(r["reason"]),
                      "what_to_do": remedy(r)} for r in problems],
        "fixed": [{"id": r["id"], "suite": r["suite"], "expectation": r.get("expectation")}
                  for r in records if r["outcome"] == XPASS],
    }
