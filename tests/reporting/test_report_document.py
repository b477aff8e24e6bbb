"""report_document: what the report's training summary says in words."""

import re

from fastlm.reporting.report_document import run_lines
from tests.support.reporting import SUMMARY


def test_a_label_smoothed_run_says_which_losses_are_smoothed():
    lines = run_lines({**SUMMARY, "label_smoothing": 0.1}, None)
    said = next(line for line in lines if line.startswith("Loss:"))
    assert "label-smoothed (0.1" in said and "validation and test losses" in said and "plain" in said
    assert not any(line.startswith("Loss:") for line in run_lines({**SUMMARY, "label_smoothing": 0.0}, None))


def test_a_neftune_run_says_its_noise_was_in_training_only():
    lines = run_lines({**SUMMARY, "neftune_noise_alpha": 5.0}, None)
    said = next(line for line in lines if "NEFTune" in line)
    assert "alpha 5," in said and "evaluation and the model written are without it" in said
    assert not any("NEFTune" in line for line in run_lines({**SUMMARY, "neftune_noise_alpha": 0.0}, None))


def test_an_early_stopped_run_names_the_step_its_model_is_from():
    early = {
        "best_step": 40,
        "best_val_loss": 2.5,
        "model_from_step": 40,
        "patience": 3,
        "best_checkpoint": "data/06_models/checkpoints/run/checkpoint-00000040",
    }
    lines = run_lines({**SUMMARY, "steps": 70, "stopped_by": "early stopping", "early_stopping": early}, None)
    said = next(line for line in lines if line.startswith("Early stopping"))
    assert "stopped early at step 70" in said and "step 40's" in said and "2.5000" in said
    assert "checkpoint-00000040" in said


def test_a_gpu_profile_says_where_the_gpu_waited():
    from fastlm.engine.observe.gpu_idle import idle_breakdown
    from fastlm.engine.observe.profiling import PHASES
    from tests.support.reporting import make_history, report_document
    from tests.support.traces import hand_built_trace

    profile = {
        "recorded": True,
        "steps": "6-7",
        "trace": "steps_6-7.pt.trace.json",
        "window_ms": 0.23,
        "phase_share": {"data": 0.0, "forward": 0.4, "backward": 0.4, "optimizer": 0.1},
        "gpu_idle": idle_breakdown(hand_built_trace(), steps=2, phases=PHASES),
        "top_operators": [{"operator": "aten::mm", "calls": 2, "self_cpu_ms": 0.01, "self_cuda_ms": 0.1}],
    }
    _, markdown = report_document(make_history(3), summary={**SUMMARY, "profile": profile})
    said = markdown[markdown.index("Profile: where the GPU waited") :]
    assert "idle 41.7% of the window" in said and "0.05 ms of it waiting for the host" in said
    assert "phase: backward" in said and "after a sync in aten::item &gt; aten::_local_scalar_dense" in said
    _, cpu = report_document(make_history(3), summary={**SUMMARY, "profile": {**profile, "gpu_idle": None}})
    assert "Profile: time per phase" in cpu and "where the GPU waited" not in cpu


def test_a_run_stopped_by_its_time_budget_says_so_and_how_far_it_got():
    """``train.max_minutes`` stopped it at step 19 of 300: the report says the time budget stopped it, not
    that it "ran to its last step" (with early stopping on, the early-stopping line said that)."""
    early = {"best_step": 15, "best_val_loss": 2.5, "model_from_step": 15, "patience": 50}
    summary = {
        **SUMMARY,
        "steps": 19,
        "planned_steps": 300,
        "stopped_by": "time budget",
        "early_stopping": early,
    }
    lines = run_lines(summary, None)
    said = next(line for line in lines if line.startswith("Stopped:"))
    assert "time budget" in said and "train.max_minutes" in said and "step 19 of 300" in said
    assert not any("ran to its last step" in line for line in lines)
    assert "stopped by its time budget at step 19" in next(line for line in lines if line.startswith("Early"))
    assert not any(line.startswith("Stopped:") for line in run_lines({**SUMMARY, "steps": 300}, None))


