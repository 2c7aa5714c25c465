"""Terminal and Markdown views of a conformance report (content and order: :mod:`.render_model`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .render_model import Block, build

_ANSI = {"PASS": "\033[32m", "FAIL": "\033[31m", "INCOMPLETE": "\033[33m", "EMPTY": "\033[33m"}
_BOLD, _RESET = "\033[1m", "\033[0m"


def _table_lines(block: Block, indent: str = "  ") -> list[str]:
    rows = [block.headers, *block.rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(block.headers))]
    out = []
    for n, row in enumerate(rows):
        cells = [c.rjust(w) if i in block.numeric and n else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append((indent + "  ".join(cells)).rstrip())
        if n == 0:
            out.append(indent + "  ".join("-" * w for w in widths))
    return out


def _rule(text: str, width: int) -> str:
    """``=== text ===`` centred in ``width``, with at least three ``=`` on each side (pytest style)."""
    pad = max(width - len(text) - 2, 6)
    return f"{'=' * (pad // 2)} {text} {'=' * (pad - pad // 2)}"


def render_terminal(runs: Sequence[Mapping[str, Any]], *, color: bool = False, width: int = 100) -> str:
    """The report as plain text for a terminal, one column per run in ``runs`` (loaded runs).

    With ``color`` the verdicts and closing lines are coloured with ANSI codes (green PASS,
    red FAIL, yellow INCOMPLETE/EMPTY); without it the text is plain. Ends with a newline.
    """

    def paint(verdict: str, text: str) -> str:
        return f"{_BOLD}{_ANSI.get(verdict, '')}{text}{_RESET}" if color else text

    out: list[str] = []
    indent = "  "  # tables under a level-3 heading are indented one step further
    for block in build(runs):
        if block.kind == "title":
            out.append(_rule(block.text, width))
        elif block.kind == "heading" and block.level == 2:
            out += ["", f"-- {block.text} ".ljust(width, "-")]
            indent = "  "
        elif block.kind == "heading":
            out += ["", f"  {block.text}"]
            indent = "    "
        elif block.kind == "table":
            out += _table_lines(block, indent)
        elif block.kind == "tables":
            for label, table in block.data["tables"]:
                out += [f"{indent}{label}", *_table_lines(table, indent + "  ")]
        elif block.kind == "verdicts":
            w = max(len(label) for label, _, _ in block.rows)
            vw = max(len(verdict) for _, verdict, _ in block.rows)
            out += [f"  {label.ljust(w)}  {paint(verdict, verdict.ljust(vw))}  {rest}" for label, verdict, rest in block.rows]
        elif block.kind == "text":
            out.append(f"  {block.text}")
        elif block.kind == "final":
            out += [paint(verdict, _rule(line, width)) for verdict, line in block.rows]
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ") or " "


def _md_table(block: Block) -> list[str]:
    return [
        "| " + " | ".join(_md_cell(h) for h in block.headers) + " |",
        "|" + "|".join("---:" if i in block.numeric else "---" for i in range(len(block.headers))) + "|",
        *("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows),
        "",
    ]


def render_markdown(runs: Sequence[Mapping[str, Any]]) -> str:
    """The report as GitHub-flavoured Markdown (tables), one column per run in ``runs``."""
    out: list[str] = []
    for block in build(runs):
        if block.kind == "title":
            out += [f"# {block.text}", ""]
        elif block.kind == "heading":
            out += [f"{'#' * block.level} {block.text}", ""]
        elif block.kind == "table":
            out += _md_table(block)
        elif block.kind == "tables":
            for label, table in block.data["tables"]:
                out += [f"**{label}**", "", *_md_table(table)]
        elif block.kind == "verdicts":
            out += [f"- `{label}` **{verdict}** {rest}" for label, verdict, rest in block.rows]
            out.append("")
        elif block.kind == "text":
            out += [block.text, ""]
        elif block.kind == "final":
            out += ["```", *(line for _, line in block.rows), "```", ""]
    return "\n".join(out).rstrip("\n") + "\n"
