"""What the report reads besides the model: the sample prompts of pre-tokenized data and the training summary,
refused in one line when they cannot mean what they say (in-process: the node or dataset doing the work)."""

import json

import pandas as pd
import pytest

from fastlm.corpus.fingerprint import data_format_params, make_fingerprint, selection_params
from fastlm.corpus.pretokenized import id_tokenizer
from fastlm.errors import ConfigError, InputDataError, find_user_error
from fastlm.parameters import parse_group
from fastlm.pipelines.report.nodes import evaluate_model, summarize_training
from fastlm.reporting.params import check_id_prompts

VOCAB = 64
SPLIT = {"pretokenized": True, "vocab_size": VOCAB, "max_length": 32}
TRAIN = {"runtime": {"device": "cpu", "precision": "fp32"}}


@pytest.mark.parametrize(
    ("prompt", "word"),
    [
        ("9 999", "'999'"),
        ("9 64", "'64'"),
        ("-1", "'-1'"),
        ("9 007", "'007'"),
        ("The battery", "'The'"),
    ],
    ids=["far_above", "vocab_size", "negative", "leading_zeros", "text"],
)
def test_pretokenized_report_prompts_with_unknown_ids_are_refused_before_evaluating(prompt, word):
    split = parse_group("split", SPLIT)
    tokenizer = id_tokenizer(VOCAB, eos_id=VOCAB - 1, pad_id=VOCAB - 1, model_max_length=32)
    assert tokenizer(prompt)["input_ids"][-1] == VOCAB - 1  # what it would silently be: EOS
    fingerprint = make_fingerprint(
        tokenizer, 32, data_format=data_format_params(split, tokenizer), selection=selection_params(split)
    )
    with pytest.raises(ConfigError) as raised:  # before the model or the test split is touched
        evaluate_model(
            {"model": None, "tokenizer": tokenizer},
            None,
            fingerprint,
            TRAIN,
            SPLIT,
            {"prompts": ["", "3 4", prompt]},
        )
    message = str(raised.value)
    assert f"report.prompts[2] = {prompt!r}" in message and word in message and f"0 .. {VOCAB - 1}" in message
    assert "\n" not in message and "Fix:" in message


def test_pretokenized_report_prompts_of_known_ids_pass():
    check_id_prompts(["", "0", "9 10", f"  {VOCAB - 1}\t3 "], VOCAB)


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ("{}", "an empty object"),
        ("null", "null"),
        ("[]", "a list"),
        ('{"run_name": "x"}', "without a step count"),
    ],
    ids=["empty_object", "null", "list", "no_steps"],
)
def test_a_train_summary_that_is_no_training_summary_is_refused(tmp_path, content, what):
    from fastlm.datasets import TrainSummaryDataset

    path = tmp_path / "train_summary.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(Exception) as raised:  # the catalog wraps a dataset's error in its own
        TrainSummaryDataset(filepath=str(path)).load()
    error = find_user_error(raised.value)
    assert isinstance(error, InputDataError), repr(raised.value)
    message = str(error)
    assert str(path) in message and what in message and "kedro run --pipeline=train" in message, message
    assert "\n" not in message
    history = pd.DataFrame({"step": [1], "loss": [2.0]})
    with pytest.raises(InputDataError, match="kedro run --pipeline=train"):
        summarize_training(json.loads(content), history, pd.DataFrame(), {"train_summary": str(path)})


def test_a_training_summary_loads(tmp_path):
    from fastlm.datasets import TrainSummaryDataset

    dataset = TrainSummaryDataset(filepath=str(tmp_path / "train_summary.json"))
    dataset.save({"run_name": "r", "steps": 3})
    assert dataset.load() == {"run_name": "r", "steps": 3}


def test_the_report_refuses_unknown_prompt_ids_before_any_node_runs(tmp_path):
    from kedro.io import DataCatalog, MemoryDataset

    from fastlm.hooks import ParametersValidHook
    from fastlm.pipelines import report, sweep

    sweep_file = tmp_path / "sweep.yml"
    sweep_file.write_text("name: s\ngrid: {train.seed: [0]}\n", encoding="utf-8")
    params = {
        "split": SPLIT,
        "train": TRAIN,
        "report": {"prompts": ["9 10", "9 999"]},
        "sweep": str(sweep_file),
    }

    def check(pipeline, **changed):
        values = {**params, **changed}
        catalog = DataCatalog({f"params:{name}": MemoryDataset(value) for name, value in values.items()})
        ParametersValidHook().before_pipeline_run({}, pipeline, catalog)

    with pytest.raises(ConfigError, match=r"report.prompts\[1\] = '9 999': '999' is not an id"):
        check(report.create_pipeline())
    check(report.create_pipeline(), split={"max_length": 32})  # text data: any prompt
    check(sweep.create_pipeline())  # generates nothing from report.prompts


