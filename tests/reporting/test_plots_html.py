"""Run-report figures (lines, labels, NaN/empty robustness) and the self-contained HTML/Markdown report."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from fastlm.reporting.html_report import (
    Section,
    figure_filename,
    figure_to_base64_png,
    format_number,
    markdown_table,
    render_html,
    render_markdown,
)
from fastlm.reporting.plots import (
    learning_rate_figure,
    loss_figure,
    memory_figure,
    throughput_figure,
    tune_figure,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEPS = [1, 10, 20, 30, 40]


def make_history(**columns) -> pd.DataFrame:
    n = len(STEPS)
    base = {
        "step": STEPS,
        "loss": [5.0, 4.5, 4.0, 3.6, 3.3],
        "grad_norm": 1.0,
        "lr": [1e-4, 3e-4, 3e-4, 2e-4, 1e-4],
        "tokens_per_s": [100.0, 1200.0, 1250.0, 1260.0, 1255.0],
        "real_tokens_per_s": [90.0, 1000.0, 1050.0, 1060.0, 1040.0],
        "samples_per_s": 8.0,
        "step_time_s": 0.1,
        "step_time_max_s": 0.12,
        "data_wait_share": 0.01,
        "padding_efficiency": 0.85,
        "peak_memory_mb": [510.0, 620.0, 620.0, 621.0, 621.0],
        "mfu": np.nan,
        "eta_s": 10.0,
        "elapsed_s": np.arange(1, n + 1, dtype=float),
        "epoch": 0,
        "batch_in_epoch": STEPS,
    }
    base.update(columns)
    return pd.DataFrame({key: (value if np.ndim(value) else [value] * n) for key, value in base.items()})


EVAL = pd.DataFrame(
    {
        "step": [20, 40],
        "val_loss": [4.2, 3.5],
        "val_perplexity": [66.7, 33.1],
        "val_target_tokens": [1000, 1000],
    }
)
EMPTY_EVAL = pd.DataFrame(columns=["step", "val_loss", "val_perplexity", "val_target_tokens"])


def lines_by_label(fig: Figure) -> dict[str, tuple[list[float], list[float]]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in fig.axes[0].lines}


def legend_texts(fig: Figure) -> list[str]:
    legend = fig.axes[0].get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def renders(fig: Figure) -> bytes:
    return base64.b64decode(figure_to_base64_png(fig))


# --- figures -----------------------------------------------------------------------------------------


def test_loss_figure_has_train_and_validation_lines_with_labels():
    fig = loss_figure(make_history(), EVAL)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    lines = lines_by_label(fig)
    assert list(lines) == ["train loss", "validation loss"]
    assert lines["train loss"] == (STEPS, [5.0, 4.5, 4.0, 3.6, 3.3])
    assert lines["validation loss"] == ([20, 40], [4.2, 3.5])
    assert legend_texts(fig) == ["train loss", "validation loss"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("step", "loss", "Loss")
    assert tuple(fig.get_size_inches()) == (7.0, 3.5) and fig.dpi == 110
    assert renders(fig).startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(
    "eval_history", [EMPTY_EVAL, None, pd.DataFrame()], ids=["no-rows", "none", "no-columns"]
)
def test_loss_figure_without_validation_draws_only_train_loss(eval_history):
    fig = loss_figure(make_history(), eval_history)
    assert list(lines_by_label(fig)) == ["train loss"]
    assert legend_texts(fig) == ["train loss"]
    assert renders(fig).startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(
    ("smoothing", "train"), [(0.1, "train loss (label-smoothed 0.1)"), (0.0, "train loss")]
)
def test_a_label_smoothed_train_loss_is_named_so_beside_the_plain_validation_loss(smoothing, train):
    """With train.loss.label_smoothing the train line is the smoothed loss (higher than the plain
    cross-entropy the validation line is): its label says so; without, it reads as before."""
    fig = loss_figure(make_history(), EVAL, label_smoothing=smoothing)
    assert legend_texts(fig) == [train, "validation loss"]


def test_nan_points_are_left_out_of_a_line():
    fig = loss_figure(make_history(loss=[5.0, np.nan, 4.0, np.nan, 3.3]), EVAL.assign(val_loss=[np.nan, 3.5]))
    lines = lines_by_label(fig)
    assert lines["train loss"] == ([1, 20, 40], [5.0, 4.0, 3.3])
    assert lines["validation loss"] == ([40], [3.5])


@pytest.mark.parametrize("make", [loss_figure, throughput_figure, learning_rate_figure, memory_figure])
@pytest.mark.parametrize(
    "history",
    [
        make_history().iloc[:1],
        make_history(
            **{
                name: [np.nan] * 4 + [1.0]
                for name in ("loss", "real_tokens_per_s", "tokens_per_s", "lr", "peak_memory_mb")
            }
        ),
    ],
    ids=["one_step", "one_finite_point"],
)
def test_a_line_of_one_point_is_drawn_with_a_marker(make, history):
    """A run of one step (or whose every other value is NaN) has one point per line: a line of one point
    without a marker draws nothing, and the figure showed empty axes under a legend naming the line."""
    fig = make(history, EMPTY_EVAL) if make is loss_figure else make(history)
    lines = [line for line in fig.axes[0].lines if len(line.get_xdata()) == 1]
    assert lines, lines_by_label(fig)
    for line in lines:
        assert line.get_marker() not in (None, "", " ", "None", "none"), line.get_label()
        assert line.get_markersize() > 0


def test_throughput_figure_has_real_and_computed_tokens_per_second():
    fig = throughput_figure(make_history())
    lines = lines_by_label(fig)
    assert list(lines) == ["real tokens/s", "computed tokens/s"]
    assert lines["real tokens/s"] == (STEPS, [90.0, 1000.0, 1050.0, 1060.0, 1040.0])
    assert lines["computed tokens/s"] == (STEPS, [100.0, 1200.0, 1250.0, 1260.0, 1255.0])
    assert fig.axes[0].get_ylabel() == "tokens/s" and fig.axes[0].get_xlabel() == "step"
    assert legend_texts(fig) == ["real tokens/s", "computed tokens/s"]
    assert fig.axes[0].get_ylim()[0] == 0


def test_learning_rate_and_memory_figures():
    history = make_history()
    lr = lines_by_label(learning_rate_figure(history))
    assert lr == {"learning rate": (STEPS, [1e-4, 3e-4, 3e-4, 2e-4, 1e-4])}
    memory_fig = memory_figure(history)
    assert lines_by_label(memory_fig) == {"peak memory (MB)": (STEPS, [510.0, 620.0, 620.0, 621.0, 621.0])}
    assert memory_fig.axes[0].get_ylabel() == "peak memory (MB)"


@pytest.mark.parametrize("make", [loss_figure, throughput_figure, learning_rate_figure, memory_figure])
@pytest.mark.parametrize(
    "history",
    [
        make_history(
            loss=np.nan, lr=np.nan, tokens_per_s=np.nan, real_tokens_per_s=np.nan, peak_memory_mb=np.nan
        ),
        make_history().iloc[0:0],
        pd.DataFrame(),
        make_history(peak_memory_mb=None, lr="n/a"),  # object columns: coerced, nothing drawn
    ],
    ids=["all-nan", "no-rows", "no-columns", "object"],
)
def test_figures_survive_nan_and_empty_inputs(make, history):
    fig = make(history, EMPTY_EVAL) if make is loss_figure else make(history)
    ax = fig.axes[0]
    drawn = ax.lines
    if not drawn:  # an empty plot says so
        assert "no data" in [t.get_text() for t in ax.texts]
    for line in drawn:
        assert np.isfinite(np.asarray(line.get_ydata(), dtype=float)).all()
    assert renders(fig).startswith(PNG_SIGNATURE)


def test_history_without_step_column_uses_row_numbers():
    fig = memory_figure(pd.DataFrame({"peak_memory_mb": [1.0, 2.0, 3.0]}))
    assert lines_by_label(fig) == {"peak memory (MB)": ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])}


def test_reporting_modules_import_neither_pyplot_nor_kedro():
    code = (
        "import sys, fastlm.reporting.plots, fastlm.reporting.html_report\n"
        "bad = [m for m in sys.modules\n"
        "       if m == 'matplotlib.pyplot' or m == 'kedro' or m.startswith('kedro.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- HTML --------------------------------------------------------------------------------------------


class _Collector(HTMLParser):
    """Tags with their attributes, plus the text of the document, for structural checks."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.tags if name == tag]


