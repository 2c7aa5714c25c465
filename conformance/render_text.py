"""Terminal and Markdown views of a conformance report (content and order: :mod:`.render_model`).

Text taken from results (test ids, reasons, op and backend names, the environment) is shown
literally: in Markdown it cannot become HTML, a link, emphasis or code, nor break a table or a
line; on a terminal it cannot send control sequences.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .render_model import Block, build
from .render_words import visible_controls

_ANSI = {"PASS": "\033[32m", "FAIL": "\033[31m", "INCOMPLETE": "\033[33m", "EMPTY": "\033[33m"}
_BOLD, _RESET = "\033[1m", "\033[0m"


def _table_lines(block: Block, indent: str = "  ") -> list[str]:
    rows = [[visible_controls(c) for c in row] for row in (block.headers, *block.rows)]
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
    return terminal_of_blocks(build(runs), color=color, width=width)


def terminal_of_blocks(blocks: Sequence[Block], *, color: bool = False, width: int = 100) -> str:
    """Any report's blocks (:class:`~.render_model.Block`) as terminal text; see :func:`render_terminal`."""

    def paint(verdict: str, text: str) -> str:
        return f"{_BOLD}{_ANSI.get(verdict, '')}{text}{_RESET}" if color else text

    out: list[str] = []
    indent = "  "  # tables under a level-3 heading are indented one step further
    for block in blocks:
        if block.kind == "title":
            out.append(_rule(visible_controls(block.text), width))
        elif block.kind == "heading" and block.level == 2:
            out += ["", f"-- {visible_controls(block.text)} ".ljust(width, "-")]
            indent = "  "
        elif block.kind == "heading":
            out += ["", f"  {visible_controls(block.text)}"]
            indent = "    "
        elif block.kind == "table":
            out += _table_lines(block, indent)
        elif block.kind == "tables":
            for label, table in block.data["tables"]:
                out += [f"{indent}{visible_controls(label)}", *_table_lines(table, indent + "  ")]
        elif block.kind == "verdicts":
            rows = [[visible_controls(c) for c in row] for row in block.rows]
            w = max(len(label) for label, _, _ in rows)
            vw = max(len(verdict) for _, verdict, _ in rows)
            out += [f"  {label.ljust(w)}  {paint(verdict, verdict.ljust(vw))}  {rest}" for label, verdict, rest in rows]
        elif block.kind == "text":
            out.append(f"  {visible_controls(block.text)}")
        elif block.kind == "final":
            out += [paint(verdict, _rule(visible_controls(line), width)) for verdict, line in block.rows]
    return "\n".join(out) + "\n"


#: Characters that Markdown (CommonMark, GitHub's tables, math and strikethrough) would act on
#: anywhere in a line, each shown literally when preceded by a backslash.
_MD_ESCAPES = str.maketrans({c: "\\" + c for c in "\\`*_[]|~$"})
_HTML_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_LINE_BREAK = re.compile(r"\r\n?|\n")


def _md_text(text: str) -> str:
    """``text`` shown literally in Markdown, also inside a table cell: HTML escaped to entities,
    Markdown punctuation backslash-escaped, line breaks as ``<br>``, other control characters as
    escapes (``\\x1b``)."""
    text = visible_controls(text, but_line_breaks=True)
    return _LINE_BREAK.sub("<br>", text.translate(_MD_ESCAPES).translate(_HTML_ESCAPES))


def _md_code(text: str) -> str:
    """``text`` as a one-line code span, whatever backticks it holds (not for table cells)."""
    text = visible_controls(text)
    fence = "`" * (max(map(len, re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_fence(lines: Sequence[str]) -> list[str]:
    """``lines`` as a fenced code block that none of them can close."""
    lines = [visible_controls(line) for line in lines]
    fence = "`" * max(3, max((len(run) + 1 for line in lines for run in re.findall(r"`+", line)), default=0))
    return [fence, *lines, fence]


def _md_cell(text: str) -> str:
    return _md_text(text) or " "


def _md_table(block: Block) -> list[str]:
    return [
        "| " + " | ".join(_md_cell(h) for h in block.headers) + " |",
        "|" + "|".join("---:" if i in block.numeric else "---" for i in range(len(block.headers))) + "|",
        *("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows),
        "",
    ]


def render_markdown(runs: Sequence[Mapping[str, Any]]) -> str:
    """The report as GitHub-flavoured Markdown (tables), one column per run in ``runs``."""
    return markdown_of_blocks(build(runs))


def markdown_of_blocks(blocks: Sequence[Block]) -> str:
    """Any report's blocks as GitHub-flavoured Markdown; see :func:`render_markdown`."""
    out: list[str] = []
    for block in blocks:
        if block.kind == "title":
            out += [f"# {_md_text(block.text)}", ""]
        elif block.kind == "heading":
            out += [f"{'#' * block.level} {_md_text(block.text)}", ""]
        elif block.kind == "table":
            out += _md_table(block)
        elif block.kind == "tables":
            for label, table in block.data["tables"]:
                out += [f"**{_md_text(label)}**", "", *_md_table(table)]
        elif block.kind == "verdicts":
            out += [f"- {_md_code(label)} **{_md_text(verdict)}** {_md_text(rest)}" for label, verdict, rest in block.rows]
            out.append("")
        elif block.kind == "text":
            out += [_md_text(block.text), ""]
        elif block.kind == "final":
            out += [*_md_fence([line for _, line in block.rows]), ""]
    return "\n".join(out).rstrip("\n") + "\n"
