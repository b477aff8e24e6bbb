"""The training report as sections: what a user reads instead of guessing. Rendered to HTML and Markdown."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from numbers import Number
from pathlib import Path

import pandas as pd

from fastlm.reporting import plots
from fastlm.reporting.comparison import data_note
from fastlm.reporting.diagnosis import NOT_JUDGED
from fastlm.reporting.html_report import Section, render_html, render_markdown
from fastlm.reporting.rouge import tokenless_note
from fastlm.reporting.summaries import TRAINING_ID


def _one_row(frame: pd.DataFrame) -> pd.DataFrame:
    """A one-row summary shown as a two-column table (name, value)."""
    if frame.empty:
        return frame
    row = frame.iloc[0]
    return pd.DataFrame({"figure": row.index, "value": row.to_numpy()})


def training_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The one-row training summary as a two-column table whose losses are named by their step: the model's
    (``model_step``: early stopping's best) pair first, then the last step's where that is another step; a
    train loss smoothed by ``train.loss.label_smoothing`` says so (the validation losses are plain)."""
    table = _one_row(frame)
    if table.empty or "model_step" not in frame.columns:
        return table
    figure = pd.to_numeric(frame.iloc[0], errors="coerce").astype("float64").get
    smoothing, model_step, steps = figure("label_smoothing"), figure("model_step"), figure("steps")
    smoothed = f"; label-smoothed {smoothing:g}" if _finite(smoothing) and smoothing > 0 else ""
    if _finite(model_step) and _finite(steps) and model_step != steps:
        model, last = f"the model's step, {model_step:.0f}", f"the last step, {steps:.0f}"
        names = {
            "model_train_loss": f"model_train_loss ({model}{smoothed})",
            "final_val_loss": f"final_val_loss ({model})",
            "final_val_perplexity": f"final_val_perplexity ({model})",
            "final_train_loss": f"final_train_loss ({last}{smoothed})",
            "last_val_loss": f"last_val_loss ({last})",
        }
        hidden = {"label_smoothing"}
    else:  # one step: its pair alone
        step = f"step {steps:.0f}" if _finite(steps) else "the last step"
        names = {
            "final_train_loss": f"final_train_loss ({step}{smoothed})",
            "final_val_loss": f"final_val_loss ({step})",
            "final_val_perplexity": f"final_val_perplexity ({step})",
        }
        hidden = {"model_step", "model_train_loss", "last_val_loss", "label_smoothing"}
    order = [
        "model_train_loss",
        "final_val_loss",
        "final_val_perplexity",
        "final_train_loss",
        "last_val_loss",
    ]
    table = table[~table["figure"].isin(hidden)].reset_index(drop=True)
    figures = table["figure"].tolist()
    first = min(figures.index(name) for name in order if name in figures)
    kept = [name for name in figures if name not in order]
    losses = [name for name in order if name in figures]
    table = table.set_index("figure").loc[kept[:first] + losses + kept[first:]].reset_index()
    table["figure"] = [names.get(name, name) for name in table["figure"]]
    return table


# What each diagnosis rule measures, named in its line: "padding efficiency 100 %", not
# "padding-bound: 100 %".
MEASURES = {
    "input-bound": "data wait",
    "padding-bound": "padding efficiency",
    "host-sync-bound": "host sync",
    "memory-saturated": "peak memory",
    "eval-bound": "evaluation and save share of the wall time",
    "compile-bound": "compile share of the wall time",
    "recompile-limit": "functions run eagerly past dynamo's recompile limit",
    "compute-bound": "throughput",
}


def check_line(finding: dict) -> str:
    """One diagnosis check as a person reads it: the measure and its figure, then the verdict."""
    measure = MEASURES.get(finding["kind"], finding["kind"])
    if not finding["triggered"] and str(finding.get("message", "")).startswith(NOT_JUDGED):
        return f"? {measure} {finding['figure']}: {finding['message']}"
    verdict = finding["kind"] if finding["triggered"] else f"not {finding['kind']}"
    return f"{'⚠' if finding['triggered'] else '✓'} {measure} {finding['figure']}: {verdict}"


def readable_token(text) -> str:
    """A decoded token for people: leading/trailing spaces shown as ␣ (invisible otherwise), newlines as ⏎."""
    text = "" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text)
    stripped = text.strip(" ")
    lead, trail = len(text) - len(text.lstrip(" ")), len(text) - len(text.rstrip(" "))
    if not stripped:
        return "␣" * len(text)
    return ("␣" * lead + stripped + "␣" * trail).replace("\n", "⏎")