def parse(document: str) -> _Collector:
    collector = _Collector()
    collector.feed(document)
    collector.close()
    return collector


TABLE = pd.DataFrame(
    {
        "metric": ["<b>bold</b>", "pipe | here", "ratio"],
        "value": [1234567.891, 0.0001234, np.nan],
        "count": [3, 40000, 7],
    }
)


@pytest.fixture(scope="module")
def sections() -> list[Section]:
    history = make_history()
    return [
        Section(
            "Summary",
            text="A run of <5> steps & more.\n\nSecond paragraph.",
            table=TABLE,
            items=["first <item>", "second"],
        ),
        Section("Loss", figures={"loss": loss_figure(history, EVAL)}),
        Section(
            "Speed & memory",
            text="Throughput and memory.",
            figures={"throughput": throughput_figure(history), "peak memory": memory_figure(history)},
        ),
        Section("Loss", text="A second section with the same heading gets its own id."),
    ]


@pytest.fixture(scope="module")
def report(sections) -> str:
    return render_html(title="Run <abc>", subtitle="tiny model & friends", sections=sections)


def test_html_is_self_contained(report):
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", report, re.IGNORECASE)
    assert "http://" not in report and "https://" not in report
    assert "<script" not in report.lower()
    assert "<link" not in report.lower() and "@import" not in report and "url(" not in report
    doc = parse(report)
    for attrs in doc.all("img"):
        assert attrs["src"].startswith("data:image/png;base64,")
    for attrs in doc.all("a"):
        assert attrs["href"].startswith("#")
    assert report.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in report