def test_a_report_that_read_two_trainings_is_refused_before_it_logs_or_writes_anything():
    """Round six: a training that finished while a report ran (the report read run A's model first and run
    B's summary later), or ``kedro run --pipeline=report --nodes=write_report`` after another training:
    the report was titled B with A's test loss, logged onto B's MLflow run and filed under B. The model,
    its test metrics and the summary carry their training's id; a mix is refused in one line."""
    from fastlm.errors import StaleDataError
    from fastlm.pipelines.report.nodes import collect_test_metrics, write_report

    summary = {"steps": 3, "run_name": "B", "training_id": "b" * 32}
    with pytest.raises(StaleDataError, match="another training") as refused:
        collect_test_metrics({"loss": 1.0, "training_id": "a" * 32}, {}, summary)
    assert "kedro run --pipeline=report" in str(refused.value)
    with pytest.raises(StaleDataError, match="another training"):
        collect_test_metrics({"loss": 1.0}, {"rouge1": 0.5, "training_id": "a" * 32}, summary)
    with pytest.raises(StaleDataError, match="another training"):
        write_report(summary, *[None] * 5, {"loss": 1.0, "training_id": "a" * 32}, *[None] * 5)
    history = pd.DataFrame({"step": [1, 2, 3, 4]})
    with pytest.raises(StaleDataError, match="another training"):  # a history of 4 steps, a summary of 3
        summarize_training(summary, history, pd.DataFrame())


def test_report_prompts_are_cleaned_as_the_training_texts_were():
    """``report.prompts`` written in a params file saved on Windows (CRLF), decomposed or with a zero-width
    space: the training texts had LF line ends, NFC and no invisible marks (the split's cleaning), so the
    sample generations were asked text the model never saw (a CR token). Cleaned alike; not stripped, since a
    plain-text prompt's trailing space is part of what the model continues."""
    from fastlm.reporting.params import parse_report_params

    prompts = parse_report_params(
        {"prompts": ["배송\r\n언제", "a\rb", "e\u0301", "x\u200by", "The battery "]}
    ).prompts
    assert prompts == ["배송\n언제", "a\nb", "\u00e9", "xy", "The battery "]


def test_a_report_prompt_with_a_mark_between_decomposed_jamo_is_the_text_the_split_makes_of_it():
    """A zero-width space or word joiner between a decomposed (NFD) syllable's jamo: the split composes the
    text again once the mark is gone (한), the report's own copy of the rule did not, so the sample
    generation was asked jamo tokens the model never saw. One rule, the split's."""
    import unicodedata

    from fastlm.corpus.cleaning import clean_texts
    from fastlm.reporting.params import parse_report_params

    decomposed = unicodedata.normalize("NFD", "한국 배송")
    marked = [decomposed[:1] + "\u200b" + decomposed[1:], decomposed[:2] + "\u2060" + decomposed[2:]]
    prompts = parse_report_params({"prompts": marked}).prompts
    assert prompts == [clean_texts(pd.Series([text], dtype=object))[0][0] for text in marked]
    assert prompts == ["한국 배송", "한국 배송"]


