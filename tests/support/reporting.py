"""Inputs of the reporting tests: a logged training history, a run summary and a prompt/response split
frame."""

from __future__ import annotations

import numpy as np
import pandas as pd


def make_history(n: int, **columns) -> pd.DataFrame:
    """``n`` logging rows (step 1 alone, then every 10 steps); ``columns`` override a value or give a list."""
    steps = [1, *range(10, 10 * n, 10)][:n]
    base = {
        "step": steps,
        "loss": np.linspace(5.0, 3.0, n),
        "grad_norm": 1.0,
        "lr": 1e-3,
        "tokens_per_s": 1200.0,
        "real_tokens_per_s": 1000.0,
        "samples_per_s": 8.0,
        "step_time_s": 0.1,
        "step_time_max_s": 0.12,
        "data_wait_share": 0.01,
        "padding_efficiency": 0.95,
        "peak_memory_mb": 500.0,
        "mfu": None,
        "eta_s": 10.0,
        "elapsed_s": np.arange(1, n + 1, dtype=float),
        "epoch": 0,
        "batch_in_epoch": steps,
    }
    base.update(columns)
    return pd.DataFrame({key: (value if np.ndim(value) else [value] * n) for key, value in base.items()})


SUMMARY = {
    "steps": 50,
    "epochs": 0.5,
    "wall_time_s": 12.5,
    "final_train_loss": 3.0,
    "final_val_loss": 3.2,
    "final_val_perplexity": 24.5,
    "effective_batch": 32,
    "rows_per_step": 32,
    "samples_per_step": 505.3,
    "tokens_per_step": 9710.0,
    "batching": "packed",
    "parameters": 123456,
    "tokens_seen": 99999,
    "runtime": {"device": "cpu", "num_threads": 4},
}


def pair_frame(n: int = 40) -> pd.DataFrame:
    splits = ["train", "validation", "test", "test"] * (n // 4)
    return pd.DataFrame(
        {
            "prompt": [f"대화 {i}: 배송이 언제 오나요?\n\n### Response:\n" for i in range(n)],
            "response": [f"배송 문의 {i % 3}" for i in range(n)],
            "split": pd.Categorical(splits, categories=["train", "validation", "test"]),
        }
    )


def report_document(history: pd.DataFrame, **parts) -> tuple[str, str]:
    """The report's HTML and Markdown for ``SUMMARY`` and ``history``, with ``parts`` replacing sections."""
    import json

    from fastlm.reporting.diagnosis import diagnose, epoch_eta
    from fastlm.reporting.report_document import ReportInputs, build_document
    from fastlm.reporting.summaries import efficiency_summary

    findings = [json.loads(json.dumps(f.__dict__)) for f in diagnose(SUMMARY, history)]
    defaults = dict(
        summary=SUMMARY,
        history=history,
        eval_history=pd.DataFrame(),
        training=pd.DataFrame(),
        efficiency=efficiency_summary(SUMMARY, history),
        diagnosis={"findings": findings, "epoch_eta": epoch_eta(SUMMARY, history)},
        test_metrics={"loss": 3.0},
        error_pairs=pd.DataFrame(),
        worst=pd.DataFrame(),
        generations=pd.DataFrame(),
        predictions=pd.DataFrame(),
        runs=pd.DataFrame(),
        split_report={},
    )
    return build_document(ReportInputs(**{**defaults, **parts}))


def text_rows(texts: list[str], tokenizer, *, limit: int | None = None):
    """Predict's rows of plain-text inputs (``predict.text_column``), long ones truncated to ``limit``."""
    from fastlm.reporting.predict_inputs import input_rows

    return input_rows(
        pd.DataFrame({"text": texts}),
        tokenizer,
        column=("predict.text_column", "text"),
        template=None,
        id_column=None,
        limit=limit,
        too_long="truncate",
        source="inputs.csv",
    )


def html_tables(document: str) -> dict[str, list[dict[str, str]]]:
    """The report's tables as the reader sees them: each section's (by its ``<section id>``) rows, each a
    mapping of column heading to cell text."""
    from html.parser import HTMLParser

    class Tables(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.tables: dict[str, list[list[str]]] = {}
            self.section, self.cell = "", None

        def handle_starttag(self, tag, attrs):
            if tag == "section":
                self.section = dict(attrs).get("id", "")
            elif tag == "tr":
                self.tables.setdefault(self.section, []).append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None:
                self.tables[self.section][-1].append(self.cell)
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    parser = Tables()
    parser.feed(document)
    return {
        section: [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]
        for section, rows in parser.tables.items()
    }


def chat_rows(table, tokenizer, chat, *, source: str = "chats.parquet"):
    """Predict's rows of chat inputs (``predict.messages_column``) under ``chat`` (a ``ChatFormat``), long
    ones truncated."""
    from fastlm.reporting.predict_inputs import input_rows

    return input_rows(
        table,
        tokenizer,
        column=("predict.messages_column", "messages"),
        template=None,
        id_column=None,
        limit=None,
        too_long="truncate",
        source=source,
        chat=chat,
    )