def _token_cell(texts: pd.Series, ids: pd.Series | None) -> list[str]:
    """Decoded tokens for people (``readable_token``); a piece that decodes to no character (a byte of a
    multi-byte character: U+FFFD) followed by its id, so two such pieces are not one token to a reader."""
    ids = ids if ids is not None else pd.Series(None, index=texts.index)
    return [
        f"{readable_token(text)} (id {int(token)})"
        if "\ufffd" in str(text) and token is not None and not pd.isna(token)
        else readable_token(text)
        for text, token in zip(texts, ids, strict=True)
    ]


def error_pairs_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """The wrong predictions with decoded tokens (byte-level BPE pieces such as ``Ġthe`` are for machines;
    one that decodes to no character shown with its id)."""
    if pairs is None or pairs.empty or "target_text" not in pairs:
        return pairs
    return pd.DataFrame(
        {
            "target": _token_cell(pairs["target_text"], pairs.get("target_id")),
            "predicted": _token_cell(pairs["predicted_text"], pairs.get("predicted_id")),
            "count": pairs["count"],
            "share of errors": pairs.get("share_of_errors"),
        }
    )


# The curves' files as the report pipeline writes them (catalog "{name}_plot": plots/<name>.png beside
# report.md), for the Markdown's image links
CURVE_FILES = {
    "loss": "plots/loss.png",
    "throughput": "plots/throughput.png",
    "learning rate": "plots/learning_rate.png",
    "peak memory": "plots/memory.png",
}
CURVE_DATASETS = {
    "loss": "loss_plot",
    "throughput": "throughput_plot",
    "learning rate": "learning_rate_plot",
    "peak memory": "memory_plot",
}
NOT_PLOTTED = (
    "The curves above are drawn in report.html: plot_training was not run with this report, so no plot file "
    "of this training was written for report.md to link (the plots/ folder may hold another training's)."
)


def curve_files(paths: dict | None) -> dict[str, str | None]:
    """Where report.md finds each curve: the plot files written by this run's ``plot_training``, relative to
    report.md (``paths``: ``dataset_paths``, the run's file datasets), None for a curve not drawn in this run
    (a report slice without ``plot_training``: the file there, if any, is an earlier report's, perhaps of
    another training). Without ``paths`` (no catalog, or report.md not a local file): ``CURVE_FILES``."""
    markdown = (paths or {}).get("report_markdown")
    if markdown is None:
        return dict(CURVE_FILES)
    folder = os.path.dirname(markdown)
    return {
        label: Path(os.path.relpath(paths[name], folder)).as_posix() if name in paths else None
        for label, name in CURVE_DATASETS.items()
    }