def test_a_report_that_skipped_the_summaries_of_the_new_training_is_refused():
    """``kedro run --pipeline=report --nodes evaluate_model,generate_on_references,collect_test_metrics,
    write_report`` after another training: the test metrics were the new training's, but the training and
    efficiency tables, the diagnosis and the run comparison's mark were read from the files the earlier
    report wrote, and the report was titled with the new run's steps beside the old run's table."""
    from fastlm.errors import StaleDataError
    from fastlm.pipelines.report.nodes import write_report
    from fastlm.reporting.comparison import SPEED, compare_runs
    from fastlm.reporting.summaries import marked_run

    history = pd.DataFrame({"step": [1, 2, 3], "loss": [3.0, 2.5, 2.0], "step_time_s": [0.1, 0.1, 0.1]})
    old = {"steps": 3, "run_name": "A", "training_id": "a" * 32, "mlflow_run_id": "a1" * 16}
    new = {"steps": 3, "run_name": "B", "training_id": "b" * 32, "mlflow_run_id": "b1" * 16}
    training, efficiency, diagnosis = summarize_training(old, history, pd.DataFrame())
    assert diagnosis["training_id"] == old["training_id"]
    runs = pd.DataFrame(
        {
            "run_id": [old["mlflow_run_id"], new["mlflow_run_id"]],
            "run_name": ["A", "B"],
            "start_time": pd.to_datetime(["2026-01-01", "2026-01-02"]),
            SPEED: [100.0, 200.0],
        }
    )
    marked_old = compare_runs(runs, current_run_id=old["mlflow_run_id"])
    metrics = {"loss": 1.0, "training_id": new["training_id"]}
    with pytest.raises(StaleDataError, match="another training") as refused:
        write_report(new, history, None, training, efficiency, diagnosis, metrics, *[None] * 5)
    assert "summarize_training" in str(refused.value)
    _, _, fresh = summarize_training(new, history, pd.DataFrame())
    with pytest.raises(StaleDataError, match="another training") as refused:
        write_report(new, history, None, training, efficiency, fresh, metrics, *[None] * 4, marked_old)
    assert "run comparison" in str(refused.value)
    marked_new = compare_runs(runs, current_run_id=new["mlflow_run_id"])
    assert marked_run(marked_new, new) == new["training_id"] != marked_run(marked_old, new)


@pytest.mark.parametrize("run_id", ["0123456789abcdef" * 2, "1234e567" + "f" * 24])
def test_the_run_comparison_read_back_marks_this_run_whatever_its_run_id_looks_like(tmp_path, run_id):
    """The run comparison as the report reads it back (conf/base/catalog.yml's ``run_comparison``, a CSV): a
    run id whose shown first 8 characters read as a number (leading zeros, an exponent) stays its text, so
    the report's check finds this run marked (it was read as a number: another training, refused)."""
    from pathlib import Path

    import yaml
    from kedro.io import AbstractDataset

    from fastlm.reporting.comparison import SPEED, compare_runs
    from fastlm.reporting.summaries import marked_run

    catalog = Path(__file__).resolve().parents[2] / "conf/base/catalog.yml"
    config = yaml.safe_load(catalog.read_text())["run_comparison"]
    config["filepath"] = str(tmp_path / "runs.csv")
    dataset = AbstractDataset.from_config("run_comparison", config)
    summary = {"steps": 3, "training_id": "c" * 32, "mlflow_run_id": run_id}
    runs = pd.DataFrame(
        {"run_id": [run_id], "run_name": ["A"], "start_time": pd.to_datetime(["2026-01-01"]), SPEED: [1.0]}
    )
    written = compare_runs(runs, current_run_id=run_id)
    dataset.save(written)
    read = dataset.load()
    assert read["run_id"].tolist() == written["run_id"].tolist()
    assert marked_run(read, summary) == marked_run(written, summary) == summary["training_id"]


def test_a_report_slice_of_another_trainings_files_is_refused_before_any_node_runs(tmp_path):
    """The same slice refused before any node runs (``hooks.inputs.ReportOfOneTrainingHook``): it was
    refused at ``write_report``, its last node, after the slice's earlier nodes had rewritten their files
    and an MLflow run was opened. A slice that makes those files itself, or files of the same training,
    runs."""
    from kedro.io import DataCatalog, MemoryDataset
    from kedro.pipeline import Pipeline

    from fastlm.errors import StaleDataError
    from fastlm.hooks.inputs import ReportOfOneTrainingHook
    from fastlm.pipelines.report.pipeline import create_pipeline

    history = pd.DataFrame({"step": [1, 2, 3], "loss": [3.0, 2.5, 2.0], "step_time_s": [0.1, 0.1, 0.1]})
    old = {"steps": 3, "training_id": "a" * 32}
    new = {"steps": 3, "training_id": "b" * 32}
    _, _, diagnosis = summarize_training(old, history, pd.DataFrame())
    catalog = DataCatalog(
        {
            "train_summary": MemoryDataset(new),
            "bottleneck_diagnosis": MemoryDataset(diagnosis),
            "test_metrics": MemoryDataset({"loss": 1.0, "training_id": new["training_id"]}),
            "run_comparison": MemoryDataset(pd.DataFrame()),
        }
    )
    report = create_pipeline()
    nodes = ["evaluate_model", "generate_on_references", "collect_test_metrics", "write_report"]
    hook = ReportOfOneTrainingHook()
    with pytest.raises(StaleDataError, match="another training") as refused:
        hook.before_pipeline_run({}, report.filter(node_names=nodes), catalog)
    assert "summarize_training" in str(refused.value)
    hook.before_pipeline_run({}, report, catalog)  # the whole report makes them again
    hook.before_pipeline_run({}, report.filter(node_names=["plot_training"]), catalog)  # no report written
    catalog["bottleneck_diagnosis"] = MemoryDataset(summarize_training(new, history, pd.DataFrame())[2])
    hook.before_pipeline_run({}, report.filter(node_names=nodes), catalog)
    assert isinstance(report, Pipeline)


