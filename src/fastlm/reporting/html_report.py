"""A run report as ONE self-contained HTML file, and the same content as a Markdown summary.

The HTML has inline CSS, every figure embedded as a ``data:image/png;base64`` URI and no external
resource at all (no fonts, CDN, scripts; a Content-Security-Policy forbids loading any). All text and
table cells are HTML-escaped. Ids are derived from the names: each section is ``<section id=SLUG>``
(from its heading) and each figure ``<img id="fig-SLUG">`` (from its name); ids stay unique in a page.

The Markdown summary writes tables as pipe tables (no ``tabulate`` needed) and refers to each figure as
``![name](FILE)`` where ``FILE`` is :func:`figure_filename` of its name (``loss`` -> ``loss.png``): save
the figures under those names next to the Markdown file.
"""

from __future__ import annotations

import base64
import html
import io
import math
import numbers
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd
from matplotlib.figure import Figure

MISSING = "—"

_CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
  margin: 0 auto; max-width: 1100px; padding: 24px 32px 48px; color: #1b1f24; background: #ffffff;
  line-height: 1.45; }
header { border-bottom: 3px solid #0f766e; margin-bottom: 16px; padding-bottom: 8px; }
h1 { margin: 0 0 4px; font-size: 1.8em; }
.subtitle { margin: 0; color: #57606a; }
nav ul { list-style: none; padding: 0; margin: 8px 0 0; display: flex; flex-wrap: wrap; gap: 6px 16px; }
nav a { color: #0f766e; text-decoration: none; }
nav a:hover { text-decoration: underline; }
section { margin: 28px 0; }
h2 { font-size: 1.3em; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
figure { margin: 12px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #d0d7de; }
figcaption { color: #57606a; font-size: 0.9em; }
.table-wrap { overflow-x: auto; }
table.report-table { border-collapse: collapse; font-size: 0.92em; margin: 8px 0; }
table.report-table th, table.report-table td { border: 1px solid #d0d7de; padding: 4px 10px; }
table.report-table thead th { background: #f3f5f7; text-align: right; }
table.report-table td { text-align: right; font-variant-numeric: tabular-nums; }
table.report-table td, table.report-table th { vertical-align: top; white-space: nowrap; }
table.report-table td.text { text-align: left; overflow-wrap: anywhere; white-space: pre-wrap; \
min-width: 10ch;
  max-width: 36em; }
table.report-table th.text { text-align: left; }
table.report-table tbody th { font-weight: 600; }
table.report-table tr > :first-child { text-align: left; }
table.report-table tbody tr:nth-child(even) { background: #fafbfc; }
footer { color: #8c959f; font-size: 0.8em; margin-top: 40px; }
"""

# Forbids every load except the embedded images and the inline style sheet.
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


@dataclass
class Section:
    """One part of a report: a heading, then text, bullet items, a table and figures (each optional); a figure
    is a matplotlib Figure or an already rendered PNG (bytes)."""

    heading: str
    text: str = ""
    table: pd.DataFrame | None = None
    figures: dict[str, Figure | bytes] = field(default_factory=dict)
    items: list[str] = field(default_factory=list)
    # where the Markdown finds each figure, relative to it (the pipeline's plot files); else figure_filename;
    # None: no file of it was written for this report, the Markdown shows markdown_note instead of a link
    figure_files: dict[str, str | None] = field(default_factory=dict)
    markdown_note: str = ""


def figure_to_base64_png(fig: Figure | bytes) -> str:
    """The figure (or PNG bytes) as a PNG, base64-encoded (ASCII, no newlines): ``data:image/png;base64,`` +
    this."""
    if isinstance(fig, bytes):
        return base64.b64encode(fig).decode("ascii")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def slugify(name: str, default: str = "section") -> str:
    """Lower-case ASCII letters, digits and single dashes; starts with a letter (``default`` if empty)."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    if not slug:
        return default
    return slug if slug[0].isalpha() else f"{default}-{slug}"


def figure_filename(name: str) -> str:
    """The file name the Markdown summary uses for figure ``name`` (``"loss"`` -> ``"loss.png"``)."""
    return f"{slugify(name, default='figure')}.png"


def format_number(value) -> str:
    """A cell as text: thousands separators for big numbers, 4 significant digits, exponents for tiny ones."""
    if value is None or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return MISSING
        if math.isinf(number):
            return "∞" if number > 0 else "-∞"
        magnitude = abs(number)
        if number.is_integer() and magnitude < 1e15:
            return f"{number:,.0f}"
        if magnitude >= 1e15 or magnitude < 1e-3:
            return f"{number:.3e}"
        if magnitude >= 1000:
            return f"{number:,.1f}"
        # 4 significant digits; a fraction they round to a whole number (an accuracy of 0.99996 as "1", the
        # text of an exact 1.0) gets digits until its cell shows it is none
        digits, text = 4, f"{number:.4g}"
        while "." not in text and "e" not in text and digits < 17:
            digits += 1
            text = f"{number:.{digits}g}"
        return text
    return str(value)


def _formatted(table: pd.DataFrame) -> pd.DataFrame:
    """Every cell as text (see :func:`format_number`); column labels as text."""
    out = pd.DataFrame(
        {pos: [format_number(v) for v in table.iloc[:, pos].tolist()] for pos in range(table.shape[1])},
        index=table.index,
    )
    out.columns = [str(c) for c in table.columns]
    return out


def _show_index(table: pd.DataFrame) -> bool:
    """Keep the index only when it says something (not the default 0..n-1)."""
    index = table.index
    default = isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1
    return not (default and index.name is None)


class _Ids:
    def __init__(self) -> None:
        self.used: set[str] = set()

    def make(self, name: str, *, prefix: str = "", default: str = "section") -> str:
        base = prefix + slugify(name, default=default)
        candidate, n = base, 2
        while candidate in self.used:
            candidate, n = f"{base}-{n}", n + 1
        self.used.add(candidate)
        return candidate


def _paragraphs_html(text: str) -> str:
    blocks = [b.strip() for b in re.split(r"\n\s*\n", text or "") if b.strip()]
    return "".join(f"<p>{html.escape(b).replace(chr(10), '<br>')}</p>\n" for b in blocks)


def _table_html(table: pd.DataFrame) -> str:
    """The table as HTML, every cell escaped; line breaks in a cell stay line breaks (pandas' ``to_html``
    writes them as a literal backslash-n), shown by the ``pre-wrap`` style."""
    cells = _formatted(table)
    show_index = _show_index(table)
    head = ([html.escape(str(table.index.name or ""))] if show_index else []) + [
        html.escape(c) for c in cells.columns
    ]
    # text reads from the left, numbers line up on the right
    kinds = [
        "" if pd.api.types.is_numeric_dtype(table.iloc[:, pos]) else ' class="text"'
        for pos in range(table.shape[1])
    ]
    rows = []
    for label, values in zip(table.index.tolist(), cells.itertuples(index=False, name=None), strict=True):
        index = f"<th>{html.escape(format_number(label))}</th>" if show_index else ""
        rows.append(
            "<tr>"
            + index
            + "".join(f"<td{kind}>{html.escape(v)}</td>" for kind, v in zip(kinds, values, strict=True))
            + "</tr>\n"
        )
    header = "".join(f"<th{kind}>{h}</th>" for kind, h in zip([""] * show_index + kinds, head, strict=True))
    return (
        '<div class="table-wrap">\n<table class="dataframe report-table">\n'
        f"<thead>\n<tr>{header}</tr>\n</thead>\n"
        f"<tbody>\n{''.join(rows)}</tbody>\n</table>\n</div>\n"
    )


def render_html(*, title: str, subtitle: str, sections: Iterable[Section]) -> str:
    """The whole report as one self-contained HTML document (a string; write it as UTF-8)."""
    ids = _Ids()
    sections = list(sections)
    section_ids = [ids.make(s.heading) for s in sections]
    nav = "".join(
        f'<li><a href="#{sid}">{html.escape(s.heading)}</a></li>'
        for sid, s in zip(section_ids, sections, strict=True)
    )
    body: list[str] = []
    for sid, section in zip(section_ids, sections, strict=True):
        parts = [f'<section id="{sid}">\n<h2>{html.escape(section.heading)}</h2>\n']
        parts.append(_paragraphs_html(section.text))
        if section.items:
            items = "".join(f"<li>{html.escape(str(i))}</li>\n" for i in section.items)
            parts.append(f"<ul>\n{items}</ul>\n")
        if section.table is not None:
            parts.append(_table_html(section.table))
        for name, fig in section.figures.items():
            fid = ids.make(name, prefix="fig-", default="figure")
            alt = html.escape(str(name), quote=True)
            src = f"data:image/png;base64,{figure_to_base64_png(fig)}"
            parts.append(
                f'<figure>\n<img id="{fid}" alt="{alt}" src="{src}">\n'
                f"<figcaption>{html.escape(str(name))}</figcaption>\n</figure>\n"
            )
        parts.append("</section>\n")
        body.append("".join(parts))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f'<header>\n<h1>{html.escape(title)}</h1>\n<p class="subtitle">{html.escape(subtitle)}</p>\n'
        f"<nav><ul>{nav}</ul></nav>\n</header>\n<main>\n{''.join(body)}</main>\n"
        "<footer>Generated by fastlm; self-contained: no external resources.</footer>\n"
        "</body>\n</html>\n"
    )


def _markdown_cell(text: str) -> str:
    text = " ".join(str(text).split())  # no line breaks inside a row
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def markdown_table(table: pd.DataFrame) -> str:
    """A GitHub-style pipe table: header, alignment row (numbers right-aligned), one line per row."""
    if table.shape[1] == 0:
        return "_(empty table)_\n"
    show_index = _show_index(table)
    cells = _formatted(table)
    header = [str(c) for c in table.columns]
    numeric = [pd.api.types.is_numeric_dtype(table.iloc[:, pos]) for pos in range(table.shape[1])]
    rows = cells.values.tolist()
    if show_index:
        header = [str(table.index.name or "")] + header
        numeric = [False] + numeric
        rows = [[format_number(i)] + r for i, r in zip(table.index.tolist(), rows, strict=True)]
    header = [_markdown_cell(h) for h in header]
    rows = [[_markdown_cell(c) for c in r] for r in rows]
    widths = [max([3, len(h)] + [len(r[k]) for r in rows]) for k, h in enumerate(header)]

    def line(values: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)
            )
            + " |"
        )

    rules = [("-" * (w - 1) + ":") if num else "-" * w for w, num in zip(widths, numeric, strict=True)]
    align = "| " + " | ".join(rules) + " |"
    return "\n".join([line(header), align, *(line(r) for r in rows)]) + "\n"


_CODE_SPAN = re.compile(r"(`[^`]*`)")
_ENTITY_LIKE = re.compile(r"&(?=#?\w+;)")


def _markdown_text(text: str) -> str:
    """``< >`` (and an ``&`` that would start an entity) escaped outside code spans: a name such as
    ``org/model<v2>`` shows as written instead of being read as an HTML tag, ``Q&A`` stays readable; inside
    a code span entities are not decoded, so it stays as it is."""
    parts = _CODE_SPAN.split(str(text))
    return "".join(
        part if index % 2 else _ENTITY_LIKE.sub("&amp;", part).replace("<", "&lt;").replace(">", "&gt;")
        for index, part in enumerate(parts)
    )


def render_markdown(*, title: str, subtitle: str, sections: Iterable[Section]) -> str:
    """The report as Markdown; figures are ``![name](FILE)`` references (``figure_files``' file, else
    ``figure_filename(name)``; none for a figure whose file is None, the section's ``markdown_note`` said
    instead). Title, headings, text and items are escaped outside code spans (``_markdown_text``)."""
    blocks = [f"# {_markdown_text(title)}"]
    if subtitle:
        blocks.append(f"_{_markdown_text(subtitle)}_")
    for section in sections:
        blocks.append(f"## {_markdown_text(section.heading)}")
        text = (section.text or "").strip()
        if text:
            blocks.append(_markdown_text(text))
        if section.items:
            blocks.append("\n".join(f"- {_markdown_text(' '.join(str(i).split()))}" for i in section.items))
        if section.table is not None:
            blocks.append(markdown_table(section.table).rstrip("\n"))
        if section.markdown_note:
            blocks.append(section.markdown_note)
        for name in section.figures:
            label = str(name).replace("[", "(").replace("]", ")")
            file = section.figure_files.get(name, figure_filename(name))
            if file is not None:
                blocks.append(f"![{label}]({file})")
    return "\n\n".join(blocks) + "\n"