def run_lines(summary: dict, split_report: dict | None) -> list[str]:
    """What was trained, how, and on which data: model (LoRA and its base), trainable counts, the data's
    format (chats, prompt/response: ``split_report``'s ``data_format``), the steady speed beside the
    wall-clock one, split counts."""
    lines = []
    total, trainable = (
        summary.get("total_parameters") or summary.get("parameters"),
        summary.get("trainable_parameters"),
    )
    counts = (
        f"{trainable:,} trainable of {total:,} parameters"
        if trainable is not None and total
        else f"{total:,} parameters"
        if total
        else ""
    )
    if summary.get("lora"):
        base = summary.get("base_model") or "a pretrained model"
        lines.append(
            f"Model: {summary.get('adapter') or 'LoRA'} on {base}"
            f"{f' ({counts})' if counts else ''}; the adapters alone were trained."
        )
    else:
        lines.append(
            f"Model: {summary.get('base_model') or 'tiny Llama from config'}"
            f"{f' ({counts})' if counts else ''}; every parameter trained."
        )
    stopped_by = summary.get("stopped_by")
    if stopped_by == "time budget":
        lines.append(
            f"Stopped: by its time budget (train.max_minutes) at step {summary.get('steps', '?')} of "
            f"{summary.get('planned_steps', '?')}; the same command with train.resume: auto continues it."
        )
    early = summary.get("early_stopping") or {}
    if early.get("best_step") is not None:
        stopped = {"early stopping": "stopped early", "time budget": "was stopped by its time budget"}.get(
            stopped_by, "ran to its last step"
        )
        lines.append(
            f"Early stopping (patience {early.get('patience')}): the run {stopped} at step "
            f"{summary.get('steps', '?')}; the model written is step {early.get('model_from_step')}'s, "
            f"the best validation loss ({early.get('best_val_loss', math.nan):.4f}; checkpoint "
            f"{early.get('best_checkpoint')})."
        )
    if summary.get("label_smoothing"):
        lines.append(
            f"Loss: the train loss is label-smoothed ({summary['label_smoothing']:g}, "
            "train.loss.label_smoothing); validation and test losses and perplexities are the plain "
            "cross-entropy."
        )
    if summary.get("neftune_noise_alpha"):
        lines.append(
            f"Embeddings: NEFTune noise in training (alpha {summary['neftune_noise_alpha']:g}, "
            "train.model.neftune_noise_alpha); evaluation and the model written are without it."
        )
    if summary.get("fold") is not None:
        fold = summary["fold"]
        lines.append(
            f"Fold: train.fold {fold} of {summary.get('folds', '?')} (split.folds): trained on "
            f"{_count(summary.get('train_samples'))} rows of train + validation outside fold {fold}, "
            f"validated on its {_count(summary.get('validation_samples'))} rows; the test split is the "
            "split's."
        )
    lines += _data_format_lines(split_report or {}, encoder_decoder=bool(summary.get("encoder_decoder")))
    steady = summary.get("steady_real_tokens_per_s")
    if _finite(steady) and _finite(summary.get("real_tokens_per_s")):
        lines.append(
            f"Speed: {summary['real_tokens_per_s']:,.0f} real tokens/s over the timed steps' wall clock; "
            f"steady real tokens/s (steps only): {steady:,.0f}, {_steady_scope(summary)}"
            f"{_time_outside(summary)}."
        )
    failed = summary.get("oom_failed_s")
    if _finite(failed) and failed > 0:
        lines.append(
            f"Out of memory: {failed:,.1f} s went to step attempts that ran out of memory and were redone "
            "at a smaller micro-batch (oom_failed_s); no step's time holds them, the wall clock does."
        )
    splits = (split_report or {}).get("splits") or {}
    if splits:
        rows = ", ".join(f"{name} {int(info.get('rows', 0)):,}" for name, info in splits.items())
        dropped = {k: v for k, v in ((split_report or {}).get("dropped") or {}).items() if k != "total" and v}
        drops = ", ".join(f"{reason} {count:,}" for reason, count in dropped.items()) or "none"
        raw = split_report.get("raw_rows")
        # the rows split.max_samples left out of the splits: without them the figures do not add up
        capped = split_report.get("capped_by_max_samples")
        cap = f"; left out by split.max_samples {int(capped):,}" if _finite(capped) and capped > 0 else ""
        lines.append(
            f"Data: {raw:,} raw rows; dropped: {drops}{cap}; splits: {rows}."
            if raw is not None
            else f"Data splits: {rows}; dropped: {drops}{cap}."
        )
    return lines


def _time_outside(summary: dict) -> str:
    """The time no step holds: the seconds between steps (``outside_steps_s``), the validations' part of them
    (``eval_s``), and torch.compile's compiles (``compile_s``, left out of every step time); "" for none."""
    outside, evals, compiling = (summary.get(key) for key in ("outside_steps_s", "eval_s", "compile_s"))
    parts = []
    if _finite(outside):
        part = f"{_seconds(outside)} s outside the steps"
        parts.append(
            part + (f", {_seconds(evals)} s of them validation" if _finite(evals) and evals > 0 else "")
        )
    if _finite(compiling) and compiling > 0:
        parts.append(f"{_seconds(compiling)} s compiling, in no step time")
    return f" ({'; '.join(parts)})" if parts else ""


def _seconds(value: float) -> str:
    """Seconds as the report writes them: one decimal from a second on, two significant digits under it
    (0.044, not 0.0)."""
    return f"{value:,.1f}" if abs(value) >= 1 or value == 0 else f"{value:.2g}"


def _steady_scope(summary: dict) -> str:
    """What the steady figure (and the step-time percentiles) cover: a resumed run measured the steps its
    own process trained (``StepMetrics.step_figures``: the first left out unless it is the only one)."""
    steps = _resumed_steps(summary)
    if steps is None:
        return "the first step, evaluations and saves left out"
    if summary["steps_trained"] > 1:
        return f"{steps}, its first step, evaluations and saves left out"
    return f"{steps}, evaluations and saves left out"