@pytest.mark.parametrize(
    "nodes",
    [None, ["write_report"], ["summarize_training", "write_report"]],
    ids=["whole_report", "write_report_alone", "without_plot_training"],
)
def test_report_md_links_only_the_plots_drawn_in_its_run(nodes, tmp_path, monkeypatch):
    """``kedro run --pipeline=report --nodes <a slice without plot_training>``: report.md linked the
    ``plots/*.png`` files left by an earlier report, another training's curves beside this one's tables,
    while report.html drew this training's. report.md links the plots of its run's ``plot_training`` (at their
    catalog paths) and, without it, none, saying so; report.html draws them either way."""
    import re
    from pathlib import Path

    import yaml
    from kedro.io import DataCatalog

    from fastlm.hooks import DatasetPathsHook
    from fastlm.pipelines.report.pipeline import create_pipeline
    from tests.support.project import PROJECT_ROOT
    from tests.support.reporting import SUMMARY, make_history

    monkeypatch.chdir(tmp_path)
    conf = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text(encoding="utf-8"))
    catalog = DataCatalog.from_config({name: entry for name, entry in conf.items() if name != "raw_corpus"})
    report = create_pipeline()
    run = report if nodes is None else report.filter(node_names=nodes)
    DatasetPathsHook().before_pipeline_run({}, run, catalog)
    history = make_history(6)
    summary = {**SUMMARY, "steps": int(history["step"].max()), "training_id": "c" * 32}
    training, efficiency, diagnosis = summarize_training(summary, history, pd.DataFrame())
    given = {
        "train_summary": summary,
        "train_history": history,
        "eval_history": pd.DataFrame(),
        "training_summary": training,
        "efficiency_summary": efficiency,
        "bottleneck_diagnosis": diagnosis,
        "test_metrics": {"loss": 1.0, "training_id": summary["training_id"]},
        "split_report": {},
        "sweep_results": None,
        "dataset_paths": catalog.load("dataset_paths") if "dataset_paths" in run.inputs() else None,
    }
    node = next(node for node in report.nodes if node.name == "write_report")
    written = node.run({name: given.get(name, pd.DataFrame()) for name in node.inputs})
    html, markdown = written["report_html"], written["report_markdown"]
    folder = Path(conf["report_markdown"]["filepath"]).parent
    drawn = {
        Path(conf["{name}_plot"]["filepath"].format(name=output.removesuffix("_plot"))).relative_to(folder)
        for output in run.all_outputs()
        if output.endswith("_plot")
    }
    assert {Path(link) for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)} == drawn, markdown
    assert bool(drawn) == ("plot_training" in {node.name for node in run.nodes})
    assert ("plot_training was not run" in markdown) != bool(drawn), markdown
    assert html.count("data:image/png;base64,") == 4


def test_a_report_named_after_another_training_is_refused_before_any_node_runs(tmp_path, monkeypatch):
    """``kedro run --pipeline=report --params run_name=alpha`` after alpha, then beta, trained: the report
    covered beta (the last training), filed under runs/beta, while its MLflow run was named alpha, beta's
    figures under alpha's name. Refused before any node runs when the name is another training's (its
    outputs kept under runs/<name>/); the last training's own name, or a name of no training, runs."""
    from kedro.io import DataCatalog, MemoryDataset

    from fastlm.errors import ConfigError
    from fastlm.hooks.inputs import ReportOfOneTrainingHook
    from fastlm.pipelines.report.pipeline import create_pipeline

    monkeypatch.chdir(tmp_path)
    for name in ("alpha", "beta"):
        (tmp_path / "data/08_reporting/runs" / name).mkdir(parents=True)
        (tmp_path / "data/08_reporting/runs" / name / "train_summary.json").write_text("{}")
    catalog = DataCatalog({"train_summary": MemoryDataset({"steps": 3, "run_name": "beta"})})
    hook, report = ReportOfOneTrainingHook(), create_pipeline()
    with pytest.raises(ConfigError) as refused:
        hook.before_pipeline_run({"runtime_params": {"run_name": "alpha"}}, report, catalog)
    said = str(refused.value)
    assert "\n" not in said and "run_name alpha" in said and "beta" in said, said
    assert "data/08_reporting/runs/alpha" in said, said
    for given in ("beta", "report-final", None):
        hook.before_pipeline_run({"runtime_params": {"run_name": given}}, report, catalog)