def test_html_has_every_section_and_figure(report):
    doc = parse(report)
    section_ids = [attrs["id"] for attrs in doc.all("section")]
    assert section_ids == ["summary", "loss", "speed-memory", "loss-2"]
    assert [a["href"] for a in doc.all("a")] == [f"#{sid}" for sid in section_ids]
    images = doc.all("img")
    assert [(a["id"], a["alt"]) for a in images] == [
        ("fig-loss", "loss"),
        ("fig-throughput", "throughput"),
        ("fig-peak-memory", "peak memory"),
    ]
    for attrs in images:
        payload = attrs["src"].removeprefix("data:image/png;base64,")
        assert base64.b64decode(payload, validate=True).startswith(PNG_SIGNATURE)
    assert report.count("data:image/png;base64,") == 3
    ids = [attrs["id"] for _, attrs in doc.tags if attrs.get("id")]
    assert len(ids) == len(set(ids))


def test_html_escapes_text_and_table_cells(report):
    assert "&lt;b&gt;bold&lt;/b&gt;" in report and "<b>bold" not in report
    assert "Run &lt;abc&gt;" in report and "A run of &lt;5&gt; steps &amp; more." in report
    assert "first &lt;item&gt;" in report
    doc = parse(report)
    tables = doc.all("table")
    assert len(tables) == 1 and "report-table" in tables[0]["class"]
    text = "".join(doc.text)
    for cell in ["<b>bold</b>", "1,234,567.9", "1.234e-04", "—", "40,000"]:
        assert cell in text
    assert len(doc.all("td")) == 9  # no index column: 3 rows x 3 columns