def _efficiency_scope(summary: dict, efficiency: pd.DataFrame) -> str:
    """Under the efficiency table of a resumed run: the rates cover the history's steps (``rate_steps``),
    the per-step figures its resuming process's (``step_figure_steps``)."""
    steps = _resumed_steps(summary)
    if steps is None:
        return ""
    row = efficiency.iloc[0] if not efficiency.empty else {}
    rates, own = row.get("rate_steps"), row.get("step_figure_steps")
    if not isinstance(rates, str) or not isinstance(own, str):
        return f"Step times, data wait and padding: {steps}."
    return (
        f"Rates (tokens/s, samples/s): steps {rates}, each process's first step left out. Step times, data "
        f"wait and padding: steps {own}, {steps}"
        + (", its first step left out." if summary["steps_trained"] > 1 else ".")
    )


def _resumed_steps(summary: dict) -> str | None:
    """``over the N steps this process trained (resumed at step S)`` for a resumed run, else None."""
    start, trained = summary.get("resumed_from_step"), summary.get("steps_trained")
    if start is None or not isinstance(trained, int):
        return None
    return (
        f"over the {trained} step{'s' if trained != 1 else ''} this process trained (resumed at step {start})"
    )


def _is_nan(value) -> bool:
    return isinstance(value, Number) and not isinstance(value, bool) and math.isnan(value)


def _not_finite(metrics: dict) -> str:
    """The test figures that came out NaN or infinite, named: a model whose outputs are not finite on the
    test split (weights broken after the last checked step, an overflow in evaluation), or a perplexity
    alone infinite, the exp of a finite loss past the float range; "" for none."""
    bad = [
        f"{name} ({'NaN' if math.isnan(value) else '∞' if value > 0 else '-∞'})"
        for name, value in metrics.items()
        if isinstance(value, Number) and not isinstance(value, bool) and not math.isfinite(value)
    ]
    if not bad:
        return ""
    loss, perplexity = metrics.get("loss"), metrics.get("perplexity")
    if len(bad) == 1 and _finite(loss) and isinstance(perplexity, float) and perplexity == math.inf:
        # exp(loss) past the float range (a loss above ~709.78): the outputs and the loss are finite
        return (
            f"Not finite: perplexity (∞), the exp of the test loss {loss:,.4g}, past the float range (a loss "
            "above 709.78): the model's outputs are finite numbers, its loss that of a broken or diverged "
            "model; the perplexity is not logged to MLflow and the run comparison shows none."
        )
    return (
        f"Not finite: {', '.join(bad)}. The model's outputs on the test split are not finite numbers "
        "(weights broken after the last step the training checked, or an overflow in evaluation: try "
        "train.runtime.precision: fp32); these figures are not logged to MLflow and the run comparison "
        "shows none."
    )


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _data_format_lines(split_report: dict, *, encoder_decoder: bool = False) -> list[str]:
    """What the model trained on of prompt/response or chat data (``split_report``'s ``data_format``, the
    split fingerprint's, and ``system_prompt``): which tokens were trained and how prompts were rendered;
    nothing for plain text or pre-tokenized ids. ``encoder_decoder`` (the train summary's): the model read a
    chat's earlier answers as encoder input and trained its last answer alone, whatever
    ``split.train_turns``."""
    data_format = split_report.get("data_format") or {}
    kind = data_format.get("kind")
    if kind == "messages":
        turns = data_format.get("train_turns") or "all"
        trained = (
            f"every assistant answer trained (split.train_turns: {turns})"
            if turns == "all" and not encoder_decoder
            else "only each chat's last answer trained: an encoder-decoder model, its earlier answers are "
            f"its encoder's input (split.train_turns: {turns})"
            if turns == "all"
            else f"only each chat's last answer trained (split.train_turns: {turns}), earlier ones context"
        )
        variables = data_format.get("chat_template_kwargs")
        line = (
            f"Chats (split.messages_column {data_format.get('messages_column')!r}): {trained}; rendered with "
            + (
                "the tokenizer's chat template"
                if data_format.get("chat_template_sha256")
                else "role: content lines wrapped by the prompt template"
            )
            + (f" and split.chat_template_kwargs {variables}" if variables else "")
            + "."
        )
        line += _tool_use_sentence(split_report.get("tool_use"))
        system = split_report.get("system_prompt")
        if system:
            shown = system if len(system) <= 80 else system[:79].rstrip() + "…"
            line += (
                f" Every training chat began with the system turn {shown!r}; predict and the report's "
                "samples ask after it."
            )
        return [line]
    if kind == "prompt_response":
        return [
            f"Prompt/response (split.prompt_column {data_format.get('prompt_column')!r}, "
            f"split.response_column {data_format.get('response_column')!r}): only the response and its EOS "
            f"trained, the prompt wrapped by the prompt template {data_format.get('prompt_template')!r}; "
            "predict and the report's samples wrap theirs so."
        ]
    return []