def test_a_report_named_after_an_interrupted_training_is_refused_before_any_node_runs(tmp_path, monkeypatch):
    """``kedro run --pipeline=report --params run_name=intr`` after the training intr was interrupted (its
    checkpoints kept, no summary): the report of the last finished training was filed in MLflow as a
    FINISHED run named intr, beside intr's KILLED training run, its test metrics under intr's name. Refused
    before any node runs, naming the interrupted training, its checkpoints (``train.checkpoint_dir``) and
    the command that finishes it."""
    from kedro.io import DataCatalog, MemoryDataset

    from fastlm.errors import ConfigError
    from fastlm.hooks.inputs import ReportOfOneTrainingHook
    from fastlm.pipelines.report.pipeline import create_pipeline

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt/intr/checkpoint-00000006").mkdir(parents=True)
    catalog = DataCatalog(
        {
            "train_summary": MemoryDataset({"steps": 3, "run_name": "main-1"}),
            "params:train": MemoryDataset({"checkpoint_dir": "ckpt"}),
        }
    )
    hook, report = ReportOfOneTrainingHook(), create_pipeline()
    with pytest.raises(ConfigError) as refused:
        hook.before_pipeline_run({"runtime_params": {"run_name": "intr"}}, report, catalog)
    said = str(refused.value)
    assert "\n" not in said and "run_name intr" in said and "interrupted" in said and "main-1" in said, said
    assert "ckpt/intr" in said and "kedro run --pipeline=train --params run_name=intr" in said, said
    for given in ("main-1", "report-final", None):
        hook.before_pipeline_run({"runtime_params": {"run_name": given}}, report, catalog)


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ({"references": {"seed": -1}}, "report.references.seed = -1"),
        ({"references": {"seed": 2**64}}, f"report.references.seed = {2**64}"),
        (
            {"decoding": [{"name": "greedy"}, {"name": "s", "do_sample": True, "seed": -1}]},
            "report.decoding.1.seed",
        ),
        ({"decoding": [{"name": "s", "do_sample": True, "seed": 2**64}]}, "report.decoding.0.seed"),
    ],
    ids=["references_negative", "references_past_64_bits", "decoding_negative", "decoding_past_64_bits"],
)
def test_report_seeds_out_of_range_are_refused_in_one_line(raw, name):
    """A seed of -1 was taken (torch reads it as 2**64 - 1: the draws of another seed) and one past 64 bits
    stopped the report at generation with a ValueError traceback from ``torch.manual_seed``. A seed is
    0 .. 2**63 - 1, as ``predict.seed`` is."""
    with pytest.raises(ConfigError) as raised:
        parse_group("report", raw)
    message = str(raised.value)
    assert name in message and "is invalid" in message and "\n" not in message, message


def test_report_seeds_in_range_pass():
    params = parse_group(
        "report",
        {"references": {"seed": 2**63 - 1}, "decoding": [{"name": "s", "do_sample": True, "seed": 0}]},
    )
    assert params.references.seed == 2**63 - 1 and params.decoding[0].seed == 0