def test_html_renders_an_empty_report():
    document = render_html(title="Empty", subtitle="", sections=[Section("Nothing")])
    assert '<section id="nothing">' in document and "<img" not in document


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3, "3"),
        (40000, "40,000"),
        (2.0, "2"),
        (0.12345, "0.1235"),
        (12345.67, "12,345.7"),
        (0.0001234, "1.234e-04"),
        (np.nan, "—"),
        (None, "—"),
        (np.int64(5), "5"),
        ("x", "x"),
        (True, "True"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.99996, "0.99996"),
        (0.999999, "0.999999"),
        (999.96, "999.96"),
        (-0.99996, "-0.99996"),
        (9.99996, "9.99996"),
    ],
)
def test_a_fraction_that_rounds_to_a_whole_number_keeps_its_fraction(value, text):
    """An accuracy or ROUGE F1 of 0.99996 in test_metrics.json was shown as ``1`` in the report's tables, as
    an exact 1.0 is: a perfect score it was not. Digits are added until the cell shows the fraction."""
    assert format_number(value) == text


# --- Markdown ----------------------------------------------------------------------------------------


def assert_well_formed_pipe_table(lines: list[str]) -> None:
    def cells(line: str) -> list[str]:
        assert line.startswith("| ") and line.endswith(" |"), line
        return re.split(r"(?<!\\)\|", line[1:-1])

    widths = [len(cells(line)) for line in lines]
    assert len(set(widths)) == 1, lines
    assert all(re.fullmatch(r" -+:? ", cell) for cell in cells(lines[1])), lines[1]
    assert len({len(line) for line in lines}) == 1, "columns are padded to one width"


def table_blocks(markdown: str) -> list[list[str]]:
    blocks, current = [], []
    for line in markdown.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    return blocks + ([current] if current else [])


def test_markdown_summary(sections):
    markdown = render_markdown(title="Run abc", subtitle="tiny model", sections=sections)
    assert markdown.startswith("# Run abc\n\n_tiny model_\n")
    assert [line for line in markdown.splitlines() if line.startswith("## ")] == [
        "## Summary",
        "## Loss",
        "## Speed & memory",
        "## Loss",
    ]
    for name in ["loss", "throughput"]:
        assert f"![{name}]({name}.png)" in markdown
    assert "![peak memory](peak-memory.png)" in markdown
    assert figure_filename("peak memory") == "peak-memory.png"
    assert "- first &lt;item&gt;" in markdown
    (table,) = table_blocks(markdown)
    assert len(table) == 2 + len(TABLE)
    assert_well_formed_pipe_table(table)
    assert table[0].split("|")[1].strip() == "metric"
    assert "pipe \\| here" in markdown and "&lt;b&gt;bold&lt;/b&gt;" in markdown
    assert "\n\n\n" not in markdown


def test_markdown_text_outside_tables_shows_angle_brackets_and_keeps_code_spans():
    """A model or run name such as ``org/model<v2>`` went into report.md raw: rendered, ``<v2>`` was an
    unknown HTML tag and disappeared (and raw HTML passed through). Text, headings, items and the title now
    escape ``< >`` (and an ``&`` that would start an entity); a code span stays as written (entities are
    not decoded inside one)."""
    markdown = render_markdown(
        title="Run org/model<v2>",
        subtitle="Q&A &copy; <i>data</i>",
        sections=[
            Section(
                "Model <b>x</b>",
                text="Trained `org/model<v2>` from org/model<v2>.",
                items=["adapter <lora>", "`a<b` & c"],
            )
        ],
    )
    assert markdown.startswith("# Run org/model&lt;v2&gt;\n\n_Q&A &amp;copy; &lt;i&gt;data&lt;/i&gt;_\n")
    assert "## Model &lt;b&gt;x&lt;/b&gt;" in markdown
    assert "Trained `org/model<v2>` from org/model&lt;v2&gt;." in markdown
    assert "- adapter &lt;lora&gt;" in markdown and "- `a<b` & c" in markdown
    assert "<b>" not in markdown and "<i>" not in markdown and "<lora>" not in markdown