def _tool_use_sentence(use) -> str:
    """What the chats did with tools (the split report's ``tool_use``: recorded by the split where the data
    has a tools column or chats that call tools); nothing for chats without either."""
    if not isinstance(use, dict):
        return ""
    calling, given, column = (
        use.get("chats_calling_tools"),
        use.get("chats_with_tools"),
        use.get("tools_column"),
    )
    said = (
        f" Tool calls: {calling} chat{'s call' if calling != 1 else ' calls'} tools, each call as the chat "
        "template writes it"
        if calling
        else " Tool calls: no chat calls tools"
    )
    if column:
        said += f"; {given} given their tools from split.tools_column {column!r}"
    else:
        said += "; the data has no tools column, so no chat was given tool schemas"
    return said + "."


@dataclass(frozen=True, eq=False)  # frames do not compare as one truth value
class ReportInputs:
    """Everything the report is written from, one object: the report node's catalog inputs (a Kedro node takes
    one argument per input, so the node keeps them apart and groups them here)."""

    summary: dict
    history: pd.DataFrame
    eval_history: pd.DataFrame
    training: pd.DataFrame
    efficiency: pd.DataFrame
    diagnosis: dict
    test_metrics: dict
    error_pairs: pd.DataFrame
    worst: pd.DataFrame
    generations: pd.DataFrame
    runs: pd.DataFrame
    predictions: pd.DataFrame | None = None
    split_report: dict | None = None
    sweep: dict | None = None
    paths: dict | None = None  # dataset_paths: where report.md finds this run's plot files


def _evaluation_scope(test_metrics: dict) -> str:
    """What a test evaluation capped by ``report.eval_max_batches`` counted: its samples of the split's (the
    first batches of the evaluation's fixed order); empty when it counted every sample."""
    counted, total = test_metrics.get("samples"), test_metrics.get("test_split_samples")
    if not isinstance(counted, Number) or not isinstance(total, Number) or counted >= total:
        return ""
    return (
        f"On {counted:,} of the {total:,} test samples: report.eval_max_batches "
        f"{test_metrics.get('eval_max_batches')} evaluates the first batches of the evaluation's fixed "
        "order (seed 0); null evaluates the whole split."
    )