def test_a_new_training_under_a_reported_name_drops_that_names_earlier_report_copies(tmp_path):
    """``data/08_reporting/runs/<run_name>/`` holds one training's outputs. A training under the name of a
    reported one (trained again from the start, or a resume past a report) writes its summary and histories
    there: the earlier training's report copies (report.html, report.md, test_metrics.json) are removed, not
    left beside the new summary as its report (the folder the refusal of a report of an earlier training
    names). Was: runs/pr1/report.md said 10 steps beside a train_summary.json of 4 steps, another training."""
    import os

    from kedro.io import DataCatalog
    from kedro.pipeline import Node, Pipeline
    from kedro_datasets.json import JSONDataset
    from kedro_datasets.text import TextDataset

    from fastlm.hooks.run_outputs import RunOutputsHook

    runs = tmp_path / "runs"
    keep = {"keep_per_run": str(runs)}
    catalog = DataCatalog(
        {
            "train_summary": JSONDataset(filepath=str(tmp_path / "train_summary.json"), metadata=keep),
            "test_metrics": JSONDataset(filepath=str(tmp_path / "test_metrics.json"), metadata=keep),
            "report_markdown": TextDataset(filepath=str(tmp_path / "report.md"), metadata=keep),
        }
    )
    earlier = runs / "pr1"
    earlier.mkdir(parents=True)
    for name, text in (("report.md", "10 steps"), ("test_metrics.json", "{}"), ("notes.txt", "mine")):
        (earlier / name).write_text(text, encoding="utf-8")
    train = Pipeline([Node(lambda: {"steps": 4}, None, "train_summary", name="train_model")])
    hook = RunOutputsHook()
    hook._catalog, hook._pid = catalog, os.getpid()
    hook._outputs, hook._trained = train.all_outputs(), "pr1"
    (tmp_path / "train_summary.json").write_text('{"run_name": "pr1", "steps": 4}', encoding="utf-8")
    hook.after_dataset_saved("train_summary", None, None)
    assert sorted(p.name for p in earlier.iterdir()) == ["notes.txt", "train_summary.json"]

    # a run that writes the report too (split, train and report in one) keeps what it writes
    (tmp_path / "report.md").write_text("4 steps", encoding="utf-8")
    hook._outputs = {"train_summary", "report_markdown"}
    hook.after_dataset_saved("report_markdown", None, None)
    hook.after_dataset_saved("train_summary", None, None)
    assert (earlier / "report.md").read_text(encoding="utf-8") == "4 steps"


def test_a_history_that_ends_before_the_summarys_last_step_is_refused_before_any_node_runs():
    """A train_history.csv that is not the summary's training's (it ends at step 1 of the summary's 4: cut
    short by a copy, or another training's) is refused before any node runs
    (``hooks.inputs.ReportOfOneTrainingHook``), the step it ends at named. Was: refused at
    summarize_training, after evaluate_model, generate_on_references and plot_training had rewritten
    error_pairs.csv, worst_samples.csv, sample_generations.csv, reference_predictions.csv and the plots (drawn
    from that history)."""
    from kedro.io import DataCatalog, MemoryDataset

    from fastlm.errors import StaleDataError
    from fastlm.hooks.inputs import ReportOfOneTrainingHook
    from fastlm.pipelines.report.pipeline import create_pipeline

    summary = {"steps": 4, "run_name": "pr1", "training_id": "a" * 32}
    cut = pd.DataFrame({"step": [1], "loss": [3.0], "step_time_s": [0.1]})
    catalog = DataCatalog({"train_summary": MemoryDataset(summary), "train_history": MemoryDataset(cut)})
    hook = ReportOfOneTrainingHook()
    with pytest.raises(StaleDataError) as refused:
        hook.before_pipeline_run({}, create_pipeline(), catalog)
    message = str(refused.value)
    assert "train_history" in message and "ends at step 1" in message and "(pr1, 4 steps)" in message
    assert "cut short" in message and "\n" not in message
    whole = pd.DataFrame({"step": [1, 4], "loss": [3.0, 2.0], "step_time_s": [0.1, 0.1]})
    catalog["train_history"] = MemoryDataset(whole)
    hook.before_pipeline_run({}, create_pipeline(), catalog)
    # a slice that does not read the history, or a run that trains (writes the summary), is not checked here
    catalog["train_history"] = MemoryDataset(cut)
    hook.before_pipeline_run({}, create_pipeline().filter(node_names=["evaluate_model"]), catalog)