def test_markdown_table_keeps_a_meaningful_index_and_handles_edge_cases():
    frame = pd.DataFrame({"loss": [3.5, 3.25]}, index=pd.Index(["train", "validation"], name="split"))
    lines = markdown_table(frame).splitlines()
    assert_well_formed_pipe_table(lines)
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["split", "loss"]
    assert lines[1].endswith("---: |")  # numbers right-aligned
    assert "validation" in lines[3] and "3.25" in lines[3]
    empty = markdown_table(pd.DataFrame({"a": [], "b": []})).splitlines()
    assert len(empty) == 2
    assert_well_formed_pipe_table(empty)
    assert markdown_table(pd.DataFrame()).strip() == "_(empty table)_"
    multiline = markdown_table(pd.DataFrame({"note": ["two\nlines"]})).splitlines()
    assert len(multiline) == 3 and "two lines" in multiline[2]


def test_tune_figure_draws_the_measured_trials_marks_the_cliff_and_the_choice():
    trials = pd.DataFrame(
        [
            {"micro_batch_size": 1, "status": "ok", "real_tokens_per_s": 100.0, "peak_memory_mb": 10.0},
            {"micro_batch_size": 2, "status": "ok", "real_tokens_per_s": 180.0, "peak_memory_mb": 20.0},
            {
                "micro_batch_size": 4,
                "status": "out of memory",
                "real_tokens_per_s": None,
                "peak_memory_mb": None,
            },
        ]
    )
    figure = tune_figure(trials, 2)
    speed, memory = figure.axes
    line, chosen = speed.get_lines()[0], speed.get_lines()[-1]
    assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [100.0, 180.0]
    assert list(memory.get_lines()[0].get_ydata()) == [10.0, 20.0]
    assert (list(chosen.get_xdata()), list(chosen.get_ydata())) == ([2], [180.0])
    assert [text.get_text() for text in speed.texts] == ["out of memory"]
    assert tune_figure(trials.iloc[:0], None).axes  # no trial at all: an empty figure, no error


def test_tune_figure_draws_one_line_per_batching_mode_and_stars_the_chosen_mode():
    trials = pd.DataFrame(
        [
            {
                "mode": "packed",
                "micro_batch_size": 1,
                "status": "ok",
                "real_tokens_per_s": 100.0,
                "peak_memory_mb": 10.0,
            },
            {
                "mode": "packed",
                "micro_batch_size": 2,
                "status": "ok",
                "real_tokens_per_s": 300.0,
                "peak_memory_mb": 20.0,
            },
            {
                "mode": "length_grouped",
                "micro_batch_size": 1,
                "status": "ok",
                "real_tokens_per_s": 90.0,
                "peak_memory_mb": 8.0,
            },
            {
                "mode": "length_grouped",
                "micro_batch_size": 2,
                "status": "ok",
                "real_tokens_per_s": 150.0,
                "peak_memory_mb": 12.0,
            },
        ]
    )
    speed, memory = tune_figure(trials, 2, chosen_mode="packed").axes
    lines = speed.get_lines()
    assert [list(line.get_ydata()) for line in lines[:2]] == [[100.0, 300.0], [90.0, 150.0]]
    assert [line.get_label() for line in lines[:2]] == [
        "real tokens/s (packed)",
        "real tokens/s (length_grouped)",
    ]
    assert list(lines[-1].get_ydata()) == [300.0] and lines[-1].get_label() == "chosen"
    assert len(memory.get_lines()) == 2


def test_a_sweeps_loss_plot_names_each_label_smoothed_train_line():
    """sweep_loss.png: a run whose train loss was label-smoothed (its summary's ``label_smoothing``) is named
    so, as loss.png names it; smoothed and plain curves of a grid over label smoothing were one unlabelled
    plot."""
    from fastlm.reporting.sweep_view import loss_plot

    histories = {"s-01": make_history(), "s-02": make_history()}
    evaluations = {"s-01": EVAL, "s-02": EVAL}
    fig = loss_plot(histories, evaluations, smoothing={"s-01": 0.0, "s-02": 0.1})
    assert legend_texts(fig) == ["s-01 train", "s-01 val", "s-02 train (label-smoothed 0.1)", "s-02 val"]
    assert legend_texts(loss_plot(histories, evaluations))[:2] == ["s-01 train", "s-01 val"]