def build_sections(inputs: ReportInputs) -> list[Section]:
    summary, history, eval_history, diagnosis = (
        inputs.summary,
        inputs.history,
        inputs.eval_history,
        inputs.diagnosis,
    )
    test_metrics, efficiency, worst, runs = inputs.test_metrics, inputs.efficiency, inputs.worst, inputs.runs
    findings = diagnosis.get("findings", [])
    triggered = [f for f in findings if f["triggered"]]
    eta = diagnosis.get("epoch_eta") or {}
    verdict = [f"{f['kind'].upper()}: {f['message'].rstrip('.')}. Advice: {f['advice']}" for f in triggered]
    checks = [check_line(f) for f in findings]
    eta_line = (
        f"One full epoch of the {eta.get('train_tokens'):,} training tokens takes about {eta['human']} "
        f"at the measured {eta.get('real_tokens_per_s'):,.0f} real tokens/s."
        if eta.get("human")
        else f"? epoch ETA: {eta['not_judged']}"
        if eta.get("not_judged")
        else ""
    )
    train_speed = efficiency["real_tokens_per_s"].iloc[0] if not efficiency.empty else float("nan")
    # the training rate over the timed steps' wall clock (validations and saves between steps in it), and
    # the steps' own rate where the run measured it: a run slowed by its validations is not read as slow steps
    steady = summary.get("steady_real_tokens_per_s")
    phases = [("training (wall clock: validations and saves included)", train_speed)]
    if _finite(steady):
        phases.append(("training steps alone", float(steady)))
    phases.append(("test evaluation", test_metrics.get("real_tokens_per_s")))
    speeds = pd.DataFrame(
        {"phase": [phase for phase, _ in phases], "real tokens/s": [speed for _, speed in phases]}
    )
    shown = {name: value for name, value in test_metrics.items() if name != TRAINING_ID}
    # a NaN figure was measured: "NaN", never the table's mark of a missing one
    evaluation = pd.DataFrame(
        {"metric": list(shown), "value": ["NaN" if _is_nan(value) else value for value in shown.values()]}
    )
    files = curve_files(inputs.paths)
    return [
        Section("Bottleneck diagnosis", text=eta_line, items=verdict + checks),
        Section(
            "Training summary",
            items=run_lines(summary, inputs.split_report),
            table=training_table(inputs.training),
        ),
        *_fold_sections(inputs.split_report),
        Section("Efficiency", table=_one_row(efficiency), text=_efficiency_scope(summary, efficiency)),
        Section(
            "Curves",
            figures={
                "loss": plots.loss_figure(
                    history, eval_history, label_smoothing=summary.get("label_smoothing")
                ),
                "throughput": plots.throughput_figure(history),
                "learning rate": plots.learning_rate_figure(history),
                "peak memory": plots.memory_figure(history),
            },
            figure_files=files,
            markdown_note=NOT_PLOTTED if any(file is None for file in files.values()) else "",
        ),
        Section(
            "Test split evaluation",
            table=evaluation,
            text="\n\n".join(part for part in (_evaluation_scope(test_metrics), _not_finite(shown)) if part),
        ),
        Section("Throughput: training and evaluation", table=speeds),
        Section(
            "Most frequent wrong predictions",
            text="Decoded tokens; ␣ is a space.",
            table=error_pairs_table(inputs.error_pairs),
        ),
        Section(
            "Worst samples by loss",
            table=worst,
            text="anomaly_score: the share of a sample's next tokens outside the model's top k (on log-key "
            "data, the next-key anomaly check)."
            if worst is not None and "anomaly_score" in worst
            else "",
        ),
        Section("Sample generations", table=inputs.generations),
        *_rouge_sections(test_metrics, inputs.predictions),
        Section(
            "Run comparison",
            text="Training runs of this MLflow experiment (◀: the run of this report); only "
            "parameters whose values differ among the runs that have them. final_train_loss is each "
            "run's last step's (label-smoothed where label_smoothing is above 0), final_val_loss its model's "
            "step's (model_step, early stopping's best, where it is not last_step); last_step where a run "
            "stopped before its planned steps (train.max_minutes, early stopping); validation and test "
            "losses are plain." + (" " + data_note(runs) if data_note(runs) else ""),
            table=runs.fillna({"this run": ""}) if "this run" in runs else runs,
        ),
        *_sweep_sections(inputs.sweep, data=inputs.summary.get("fingerprint")),
        *_profile_sections(summary.get("profile") or {}),
    ]


ROUGE_SHOWN = 10  # samples shown in the report (all of them are in reference_predictions.csv)
PROMPT_SHOWN = 160  # characters of a prompt shown (its end: where the response starts)


def _rouge_sections(test_metrics: dict, predictions: pd.DataFrame | None) -> list[Section]:
    """ROUGE against the references (prompt/response data only): precision/recall/F1 and a few samples."""
    if predictions is None or predictions.empty or "rouge1" not in test_metrics:
        return []
    scores = pd.DataFrame(
        {
            "ROUGE": ["ROUGE-1", "ROUGE-2", "ROUGE-L"],
            "precision": [test_metrics[f"{r}_precision"] for r in ("rouge1", "rouge2", "rougeL")],
            "recall": [test_metrics[f"{r}_recall"] for r in ("rouge1", "rouge2", "rougeL")],
            "F1": [test_metrics[r] for r in ("rouge1", "rouge2", "rougeL")],
        }
    )
    total = test_metrics.get("rouge_test_samples")
    scored = (
        f"{test_metrics['rouge_samples']:,} of the {total:,} test samples (report.references.max_samples: "
        "hash-selected, the same for every run on this data)"
        if isinstance(total, Number) and total > test_metrics["rouge_samples"]
        else f"{test_metrics['rouge_samples']:,} test samples"
    )
    text = (
        f"{scored} generated ({test_metrics['rouge_decoding']}) and "
        f"scored against their reference responses with rouge-score, tokenizer "
        f"'{test_metrics['rouge_tokenizer']}'; means over samples. "
        f"{test_metrics['generated_tokens_per_s']:,.0f} generated tokens/s." + _tool_call_text(test_metrics)
    )
    tokenless = tokenless_note(test_metrics)  # references that score 0 whatever was generated
    if tokenless:
        text += " " + tokenless
    rules = test_metrics.get("rouge_model_token_rules")
    if rules:  # the model folder's forced and banned tokens, kept at generation
        text += (
            " The model's own token rules were kept: " + ", ".join(f"{k}={v}" for k, v in rules.items()) + "."
        )

    shown = predictions.head(ROUGE_SHOWN)
    samples = pd.DataFrame(
        {
            "prompt (end)": [_tail(prompt, PROMPT_SHOWN) for prompt in shown["prompt"].astype(str)],
            "reference": shown["reference"],
            "prediction": shown["prediction"].fillna(""),
            "ROUGE-1": shown["rouge1_f1"],
            "ROUGE-L": shown["rougeL_f1"],
            **({"call": shown["call_match"].fillna("")} if "call_match" in shown else {}),
        }
    )
    return [
        Section("ROUGE on the test split", text=text, table=scores),
        Section(
            "Generations against references",
            text=f"The first {len(shown)} of {len(predictions):,} (all in reference_predictions.csv).",
            table=samples,
        ),
    ]