def test_a_model_folder_of_another_training_than_the_summarys_is_refused_before_any_node_runs(tmp_path):
    """A training stopped between saving its model and its summary (the train node's outputs are saved one by
    one) leaves the new model beside the earlier training's summary and, at the same train.max_steps, a
    history of as many steps. The model folder's ``training_data.json`` names its training: refused before
    any node runs. Was: refused at collect_test_metrics, after evaluate_model and generate_on_references had
    rewritten their files from the other training's model."""
    from kedro.io import DataCatalog, MemoryDataset
    from kedro_datasets.json import JSONDataset

    from fastlm.errors import StaleDataError
    from fastlm.hooks.inputs import ReportOfOneTrainingHook
    from fastlm.pipelines.report.pipeline import create_pipeline

    model = tmp_path / "model"
    model.mkdir()
    (model / "training_data.json").write_text(json.dumps({"training_id": "b" * 32}), encoding="utf-8")
    summary = {"steps": 4, "run_name": "pr1", "training_id": "a" * 32}
    history = pd.DataFrame({"step": [1, 4], "loss": [3.0, 2.0], "step_time_s": [0.1, 0.1]})
    catalog = DataCatalog(
        {
            "train_summary": MemoryDataset(summary),
            "train_history": MemoryDataset(history),
            "trained_model": JSONDataset(filepath=str(model)),  # a local folder, as the model's dataset
        }
    )
    hook = ReportOfOneTrainingHook()
    with pytest.raises(StaleDataError, match="another training") as refused:
        hook.before_pipeline_run({}, create_pipeline(), catalog)
    assert "model" in str(refused.value) and "(pr1, 4 steps)" in str(refused.value)
    (model / "training_data.json").write_text(json.dumps({"training_id": "a" * 32}), encoding="utf-8")
    hook.before_pipeline_run({}, create_pipeline(), catalog)


def test_a_history_whose_steps_are_not_step_numbers_is_refused_in_one_line():
    """Two histories joined with ``cat`` (the second header a row of the first: step "step"), or a step cell
    edited into text: refused in one line naming the file, the row and the value, before any node runs and
    in summarize_training. Was: ValueError: invalid literal for int() with base 10, a traceback."""
    from kedro.io import DataCatalog, MemoryDataset

    from fastlm.hooks.inputs import ReportOfOneTrainingHook
    from fastlm.pipelines.report.pipeline import create_pipeline

    joined = pd.DataFrame(
        {"step": ["1", "4", "step", "1", "4"], "loss": ["3.0", "2.0", "loss", "3.1", "2.1"]}
    ).assign(step_time_s="0.1")
    summary = {"steps": 4, "run_name": "pr1"}
    with pytest.raises(InputDataError) as refused:
        summarize_training(summary, joined, pd.DataFrame(), {"train_history": "data/train_history.csv"})
    message = str(refused.value)
    assert "data/train_history.csv" in message and "'step'" in message and "row 3" in message
    assert "\n" not in message
    catalog = DataCatalog({"train_summary": MemoryDataset(summary), "train_history": MemoryDataset(joined)})
    with pytest.raises(InputDataError, match="not step numbers"):
        ReportOfOneTrainingHook().before_pipeline_run({}, create_pipeline(), catalog)


def test_a_history_whose_last_row_is_cut_is_refused_in_one_line():
    """A train_history.csv cut inside its last row (a copy stopped, a disk full): the row's step is there,
    its step time and other figures are not. Refused in one line naming the file and the row, before any
    node runs. Was: the report succeeded, that window silently left out of every rate."""
    from kedro.io import DataCatalog, MemoryDataset

    from fastlm.hooks.inputs import ReportOfOneTrainingHook
    from fastlm.pipelines.report.pipeline import create_pipeline

    cut = pd.DataFrame(
        {
            "step": [1, 2, 4],
            "loss": [3.0, 2.5, None],
            "step_time_s": [0.2, 0.1, None],
            "real_tokens_per_s": [100.0, 200.0, None],
        }
    )
    summary = {"steps": 4, "run_name": "pr1"}
    with pytest.raises(InputDataError) as refused:
        summarize_training(summary, cut, pd.DataFrame(), {"train_history": "data/train_history.csv"})
    message = str(refused.value)
    assert "data/train_history.csv" in message and "row 3" in message and "step 4" in message, message
    assert "\n" not in message
    catalog = DataCatalog({"train_summary": MemoryDataset(summary), "train_history": MemoryDataset(cut)})
    with pytest.raises(InputDataError, match="row 3"):
        ReportOfOneTrainingHook().before_pipeline_run({}, create_pipeline(), catalog)
    whole = cut.fillna({"loss": 2.0, "step_time_s": 0.1, "real_tokens_per_s": 210.0})
    summarize_training(summary, whole, pd.DataFrame(), {"train_history": "data/train_history.csv"})