def test_the_markdown_reports_figures_point_at_the_plot_files_the_pipeline_writes():
    """report.md's images are the report pipeline's plot outputs, at their catalog paths relative to
    report.md (they pointed at loss.png, learning-rate.png, ... beside it, files nobody writes)."""
    import re
    from pathlib import Path

    import yaml

    from fastlm.pipelines.report import create_pipeline
    from tests.support.project import PROJECT_ROOT
    from tests.support.reporting import make_history, report_document

    catalog = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text())
    folder = Path(catalog["report_markdown"]["filepath"]).parent
    pattern = catalog["{name}_plot"]["filepath"]
    written = {
        str(Path(pattern.format(name=output.removesuffix("_plot"))).relative_to(folder))
        for output in create_pipeline().all_outputs()
        if output.endswith("_plot") and output != "sweep_loss_plot"
    }
    _, markdown = report_document(make_history(3))
    assert set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)) == written


CHAT_FORMAT = {
    "kind": "messages",
    "messages_column": "messages",
    "train_turns": "all",
    "chat_template_kwargs": {"enable_thinking": False},
    "prompt_template": "{prompt}\n\n### Response:\n",
}


def test_the_training_summary_says_the_chat_format_the_model_trained_on():
    system = "You are a helpful assistant who answers in short, plain sentences and never in lists, always."
    report = {"data_format": CHAT_FORMAT, "system_prompt": system}
    said = [line for line in run_lines(SUMMARY, report) if line.startswith("Chats")]
    assert len(said) == 1, run_lines(SUMMARY, report)
    line = said[0]
    assert "split.messages_column 'messages'" in line and "every assistant answer trained" in line
    assert "split.train_turns: all" in line and "{'enable_thinking': False}" in line
    assert system[:60] in line and system not in line and "…" in line  # cut to about 80 characters
    assert "predict and the report's samples ask after it" in line
    last = {"data_format": {**CHAT_FORMAT, "train_turns": "last", "chat_template_kwargs": None}}
    line = next(line for line in run_lines(SUMMARY, last) if line.startswith("Chats"))
    assert "only each chat's last answer trained (split.train_turns: last)" in line
    assert "system turn" not in line and "chat_template_kwargs" not in line


def test_the_training_summary_of_an_encoder_decoder_on_chats_says_it_trained_each_last_answer():
    """An encoder-decoder model (BART, KoBART, T5) reads a chat's earlier answers as encoder input and trains
    its last answer alone, as training warns. Was: 'every assistant answer trained (split.train_turns: all)',
    the split's setting, in the report of a model that trained none of them."""
    report = {"data_format": CHAT_FORMAT}
    line = next(line for line in run_lines({**SUMMARY, "encoder_decoder": True}, report) if "Chats" in line)
    assert "only each chat's last answer trained" in line and "every assistant answer" not in line
    assert "encoder-decoder" in line and "earlier answers are its encoder's input" in line
    assert "split.train_turns: all" in line
    line = next(line for line in run_lines({**SUMMARY, "encoder_decoder": False}, report) if "Chats" in line)
    assert "every assistant answer trained (split.train_turns: all)" in line  # a decoder-only model's


def test_the_training_summary_says_prompt_response_data_trains_the_response_only():
    report = {
        "data_format": {
            "kind": "prompt_response",
            "prompt_column": "dialogue",
            "response_column": "summary",
            "prompt_template": "{prompt}\n\n### Response:\n",
        }
    }
    line = next(line for line in run_lines(SUMMARY, report) if line.startswith("Prompt/response"))
    assert "split.prompt_column 'dialogue'" in line and "split.response_column 'summary'" in line
    assert "only the response and its EOS trained" in line
    assert "prompt template '{prompt}\\n\\n### Response:\\n'" in line