def _tool_call_text(test_metrics: dict) -> str:
    """The test answers' tool calls, compared with the references' (``references.tool_call_scores``)."""
    if "tool_call_samples" not in test_metrics:
        return ""
    samples = test_metrics["tool_call_samples"]
    text = test_metrics["rouge_samples"] - samples
    spurious = (
        f" {100 * test_metrics['tool_call_spurious']:.1f}% of the {text:,} answered in text were "
        "predicted as calls."
        if text
        else ""
    )
    unread, cut = test_metrics.get("tool_call_unread", 0), test_metrics.get("tool_call_unread_at_limit", 0)
    unread_text = (
        f" {unread:,} of them do not read as calls (call_match unread), counted as misses"
        + (
            f"; {cut:,} stopped at report.references.max_new_tokens before their call ended: raise it "
            "to score whole calls."
            if cut
            else "."
        )
        if unread
        else ""
    )
    return (
        f" {samples:,} of them answer with a tool call: the same functions in "
        f"{100 * test_metrics['tool_call_name_accuracy']:.1f}%, the same calls in "
        f"{100 * test_metrics['tool_call_exact_match']:.1f}% (arguments compared as JSON; the call column "
        "below)." + unread_text + spurious
    )


def _sweep_sections(sweep: dict | None, *, data: str | None) -> list[Section]:
    """The last sweep (``kedro run --pipeline=sweep``): its verdict, comparison table and all-runs loss
    plot; said to have run on other data where its record and the model's (``data``) differ."""
    if not sweep:
        return []
    text = f"{sweep['verdict']}\n\nOne row per run of the sweep, best first ({sweep['source']})."
    if sweep.get("data") and data and sweep["data"] != data:
        text = (
            "This sweep ran on other data than the model of this report (the data was split "
            "again since): its losses are not comparable with the figures above. Run the sweep again "
            "(kedro run --pipeline=sweep) to compare on this data.\n\n" + text
        )
    heading = f"Sweep {sweep['name']}".strip()
    sections = [
        Section(
            heading,
            text=text,
            table=sweep["table"],
            figures={"sweep loss": sweep["plot"]} if sweep.get("plot") else {},
            figure_files={"sweep loss": "plots/sweep_loss.png"},
        )
    ]
    folds = sweep.get("folds")
    spread = None if folds is None else folds[~folds["row"].isin(["fold", "run"])]
    if spread is not None and len(spread):
        shown = spread.drop(columns=[c for c in ("run", "run_id", "fold", "status", "error") if c in spread])
        sections.append(
            Section(
                f"{heading}: mean and spread over folds",
                text="Per setting: the folds counted, the mean, the sample standard deviation (n - 1), the "
                "minimum and the maximum of each metric over its folds (sweep_folds.csv).",
                table=shown.dropna(axis=1, how="all").reset_index(drop=True),
            )
        )
    return sections


def _fold_sections(split_report: dict | None) -> list[Section]:
    """Each fold's rows, tokens, mean and p90 length and the largest / smallest fold (``split_report``'s
    ``folds``: ``fastlm.corpus.statistics.fold_summary``), for data split with ``split.folds``; none
    without folds."""
    folds = (split_report or {}).get("folds")
    per_fold = folds.get("per_fold") if isinstance(folds, dict) else None
    if not per_fold:
        return []
    table = pd.DataFrame(
        {
            label: [fold.get(key) if isinstance(fold, dict) else None for fold in per_fold]
            for label, key in (
                ("fold", "fold"),
                ("rows", "rows"),
                ("tokens", "tokens"),
                ("mean length", "mean_length"),
                ("p90 length", "p90_length"),
            )
        }
    )
    ratios = [
        f"{folds[key]:g} by {what}" if _finite(folds.get(key)) else f"none by {what} (a fold is empty)"
        for key, what in (("largest_smallest_rows", "rows"), ("largest_smallest_tokens", "tokens"))
    ]
    text = (
        f"split.folds = {folds.get('count', len(per_fold))}: the train + validation rows in fold buckets "
        "(tokens with EOS, no padding; split_report.json: folds). A run with train.fold i validates on fold "
        "i and trains on the others; the test split is in no fold. Largest / smallest fold: "
        f"{', '.join(ratios)}."
    )
    return [Section("Folds of train + validation", text=text, table=table)]


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def _profile_sections(profile: dict) -> list[Section]:
    """Top operators and time per phase of the profiled steps (train.profile.enabled), if any."""
    if not profile.get("recorded"):
        return [
            Section(
                "Profile",
                text="No profile recorded: set train.profile.enabled: true to record a few "
                "steps with torch.profiler.",
            )
        ]
    shares = pd.DataFrame(
        {"phase": list(profile["phase_share"]), "share of the window": list(profile["phase_share"].values())}
    )
    text = (
        f"Steps {profile['steps']} ({profile['window_ms']:,.0f} ms). Trace: {profile['trace']} "
        "(open it in Perfetto or TensorBoard's profiler)."
    )
    return [
        Section("Profile: time per phase", text=text, table=shares),
        *_gpu_idle_sections(profile.get("gpu_idle")),
        Section("Profile: top operators by self time", table=pd.DataFrame(profile["top_operators"])),
    ]


def _gpu_idle_sections(idle: dict | None) -> list[Section]:
    """Where the GPU waited in the profiled steps (engine/observe/gpu_idle.py), on a GPU run."""
    if not idle:
        return []
    text = (
        f"The GPU was idle {idle['idle_share']:.1%} of the window: "
        f"{idle['idle_ms_per_step']:.2f} ms per step, "
        f"{idle['host_bound_ms_per_step']:.2f} ms of it waiting for the host to launch work "
        f"({idle['after_sync_ms_per_step']:.2f} ms after host syncs) and {idle['queued_ms_per_step']:.2f} ms "
        "queued. Waiting for the host shrinks with fewer, larger kernels (compile, fused kernels) and no "
        "syncs. Below: the host-bound idle time before the kernels of each launching operator."
    )
    rows = [
        {"where": f"phase: {name}", "ms per step": ms, "gaps": None}
        for name, ms in idle["host_bound_by_phase_ms_per_step"].items()
    ]
    rows += [
        {"where": row["where"], "ms per step": row["ms_per_step"], "gaps": row["gaps"]}
        for row in idle["host_bound_top_launchers"]
    ]
    rows += [
        {"where": f"after a sync in {row['where']}", "ms per step": row["ms_per_step"], "gaps": row["gaps"]}
        for row in idle["host_bound_top_syncs"]
    ]
    return [Section("Profile: where the GPU waited", text=text, table=pd.DataFrame(rows))]


def build_document(inputs: ReportInputs) -> tuple[str, str]:
    summary = inputs.summary
    title = (
        f"fastlm training report: {summary['run_name']}"
        if summary.get("run_name")
        else "fastlm training report"
    )
    runtime = summary.get("runtime") or {}  # null (a record cut short): the device is unknown, as without it
    subtitle = (
        f"{summary.get('steps', '?')} steps, {summary.get('batching', '?')} batching, "
        f"{summary.get('parameters', 0):,} parameters{' (LoRA)' if summary.get('lora') else ''}, "
        f"on {runtime.get('device_name', '?')}"
    )
    sections = build_sections(inputs)
    return render_html(title=title, subtitle=subtitle, sections=sections), render_markdown(
        title=title, subtitle=subtitle, sections=sections
    )


def _count(value) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"