def test_text_data_gets_no_data_format_line():
    lines = run_lines(SUMMARY, {"splits": {"train": {"rows": 3}}, "raw_rows": 3, "dropped": {}})
    assert not any(line.startswith(("Chats", "Prompt/response")) for line in lines)
    assert not any(line.startswith(("Chats", "Prompt/response")) for line in run_lines(SUMMARY, None))


def test_the_steady_speed_over_the_steps_alone_is_shown_beside_the_wall_clock_one():
    summary = {
        **SUMMARY,
        "real_tokens_per_s": 1000.0,
        "steady_real_tokens_per_s": 1250.5,
        "outside_steps_s": 12.3,
    }
    line = next(line for line in run_lines(summary, None) if line.startswith("Speed"))
    assert "1,000 real tokens/s" in line and "steady real tokens/s (steps only): 1,250" in line
    assert "12.3 s" in line and "evaluations and saves" in line
    assert not any(
        line.startswith("Speed") for line in run_lines({**SUMMARY, "real_tokens_per_s": 1.0}, None)
    )


def test_a_resumed_run_says_its_steady_speed_is_over_the_steps_this_process_trained():
    """A run resumed near its end (Ctrl-C at step 19 of 20, then the same command): the steady figure and the
    step-time percentiles are over the steps the resuming process trained, its first step kept where it is
    the only one (``StepMetrics.step_figures``). Was: "the first step, evaluations and saves left out", read
    as the whole run's figure (26,106 tok/s beside 925 over the run's windows, from the one step 20)."""
    base = {
        **SUMMARY,
        "real_tokens_per_s": 925.0,
        "steady_real_tokens_per_s": 26106.0,
        "outside_steps_s": 0.1,
    }
    resumed = {**base, "steps": 20, "steps_trained": 1, "resumed_from_step": 19}
    line = next(line for line in run_lines(resumed, None) if line.startswith("Speed"))
    trained, start = resumed["steps_trained"], resumed["resumed_from_step"]
    assert f"over the {trained} step this process trained (resumed at step {start})" in line
    assert "the first step" not in line  # one step: kept, nothing left out
    longer = {**resumed, "steps_trained": 5, "resumed_from_step": 15}
    line = next(line for line in run_lines(longer, None) if line.startswith("Speed"))
    assert "over the 5 steps this process trained (resumed at step 15), its first step" in line
    fresh = next(line for line in run_lines({**base, "steps_trained": 20}, None) if line.startswith("Speed"))
    assert "this process" not in fresh and "the first step, evaluations and saves left out" in fresh


def test_a_resumed_runs_efficiency_table_says_its_step_figures_are_the_resuming_processs():
    """The efficiency table's step-time percentiles, data wait and padding come from the engine's per-step
    figures, which a resumed run measured over the steps its resuming process trained only: the table says
    so under it (and nothing on a run trained in one go)."""
    from tests.support.reporting import SUMMARY, make_history, report_document

    history = make_history(3, step=[1, 10, 20])
    resumed = {**SUMMARY, "steps": 20, "steps_trained": 5, "resumed_from_step": 15}
    _, markdown = report_document(history, summary=resumed)
    section = markdown.split("## Efficiency", 1)[1].split("\n## ", 1)[0]
    assert "over the 5 steps this process trained (resumed at step 15)" in section, section
    _, fresh = report_document(history, summary={**SUMMARY, "steps_trained": 20})
    assert "this process trained" not in fresh.split("## Efficiency", 1)[1].split("\n## ", 1)[0]


def test_the_training_summary_says_the_chats_called_tools_and_where_their_tools_came_from():
    """Chat data with tool calls (the split report's ``tool_use``): the chat line says how many chats call
    tools and the column their tools came from; chats without tool calls: no word of tools."""
    use = {"tools_column": "tools", "chats_with_tools": 20, "chats_calling_tools": 12}
    line = next(
        line
        for line in run_lines(SUMMARY, {"data_format": CHAT_FORMAT, "tool_use": use})
        if line.startswith("Chats")
    )
    assert f"{use['chats_calling_tools']} chats call tools" in line, line
    assert f"{use['chats_with_tools']} given their tools from split.tools_column 'tools'" in line, line
    plain = next(
        line for line in run_lines(SUMMARY, {"data_format": CHAT_FORMAT}) if line.startswith("Chats")
    )
    assert "tool" not in plain


def test_the_throughput_table_shows_the_steps_alone_beside_the_wall_clock_training_figure():
    """The training row of the throughput table is the rate over the timed steps' wall clock (validations
    and saves between steps included); a run whose summary measured the steps alone shows that rate too,
    labelled, so a run slowed by its validations is not read as slow steps."""
    from tests.support.reporting import make_history, report_document

    history = make_history(3, step=[1, 10, 20])
    _, markdown = report_document(history, summary={**SUMMARY, "steady_real_tokens_per_s": 4321.0})
    section = markdown.split("## Throughput: training and evaluation", 1)[1].split("\n## ", 1)[0]
    assert "training (wall clock: validations and saves included)" in section, section
    assert "| training steps alone" in section and "4,321 |" in section, section
    _, older = report_document(history, summary={k: v for k, v in SUMMARY.items() if "steady" not in k})
    assert "steps alone" not in older.split("## Throughput: training and evaluation", 1)[1].split("\n## ")[0]


def test_the_epoch_eta_of_a_run_too_short_to_time_is_said_not_judged():
    """A run of fewer than MIN_TIMED_STEPS timed steps gives no epoch ETA from its one or two timed steps: the
    diagnosis section says it was not judged; the same rows over a long run give the ETA line."""
    from fastlm.reporting.diagnosis import MIN_TIMED_STEPS, NOT_JUDGED, epoch_eta
    from tests.support.reporting import make_history, report_document

    summary = {**SUMMARY, "train_tokens": 4_000_000}

    def diagnosis_section(history):
        diagnosis = {"findings": [], "epoch_eta": epoch_eta(summary, history)}
        _, markdown = report_document(history, summary=summary, diagnosis=diagnosis)
        return markdown.split("## Bottleneck diagnosis", 1)[1].split("\n## ", 1)[0]

    short = diagnosis_section(make_history(3, step=list(range(1, 4))))
    assert f"? epoch ETA: {NOT_JUDGED}" in short and "One full epoch" not in short, short
    long = diagnosis_section(make_history(3, step=[1, 10, 10 + MIN_TIMED_STEPS]))
    assert "One full epoch of the 4,000,000 training tokens takes about" in long and NOT_JUDGED not in long


def test_a_capped_test_evaluation_says_how_many_of_the_test_samples_it_counted():
    """``report.eval_max_batches`` evaluates the first batches of the evaluation's fixed order: the Test split
    evaluation section says its figures cover that many of the split's samples (the table alone read as the
    whole split); an evaluation of every sample says nothing of the kind."""
    from tests.support.reporting import make_history, report_document

    history = make_history(3, step=[1, 10, 20])
    capped = {"loss": 3.0, "samples": 27, "test_split_samples": 83, "eval_max_batches": 1}
    _, markdown = report_document(history, test_metrics=capped)
    section = markdown.split("## Test split evaluation", 1)[1].split("\n## ", 1)[0]
    said = f"{capped['samples']} of the {capped['test_split_samples']} test samples"
    assert said in section and "report.eval_max_batches" in section, section
    whole = {**capped, "samples": capped["test_split_samples"]}
    _, markdown = report_document(history, test_metrics=whole)
    section = markdown.split("## Test split evaluation", 1)[1].split("\n## ", 1)[0]
    assert "of the" not in section.split("|", 1)[0], section


def test_the_reports_loss_curve_names_a_label_smoothed_train_loss():
    """The report's loss figure (and the plot file the report pipeline writes) labels the train loss as
    label-smoothed when it was: the validation loss beside it is the plain cross-entropy."""
    import pandas as pd

    from fastlm.pipelines.report.nodes import plot_training
    from fastlm.reporting.report_document import ReportInputs, build_sections
    from tests.support.reporting import make_history

    history = make_history(4)
    evals = pd.DataFrame({"step": [20, 40], "val_loss": [3.4, 3.2]})

    def legend(figure) -> list[str]:
        return [text.get_text() for text in figure.axes[0].get_legend().get_texts()]

    for smoothing, train in ((0.1, "train loss (label-smoothed 0.1)"), (0.0, "train loss")):
        summary = {**SUMMARY, "label_smoothing": smoothing}
        sections = build_sections(
            ReportInputs(
                summary=summary, history=history, eval_history=evals, training=pd.DataFrame(),
                efficiency=pd.DataFrame(), diagnosis={}, test_metrics={}, error_pairs=pd.DataFrame(),
                worst=pd.DataFrame(), generations=pd.DataFrame(), runs=pd.DataFrame(),
            )
        )  # fmt: skip
        curves = next(section for section in sections if section.heading == "Curves")
        assert legend(curves.figures["loss"]) == [train, "validation loss"]
        assert legend(plot_training(history, evals, summary)[0]) == [train, "validation loss"]


def test_the_training_table_names_each_losss_step_and_a_label_smoothed_train_loss():
    """The report's one-row training table put the last step's train loss (label-smoothed) beside the kept
    step's validation loss (early stopping) under bare names, as if of one model and one loss. Each loss is
    now named by its step, the model's pair first, and a smoothed train loss says so; the file keeps its
    columns and adds ``model_step``, ``model_train_loss``, ``last_val_loss`` and ``label_smoothing``."""
    import pandas as pd

    from fastlm.reporting.summaries import training_summary
    from tests.support.reporting import make_history, report_document

    early = {
        **SUMMARY,
        "steps": 70,
        "final_train_loss": 1.9,  # the last step's
        "model_train_loss": 2.1,  # the kept step's
        "final_val_loss": 2.5,  # the kept step's
        "final_val_perplexity": 12.18,
        "last_val_loss": 2.8,
        "label_smoothing": 0.1,
        "early_stopping": {"best_step": 40, "model_from_step": 40},
    }
    history = make_history(7)
    row = training_summary(early, history, pd.DataFrame()).iloc[0]
    assert (row["model_step"], row["model_train_loss"], row["final_val_loss"]) == (40, 2.1, 2.5)
    assert (row["final_train_loss"], row["last_val_loss"], row["label_smoothing"]) == (1.9, 2.8, 0.1)

    def table(summary) -> dict:
        training = training_summary(summary, history, pd.DataFrame())
        _, markdown = report_document(history, summary=summary, training=training)
        section = markdown.split("## Training summary", 1)[1].split("\n## ", 1)[0]
        cells = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
        return {name.strip(): value.strip() for name, value in cells[1:]}

    shown = table(early)
    assert shown["model_step"] == "40" and shown["steps"] == "70"
    assert shown["model_train_loss (the model's step, 40; label-smoothed 0.1)"] == "2.1"
    assert shown["final_val_loss (the model's step, 40)"] == "2.5"
    assert shown["final_val_perplexity (the model's step, 40)"] == "12.18"
    assert shown["final_train_loss (the last step, 70; label-smoothed 0.1)"] == "1.9"
    assert shown["last_val_loss (the last step, 70)"] == "2.8"
    assert not {"final_train_loss", "final_val_loss", "label_smoothing"} & set(shown)
    # the model is the last step's, without smoothing: one pair, named by its step
    plain = {**SUMMARY, "label_smoothing": 0.0, "model_train_loss": 3.0, "last_val_loss": 3.2}
    shown = table(plain)
    assert shown["final_train_loss (step 50)"] == "3" and shown["final_val_loss (step 50)"] == "3.2"
    assert not {"model_train_loss", "last_val_loss", "model_step"} & {name.split(" (")[0] for name in shown}


def test_the_training_summary_names_the_time_of_steps_that_ran_out_of_memory():
    lines = run_lines({"steps": 6, "oom_failed_s": 0.31}, None)
    assert any(line.startswith("Out of memory: 0.3 s went to step attempts") for line in lines)
    assert not any(
        line.startswith("Out of memory") for line in run_lines({"steps": 6, "oom_failed_s": 0.0}, None)
    )


def test_the_data_line_accounts_for_the_rows_split_max_samples_left_out():
    """`split.max_samples=2000` on the 24,000-row demo corpus: 599 rows dropped, 21,401 left out by the cap,
    2,000 split. The data line said the raw rows, the drops and the splits alone, so 21,401 rows went
    unaccounted for (23,401 cleaned rows seemed split into 2,000): it names the cap; its figures add up."""
    split_report = {
        "raw_rows": 24_000,
        "dropped": {
            "missing": 2,
            "non_string": 9,
            "empty": 40,
            "whitespace_only": 40,
            "duplicate": 508,
            "total": 599,
        },
        "capped_by_max_samples": 21_401,
        "kept_rows": 2_000,
        "splits": {"train": {"rows": 1_814}, "validation": {"rows": 103}, "test": {"rows": 83}},
    }
    line = next(line for line in run_lines(SUMMARY, split_report) if line.startswith("Data"))
    assert "left out by split.max_samples 21,401" in line, line
    assert "train 1,814, validation 103, test 83" in line and "duplicate 508" in line
    raw, *rest = (int(figure.replace(",", "")) for figure in re.findall(r"\d[\d,]*", line))
    assert raw == sum(rest) == 24_000, line
    uncapped = {**split_report, "capped_by_max_samples": 0}
    assert "max_samples" not in next(line for line in run_lines(SUMMARY, uncapped) if line.startswith("Data"))


def test_the_speed_line_breaks_down_the_time_outside_the_steps():
    """The run section's time breakdown: the validations' seconds (``eval_s``) among those outside the steps,
    and the compile seconds (``compile_s``) no step time holds. Was: only the seconds outside the steps."""
    summary = {
        **SUMMARY,
        "real_tokens_per_s": 900.0,
        "steady_real_tokens_per_s": 1000.0,
        "outside_steps_s": 3.2,
        "eval_s": 2.5,
        "compile_s": 41.4,
    }
    line = next(line for line in run_lines(summary, None) if line.startswith("Speed:"))
    assert "(3.2 s outside the steps, 2.5 s of them validation; 41.4 s compiling, in no step time)" in line, (
        line
    )
    plain = next(
        line for line in run_lines({**summary, "eval_s": 0.0, "compile_s": 0.0}, None) if "Speed" in line
    )
    assert plain.endswith("(3.2 s outside the steps)."), plain
    # under a second: two significant digits, never "0.0 s" for a validation that took 44 ms
    short = {**summary, "outside_steps_s": 0.31, "eval_s": 0.044, "compile_s": 0.0}
    quick = next(line for line in run_lines(short, None) if "Speed" in line)
    assert quick.endswith("(0.31 s outside the steps, 0.044 s of them validation)."), quick


def test_the_report_shows_each_folds_figures_from_the_split_report():
    """`split.folds=3`: split_report.json holds each fold's rows, tokens, mean and p90 length and the
    largest / smallest fold (``folds``), but the report showed none of it: a lopsided fold went unseen before
    k runs were spent on it. The report has a table of them, only for data split into folds."""
    import numpy as np

    from fastlm.corpus.statistics import fold_summary
    from tests.support.reporting import html_tables, make_history, report_document

    lengths, buckets = np.array([4, 6, 8, 10, 3, 5, 7]), np.array([0, 0, 1, 1, 2, -1, 0])
    folds = fold_summary(lengths, buckets, 3)
    split_report = {"splits": {"train": {"rows": 5}, "validation": {"rows": 1}, "test": {"rows": 1}}}
    history = make_history(2)
    document, markdown = report_document(history, split_report={**split_report, "folds": folds})
    rows = html_tables(document)["folds-of-train-validation"]
    assert [row["fold"] for row in rows] == ["0", "1", "2"]
    assert [row["rows"] for row in rows] == ["3", "2", "1"]
    assert [row["tokens"] for row in rows] == ["17", "18", "3"]
    assert [row["mean length"] for row in rows] == ["5.67", "9", "3"]
    assert [row["p90 length"] for row in rows] == ["6.8", "9.8", "3"]
    assert "Largest / smallest fold: 3 by rows, 6 by tokens." in document
    assert "## Folds of train + validation" in markdown
    plain, plain_markdown = report_document(history, split_report=split_report)
    assert "folds-of-train-validation" not in plain and "Folds of" not in plain_markdown


def test_a_test_metric_that_is_not_a_number_is_said_so_not_shown_as_missing():
    """A model whose test loss came out NaN (weights broken after the last logging step's health check, an
    overflow in evaluation) had a report whose evaluation table showed ``—`` for it, the mark of a figure not
    measured: the broken model read as an unmeasured one. The cell says NaN and the section says which
    figures are not finite; an infinite perplexity stays ∞."""
    import math

    from tests.support.reporting import html_tables, make_history, report_document

    metrics = {"loss": math.nan, "perplexity": math.inf, "accuracy": 0.5}
    document, markdown = report_document(make_history(2), test_metrics=metrics)
    values = {row["metric"]: row["value"] for row in html_tables(document)["test-split-evaluation"]}
    assert values == {"loss": "NaN", "perplexity": "∞", "accuracy": "0.5"}
    assert "Not finite: loss (NaN), perplexity (∞)" in document and "Not finite: loss" in markdown
    finite, _ = report_document(make_history(2), test_metrics={"loss": 3.0})
    assert "Not finite" not in finite


def test_a_summary_whose_runtime_is_null_is_reported_with_its_device_unknown():
    """A train summary holding ``"runtime": null`` (hand-edited, or a record cut short) passed the summary
    check (it has its step count) and the diagnosis read it as no runtime, but the report's title line read
    ``summary.get("runtime", {})``: an AttributeError traceback. The rest of the record is trusted as it
    is, so the report is written with the device said unknown, as for a record without the key; a runtime
    that is no object at all (a string) is a record of another shape: one line naming the file."""
    import pandas as pd
    import pytest

    from fastlm.errors import InputDataError
    from fastlm.pipelines.report.nodes import summarize_training, write_report
    from tests.support.reporting import make_history

    history, empty = make_history(6), pd.DataFrame()
    summary = {**SUMMARY, "runtime": None}
    training, efficiency, diagnosis = summarize_training(summary, history, empty)
    document, markdown = write_report(
        summary, history, empty, training, efficiency, diagnosis, {"loss": 3.0}, empty, empty, empty, empty,
        empty,
    )  # fmt: skip
    assert "50 steps, packed batching, 123,456 parameters, on ?" in markdown, markdown[:400]
    assert "on ?" in document
    paths = {"train_summary": "data/07_reporting/train_summary.json"}
    with pytest.raises(InputDataError) as refused:
        summarize_training({**SUMMARY, "runtime": "cpu"}, history, empty, paths)
    said = str(refused.value)
    assert said.startswith("data/07_reporting/train_summary.json holds runtime = 'cpu'"), said
    assert "Fix: rerun `kedro run --pipeline=train`" in said and "\n" not in said


def test_an_infinite_perplexity_of_a_finite_loss_is_said_to_be_the_losss_exponential_past_the_float_range():
    """A test loss above ~709.78 (a broken or diverged model, yet finite outputs) has exp(loss) past the float
    range: perplexity ∞. The section says that, not that the model's outputs are not finite numbers (which
    sent a user to look for NaN weights and to train in fp32). A NaN loss beside it keeps that reading."""
    import math

    from tests.support.reporting import make_history, report_document

    metrics = {"loss": 750.25, "perplexity": math.inf, "accuracy": 0.0}
    document, markdown = report_document(make_history(2), test_metrics=metrics)
    assert "perplexity (∞)" in markdown and "exp of the test loss 750.2" in markdown
    assert "float range" in markdown and "not finite numbers" not in markdown
    both, _ = report_document(make_history(2), test_metrics={**metrics, "loss": math.nan})
    assert "not finite numbers" in both
