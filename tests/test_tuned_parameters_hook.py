"""``TunedParametersHook`` on the file the run's config loader reads (``--conf-source`` included) and on the
data the run's training reads (a run that splits first), without a KedroSession: the hook's calls in the
order Kedro makes them, on a catalog of the conf's parameters."""

import logging
import shutil
import tarfile
from types import SimpleNamespace

import pytest
import yaml

from tests.support.logs import module_log_lines
from tests.support.project import copy_project

TUNED = "conf/local/parameters_tuned.yml"


def _lines(monkeypatch) -> list[str]:
    import fastlm.hooks.conf as conf_hooks

    return module_log_lines(monkeypatch, conf_hooks)


def _run(conf_source, project, fingerprint=None):
    """The hook after Kedro made the context and the catalog of ``conf_source`` (the tuned file's entry as
    conf/base/catalog.yml has it, read from the project folder), and that catalog."""
    from kedro.config import OmegaConfigLoader
    from kedro.io import DataCatalog, MemoryDataset
    from kedro_datasets.yaml import YAMLDataset

    from fastlm.hooks import TunedParametersHook
    from fastlm.settings import CONFIG_LOADER_ARGS

    loader = OmegaConfigLoader(conf_source=str(conf_source), **CONFIG_LOADER_ARGS)
    params = loader["parameters"]
    catalog = DataCatalog(
        {
            "tuned_parameters": YAMLDataset(filepath=TUNED),
            "params:train": MemoryDataset(params["train"]),
            "params:split": MemoryDataset(params["split"]),
            "tokenized_corpus_fingerprint": MemoryDataset(fingerprint),
        }
    )
    hook = TunedParametersHook()
    hook.after_context_created(SimpleNamespace(config_loader=loader, project_path=project))
    hook.after_catalog_created(catalog)
    return hook, catalog


def _pipeline(*names: str, written: dict | None = None):
    """Stand-ins of the nodes ``names``: the split's writing ``written`` as the tokenized data's fingerprint,
    a train returning the ``params:train`` it was given, a tune."""
    from kedro.pipeline import Node, Pipeline

    nodes = {
        "tokenize_corpus": Node(lambda split: written, "params:split", "tokenized_corpus_fingerprint"),
        "train": Node(
            lambda train, data: train, ["params:train", "tokenized_corpus_fingerprint"], "trained_model"
        ),
        "tune": Node(lambda train: train, "params:train", "tuned_parameters", name="tune"),
    }
    return Pipeline([nodes[name] for name in names])


def _project(tmp_path, monkeypatch):
    project = copy_project(tmp_path / "project")
    other = tmp_path / "other_conf"
    shutil.copytree(project / "conf", other)
    monkeypatch.chdir(project)  # as ProjectFolderHook leaves a run: the catalog's paths are the project's
    base = yaml.safe_load((project / "conf/base/parameters_train.yml").read_text())["train"]["batching"]
    return project, other, base


def test_under_another_conf_source_the_hook_checks_the_tuned_file_that_conf_reads(tmp_path, monkeypatch):
    """``--conf-source other``: Kedro reads other/local/parameters_tuned.yml, not the project's
    conf/local one. A stale file there (no record: an older version's) is not applied and said by its path;
    the project's file, which this run does not read, is not named. (The hook checked the project's file
    alone: the other conf's stale settings trained silently.)"""
    lines = _lines(monkeypatch)
    project, other, base = _project(tmp_path, monkeypatch)
    stale = {"mode": "length_grouped", "micro_batch_size": base["micro_batch_size"] + 3}
    (other / "local/parameters_tuned.yml").write_text(yaml.safe_dump({"train": {"batching": stale}}))
    (project / TUNED).write_text(yaml.safe_dump({"train": {"batching": stale}}))
    hook, catalog = _run(other, project)
    assert catalog.load("params:train")["batching"]["micro_batch_size"] == stale["micro_batch_size"]  # read
    hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    batching = catalog.load("params:train")["batching"]
    assert (batching["micro_batch_size"], batching["mode"]) == (base["micro_batch_size"], base["mode"])
    warned = [line for line in lines if "not applied" in line]
    assert len(warned) == 1 and str(other / "local/parameters_tuned.yml") in warned[0], lines
    assert not any(TUNED in line.replace(str(other), "") for line in lines), lines


def test_a_tune_under_another_conf_source_writes_where_that_conf_is_read(tmp_path, monkeypatch):
    """A tune run with ``--conf-source other`` writes other/local/parameters_tuned.yml, which the next run
    with that conf source reads (it wrote the project's conf/local file, which such a run ignores); under
    the project's own conf the catalog's file is kept."""
    project, other, _ = _project(tmp_path, monkeypatch)
    _, catalog = _run(other, project)
    from fastlm.hooks.catalog import local_path

    assert (
        local_path(catalog, "tuned_parameters").resolve() == (other / "local/parameters_tuned.yml").resolve()
    )
    _, own = _run(project / "conf", project)
    assert local_path(own, "tuned_parameters").resolve() == (project / TUNED).resolve()


def test_a_packed_conf_source_is_said_not_to_read_what_the_tune_wrote(tmp_path, monkeypatch):
    """``--conf-source conf.tar.gz``: nothing is written into the archive; the tune writes the catalog's
    file and says in one line that runs with that conf source do not read it. A train run under it checks
    the tuned file packed in the archive (stale here: not applied, said)."""
    lines = _lines(monkeypatch)
    project, other, base = _project(tmp_path, monkeypatch)
    stale = {"micro_batch_size": base["micro_batch_size"] + 3}
    (other / "local/parameters_tuned.yml").write_text(yaml.safe_dump({"train": {"batching": stale}}))
    archive = tmp_path / "conf.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(other, arcname="conf")
    hook, catalog = _run(archive, project)
    from fastlm.hooks.catalog import local_path

    assert local_path(catalog, "tuned_parameters").resolve() == (project / TUNED).resolve()
    hook.before_pipeline_run({"env": None}, _pipeline("tune"), catalog)
    hook.after_pipeline_run({"env": None}, _pipeline("tune"), catalog)
    said = [line for line in lines if str(archive) in line]
    assert len(said) == 1 and TUNED in said[0] and "not read" in said[0], lines
    lines.clear()
    hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    assert catalog.load("params:train")["batching"]["micro_batch_size"] == base["micro_batch_size"]
    assert len([line for line in lines if "not applied" in line]) == 1, lines


def _hook_manager(hook):
    from kedro.framework.hooks import specs
    from kedro.framework.hooks.markers import HOOK_NAMESPACE
    from pluggy import PluginManager

    manager = PluginManager(HOOK_NAMESPACE)
    for spec in (specs.NodeSpecs, specs.PipelineSpecs, specs.DataCatalogSpecs, specs.DatasetSpecs):
        manager.add_hookspecs(spec)
    manager.register(hook)
    return manager


def test_a_run_that_splits_then_trains_checks_the_tuned_file_on_the_data_its_split_wrote(
    tmp_path, monkeypatch
):
    """``kedro run`` (split, train, report) on changed raw texts with the same split settings: the tuned file
    was measured on the tokenized data before this run's split, which rewrites it. The check compares it with
    the data the training reads: measured on other data, not applied and said; on the same data, applied.
    (The check ran before the split, on the old data's fingerprint: the old data's settings trained
    silently.)"""
    from kedro.io import MemoryDataset
    from kedro.runner import SequentialRunner

    from fastlm.corpus.fingerprint import data_identity
    from fastlm.parameters import GROUPS
    from fastlm.pipelines.tune.record import RECORD_KEY, device_description, measured_on

    lines = _lines(monkeypatch)
    project, _, base = _project(tmp_path, monkeypatch)
    old = {"fingerprint": "f" * 64, "data_sha256": "1" * 64}
    _, catalog = _run(project / "conf", project)
    train = GROUPS["train"].parse(catalog.load("params:train"))
    split = GROUPS["split"].parse(catalog.load("params:split"))
    record = measured_on(
        train,
        max_length=split.max_length,
        data=data_identity(old),
        device=device_description(train.runtime.device),
    )
    tuned = {"micro_batch_size": base["micro_batch_size"] + 3}
    (project / TUNED).write_text(yaml.safe_dump({"train": {"batching": tuned}, RECORD_KEY: record}))

    def trained_micro_batch(written: dict) -> int:
        lines.clear()
        hook, catalog = _run(project / "conf", project, fingerprint=old)
        catalog["trained_model"] = MemoryDataset()
        pipeline = _pipeline("tokenize_corpus", "train", written=written)
        hook.before_pipeline_run({"env": None}, pipeline, catalog)
        SequentialRunner().run(pipeline, catalog, hook_manager=_hook_manager(hook))
        return catalog.load("trained_model")["batching"]["micro_batch_size"]

    assert trained_micro_batch(old) == tuned["micro_batch_size"]
    assert sum("is in effect" in line for line in lines) == 1, lines
    assert trained_micro_batch({**old, "data_sha256": "2" * 64}) == base["micro_batch_size"]
    warned = [line for line in lines if "not applied" in line]
    assert len(warned) == 1 and "tokenized data" in warned[0], lines
    assert not any("is in effect" in line for line in lines), lines


def test_the_other_hooks_of_the_training_node_see_the_parameters_it_trains_with(tmp_path, monkeypatch):
    """``kedro run`` after a shard was added: the tuned file, measured on the old data, is not applied. The
    other hooks of the training node (MLflow's, which logs its parameters) get the ``params:train`` the node
    trains with, not the tuned file's. (They got the tuned micro-batch size: the run's MLflow record held it,
    and the next node's parameters, the trained ones, were refused as changed values, which turned tracking
    off and ended the run KILLED.)"""
    from kedro.framework.hooks import hook_impl
    from kedro.io import MemoryDataset
    from kedro.runner import SequentialRunner

    from fastlm.corpus.fingerprint import data_identity
    from fastlm.parameters import GROUPS
    from fastlm.pipelines.tune.record import RECORD_KEY, device_description, measured_on

    project, _, base = _project(tmp_path, monkeypatch)
    old = {"fingerprint": "f" * 64, "data_sha256": "1" * 64}
    hook, catalog = _run(project / "conf", project, fingerprint=old)
    train = GROUPS["train"].parse(catalog.load("params:train"))
    split = GROUPS["split"].parse(catalog.load("params:split"))
    device = device_description(train.runtime.device)
    record = measured_on(train, max_length=split.max_length, data=data_identity(old), device=device)
    tuned = {"micro_batch_size": base["micro_batch_size"] + 3}
    (project / TUNED).write_text(yaml.safe_dump({"train": {"batching": tuned}, RECORD_KEY: record}))
    hook, catalog = _run(project / "conf", project, fingerprint=old)
    catalog["trained_model"] = MemoryDataset()

    seen: list[int] = []

    class Logging:
        @hook_impl
        def before_node_run(self, node, inputs):
            if "params:train" in inputs:
                seen.append(inputs["params:train"]["batching"]["micro_batch_size"])

    pipeline = _pipeline("tokenize_corpus", "train", written={**old, "data_sha256": "2" * 64})
    manager = _hook_manager(hook)
    manager.register(Logging())
    hook.before_pipeline_run({"env": None}, pipeline, catalog)
    SequentialRunner().run(pipeline, catalog, hook_manager=manager)
    trained = catalog.load("trained_model")["batching"]["micro_batch_size"]
    assert trained != tuned["micro_batch_size"]
    assert seen == [trained], seen


def test_the_tuned_file_is_replaced_whole_or_not_at_all(tmp_path):
    """Every ``kedro run`` reads conf/local/parameters_tuned.yml at its start (the config loader): a tune
    stopped while writing it, or a run starting while it is written, must find the previous file or the new
    one, never a cut-off file that parses as fewer settings. A write that fails part way keeps the previous
    file as it was, and leaves no temporary file beside it."""
    from tests.support.project import catalog_dataset

    path = tmp_path / "conf" / "local" / "parameters_tuned.yml"
    dataset = catalog_dataset("tuned_parameters", path)
    kept = {"train": {"batching": {"micro_batch_size": 16, "mode": "packed"}}}
    dataset.save(kept)
    before = path.read_bytes()
    failing = {"train": {"batching": {"micro_batch_size": 8, "mode": (step for step in range(2))}}}
    try:
        dataset.save(failing)  # a generator has no YAML form: the write fails after the file was opened
    except Exception:  # noqa: BLE001 - whatever the writer raises, the file is what matters
        pass
    assert path.read_bytes() == before and yaml.safe_load(path.read_text(encoding="utf-8")) == kept
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def _project_and_record(tmp_path, monkeypatch) -> tuple:
    """A one-process project and the tune record (``tune_measured_on``) of its conf as it is."""
    from fastlm.parameters import GROUPS
    from fastlm.pipelines.tune.record import device_description, measured_on

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    project, _, _ = _project(tmp_path, monkeypatch)
    _, catalog = _run(project / "conf", project)
    train = GROUPS["train"].parse(catalog.load("params:train"))
    split = GROUPS["split"].parse(catalog.load("params:split"))
    device = device_description(train.runtime.device)
    return project, measured_on(train, max_length=split.max_length, data=None, device=device)


def _tuned_on_processes(
    tmp_path,
    monkeypatch,
    nproc: int,
    accumulation_record,
    change: dict | None = None,
    mode: str | None = None,
):
    """A current tuned file (micro-batch 4, accumulation 8, the batching ``mode`` where given, measured on
    this conf) with ``accumulation_record`` (its ``tune_accumulation``; None: none), and a train run's
    ``params:train`` on ``nproc`` processes, with the settings of ``change`` (``{group: {key: value}}``) over
    the conf's."""
    from fastlm.pipelines.tune.record import ACCUMULATION_KEY, RECORD_KEY

    project, record = _project_and_record(tmp_path, monkeypatch)
    batching = {"micro_batch_size": 4, "gradient_accumulation_steps": 8, **({"mode": mode} if mode else {})}
    tuned = {"train": {"batching": batching}, RECORD_KEY: record}
    if accumulation_record is not None:
        tuned[ACCUMULATION_KEY] = accumulation_record
    (project / TUNED).write_text(yaml.safe_dump(tuned))
    hook, catalog = _run(project / "conf", project)
    raw = catalog.load("params:train")
    raw = {**raw, "distributed": {**raw.get("distributed", {}), "nproc_per_node": nproc}}
    for group, values in (change or {}).items():
        raw[group] = {**raw.get(group, {}), **values}
    catalog["params:train"].save(raw)
    hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    return catalog.load("params:train")["batching"]


def test_a_train_run_on_more_processes_divides_the_tuned_accumulation_to_keep_the_target(
    tmp_path, monkeypatch
):
    """A tune for one process chose accumulation 8 for target 32 (micro-batch 4 samples); a train run with
    ``nproc_per_node: 2`` takes 4, so that micro-batch x accumulation x processes is still 32, and the line
    applying the file says so. (The tuned 8 applied on 2 processes: every optimizer step held 64 samples,
    twice the target, without a word.)"""
    from fastlm.pipelines.tune.record import accumulation_record

    lines = _lines(monkeypatch)
    batching = _tuned_on_processes(tmp_path, monkeypatch, 2, accumulation_record(1, 32, 4.0))
    assert (batching["micro_batch_size"], batching["gradient_accumulation_steps"]) == (4, 4)
    said = [line for line in lines if "is in effect" in line]
    assert len(said) == 1 and "-> 4 for 2 process(es)" in said[0] and "target 32" in said[0], lines
    assert "overrides it" not in said[0], said  # the file's own rescaling, not --params or another file
    assert not any("not applied" in line for line in lines), lines


@pytest.mark.parametrize("nproc", [1, 2])
def test_an_accumulation_the_tune_did_not_choose_is_the_runs_own(tmp_path, monkeypatch, nproc):
    """A tune without ``tune.target_effective_batch`` keeps ``train.batching.gradient_accumulation_steps``:
    it copies the conf's value (8 then) into its file. A train run after the conf's accumulation changed (1
    now in conf/base) trains with the conf's, and the line applying the file says so; the tuned micro-batch
    applies. (The file's copied 8 overrode the conf's new value: every optimizer step held 8 times the
    samples the conf asks for, said only as `gradient_accumulation_steps=8` in the applying line.)"""
    from fastlm.pipelines.tune.record import accumulation_record

    lines = _lines(monkeypatch)
    batching = _tuned_on_processes(tmp_path, monkeypatch, nproc, accumulation_record(1, None, 4.0))
    base = yaml.safe_load((tmp_path / "project/conf/base/parameters_train.yml").read_text())
    conf = base["train"]["batching"]["gradient_accumulation_steps"]
    assert conf != 8
    assert (batching["micro_batch_size"], batching["gradient_accumulation_steps"]) == (4, conf)
    said = [line for line in lines if "is in effect" in line]
    assert len(said) == 1 and f"gradient_accumulation_steps 8 -> {conf}" in said[0], lines
    assert "tune.target_effective_batch" in said[0], said
    assert not any("not applied" in line for line in lines), lines


@pytest.mark.parametrize(("nproc", "micro", "steps"), [(1, 2, 16), (1, 8, 4), (2, 2, 8)])
def test_a_micro_batch_given_over_the_tuned_one_keeps_the_tuned_target(
    tmp_path, monkeypatch, nproc, micro, steps
):
    """A tune for target 32 chose micro-batch 4 (4 samples) x accumulation 8; a train run given another
    micro-batch (``--params train.batching.micro_batch_size=2``, as after an out-of-memory) takes the
    accumulation that keeps the target for it (and its processes), said in the line applying the file.
    (The accumulation chosen for micro-batch 4 was kept: micro-batch 2 trained steps of half the target,
    said nowhere.)"""
    from fastlm.pipelines.tune.record import accumulation_record

    lines = _lines(monkeypatch)
    change = {"batching": {"micro_batch_size": micro}}
    batching = _tuned_on_processes(
        tmp_path, monkeypatch, nproc, accumulation_record(1, 32, 4.0), change=change
    )
    assert (batching["micro_batch_size"], batching["gradient_accumulation_steps"]) == (micro, steps)
    said = [line for line in lines if "is in effect" in line]
    assert len(said) == 1 and f"overrides it: micro_batch_size={micro}" in said[0], lines
    assert f"-> {steps} for micro-batch {micro}" in said[0] and "target 32" in said[0], said
    assert not any("not applied" in line for line in lines), lines


def test_a_batching_mode_given_over_the_tuned_one_keeps_the_target_or_says_it_cannot(tmp_path, monkeypatch):
    """A tune for target 64 chose packed micro-batches of 4 rows holding 16 samples; a train run given
    ``--params train.batching.mode=length_grouped`` (one sample a row) takes the accumulation that holds the
    target at 4 samples a micro-batch, said in the line applying the file. Given ``dynamic`` (micro-batches
    of a token budget, their samples unknown before the run), one warning names the accumulation to set.
    (The accumulation chosen for packed rows was kept: a length-grouped step held a quarter of the target,
    said nowhere.)"""
    from fastlm.pipelines.tune.record import accumulation_record

    lines = _lines(monkeypatch)
    change = {"batching": {"mode": "length_grouped"}}
    batching = _tuned_on_processes(
        tmp_path / "grouped", monkeypatch, 1, accumulation_record(1, 64, 16.0), change=change, mode="packed"
    )
    assert (batching["mode"], batching["gradient_accumulation_steps"]) == ("length_grouped", 16)
    said = [line for line in lines if "is in effect" in line]
    assert len(said) == 1 and "-> 16 for length_grouped micro-batch 4" in said[0], lines
    assert "target 64" in said[0] and "overrides it: mode=length_grouped" in said[0], said
    lines.clear()
    change = {"batching": {"mode": "dynamic"}}
    batching = _tuned_on_processes(
        tmp_path / "dynamic", monkeypatch, 1, accumulation_record(1, 64, 16.0), change=change, mode="packed"
    )
    assert (batching["mode"], batching["gradient_accumulation_steps"]) == ("dynamic", 8)
    warned = [line for line in lines if "is in effect" not in line]
    assert len(warned) == 1 and "not applied" not in warned[0], lines
    assert "train.batching.gradient_accumulation_steps" in warned[0] and "dynamic" in warned[0], warned
    assert "tune.modes" in warned[0], warned


def test_a_target_more_processes_cannot_keep_is_warned_in_one_line(tmp_path, monkeypatch):
    """Target 8 of micro-batches of 4 samples on 4 processes: one micro-batch per process already holds 16;
    the accumulation is 1 and one warning says the target cannot be kept."""
    from fastlm.pipelines.tune.record import accumulation_record

    lines = _lines(monkeypatch)
    batching = _tuned_on_processes(tmp_path, monkeypatch, 4, accumulation_record(1, 8, 4.0))
    assert batching["gradient_accumulation_steps"] == 1
    warned = [line for line in lines if "cannot be kept" in line]
    assert len(warned) == 1 and "~16 samples (target 8" in warned[0], lines


def test_a_tuned_file_without_its_process_count_is_not_applied_on_more_processes(tmp_path, monkeypatch):
    """A tuned file that does not record the process count its accumulation is for (an older version's: one
    process), on a 2-process run: not applied, said in one line; on one process, applied as before."""
    lines = _lines(monkeypatch)
    base = yaml.safe_load((copy_project(tmp_path / "base") / "conf/base/parameters_train.yml").read_text())
    batching = _tuned_on_processes(tmp_path / "two", monkeypatch, 2, None)
    assert batching["gradient_accumulation_steps"] == base["train"]["batching"]["gradient_accumulation_steps"]
    warned = [line for line in lines if "not applied" in line]
    assert len(warned) == 1 and "spans 2" in warned[0], lines
    lines.clear()
    assert _tuned_on_processes(tmp_path / "one", monkeypatch, 1, None)["gradient_accumulation_steps"] == 8
    assert not any("not applied" in line for line in lines), lines


def test_torchrun_ranks_other_than_0_apply_the_tuned_file_as_rank_0_does(monkeypatch):
    """Under torchrun every rank runs `kedro run`, each reading conf/local/parameters_tuned.yml through its
    config loader; the hook that sets it aside (settings measured on others) or rescales its accumulation (a
    tune for one process, a training of two) ran on rank 0 only: the other ranks trained on the file as
    written, another micro-batch or accumulation than rank 0's (a collective waiting for steps that never
    come, or an effective batch neither side asked for). The hook runs on every rank."""
    import importlib

    import fastlm.settings
    from fastlm.hooks import TunedParametersHook

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    factory, disabled = logging.getLogRecordFactory(), logging.root.manager.disable
    try:
        other_rank = importlib.reload(fastlm.settings).HOOKS
    finally:  # a rank other than 0 keeps its logs to warnings: the suite's logging as it was
        monkeypatch.undo()
        logging.setLogRecordFactory(factory)
        logging.disable(disabled)
        importlib.reload(fastlm.settings)
    assert any(type(hook).__name__ == "OtherRankOutputsHook" for hook in other_rank)  # a rank other than 0
    assert sum(isinstance(hook, TunedParametersHook) for hook in other_rank) == 1


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        (("distributed", "strategy"), "fsdp"),
        (("runtime", "float8"), "off"),
        (("runtime", "tf32"), False),
    ],
    ids=["fsdp2-shards", "float8-off", "tf32-off"],
)
def test_a_train_run_on_settings_that_change_memory_or_speed_sets_the_tuned_file_aside(
    tmp_path, monkeypatch, setting, value
):
    """A tune measured with this conf (DDP's replicated weights, float8 auto, TF32 matmuls); a train run of
    2 processes with FSDP2's sharded weights, gradients and AdamW state (another peak memory a process),
    float8 off or TF32 off (another speed, another fastest micro-batch): the tuned file is not applied, one
    line names the setting. (Its micro-batch was applied with `is in effect`.)"""
    from fastlm.pipelines.tune.record import accumulation_record

    lines = _lines(monkeypatch)
    group, key = setting
    change = {group: {key: value}}
    batching = _tuned_on_processes(tmp_path, monkeypatch, 2, accumulation_record(1, 32, 4.0), change=change)
    base = yaml.safe_load((tmp_path / "project/conf/base/parameters_train.yml").read_text())
    assert batching["micro_batch_size"] == base["train"]["batching"]["micro_batch_size"] != 4
    warned = [line for line in lines if "not applied" in line]
    assert len(warned) == 1 and f"train.{group}.{key}" in warned[0], lines
    assert not any("is in effect" in line for line in lines), lines


@pytest.mark.parametrize("bad", [0, "abc"])
def test_a_tuned_file_edited_by_hand_with_a_bad_value_is_one_line_naming_that_file(
    tmp_path, monkeypatch, bad
):
    """``micro_batch_size: 0`` (or a text) written into the tuned file by hand: one line naming the tuned
    file, the key and the fix. (It named conf/base/parameters_train.yml, which holds a valid value.)"""
    from fastlm.errors import ConfigError
    from fastlm.parameters import GROUPS
    from fastlm.pipelines.tune.record import RECORD_KEY, device_description, measured_on

    project, _, _ = _project(tmp_path, monkeypatch)
    _, catalog = _run(project / "conf", project)
    train = GROUPS["train"].parse(catalog.load("params:train"))
    split = GROUPS["split"].parse(catalog.load("params:split"))
    record = measured_on(
        train, max_length=split.max_length, data=None, device=device_description(train.runtime.device)
    )
    tuned = {"train": {"batching": {"micro_batch_size": bad}}, RECORD_KEY: record}
    (project / TUNED).write_text(yaml.safe_dump(tuned))
    hook, catalog = _run(project / "conf", project)
    with pytest.raises(ConfigError) as raised:
        hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    message = str(raised.value)
    assert TUNED in message and "train.batching.micro_batch_size" in message, message
    assert "conf/base" not in message and "\n" not in message and "--pipeline=tune" in message, message


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("train.batching.micro_batch_size", "4"),
        ("train.batching.micro_batch_size", 4.0),
        ("train.batching.micro_batch_size", [4]),
        ("train.batching.gradient_accumulation_steps", True),
        ("train.batching.gradient_accumulation_steps", None),
        ("train.batching.mode", 3),
        ("tune_accumulation.processes", "1"),
        ("tune_accumulation.processes", 1.0),
        ("tune_accumulation.processes", True),
        ("tune_accumulation.processes", None),
        ("tune_accumulation.target_effective_batch", "32"),
        ("tune_accumulation.target_effective_batch", [32]),
        ("tune_accumulation.samples_per_micro_batch", "4.0"),
        ("tune_accumulation.samples_per_micro_batch", False),
        ("tune_accumulation", [1]),
        ("tune_measured_on", [1]),
    ],
)
def test_a_tuned_file_whose_values_have_the_wrong_type_is_one_line_naming_the_file_and_key(
    tmp_path, monkeypatch, key, bad
):
    """A tuned file (micro-batch 4, accumulation 8 for target 32 on one process) with one value of another
    type than the tune writes, read by a 2-process train run: one line naming the tuned file, the key and
    the fix; the file and data/ as they were. (``micro_batch_size: "4"`` was taken as another value than
    the file's 4, so the accumulation was not rescaled for the processes; a text or list in
    ``tune_accumulation`` was a traceback; ``processes: true`` or ``1.0`` was read as 1.)"""
    from fastlm.errors import ConfigError
    from fastlm.pipelines.tune.record import ACCUMULATION_KEY, RECORD_KEY, accumulation_record

    project, record = _project_and_record(tmp_path, monkeypatch)
    tuned = {
        "train": {"batching": {"mode": "padded", "micro_batch_size": 4, "gradient_accumulation_steps": 8}},
        RECORD_KEY: record,
        ACCUMULATION_KEY: accumulation_record(1, 32, 4.0),
    }
    *parents, last = key.split(".")
    level = tuned
    for parent in parents:
        level = level[parent]
    level[last] = bad
    (project / TUNED).write_text(yaml.safe_dump(tuned))
    written = (project / TUNED).read_bytes()
    data = sorted((path, path.stat().st_mtime_ns) for path in (project / "data").rglob("*"))
    hook, catalog = _run(project / "conf", project)
    raw = catalog.load("params:train")
    catalog["params:train"].save({**raw, "distributed": {**raw.get("distributed", {}), "nproc_per_node": 2}})
    with pytest.raises(ConfigError) as raised:
        hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    message = str(raised.value)
    assert TUNED in message and key in message and "\n" not in message, message
    assert "--pipeline=tune" in message and "delete the file" in message, message
    assert (project / TUNED).read_bytes() == written
    assert sorted((path, path.stat().st_mtime_ns) for path in (project / "data").rglob("*")) == data


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("device", ["cpu"]),
        ("device", 1),
        ("split.max_length", "48"),
        ("split.max_length", 48.0),
        ("tokenized data", {"digest": "abc"}),
        ("model weights", ["abc"]),
        ("train.runtime.precision", ["bf16"]),
        ("train.model.lora.r", {"value": 16}),
        ("train.model.lora.target_modules", [["q_proj"]]),
    ],
)
def test_a_tune_record_value_of_another_type_is_one_line_naming_the_file_and_key(
    tmp_path, monkeypatch, key, bad
):
    """A value of ``tune_measured_on`` edited by hand into another type than the tune writes (a list where
    it writes a text, a text for ``split.max_length``, a mapping): one line naming the tuned file, the key
    and the fix, as for the file's other keys. (The file was set aside with a warning naming a change that
    was none: ``split.max_length 48 -> 48``.)"""
    from fastlm.errors import ConfigError
    from fastlm.pipelines.tune.record import RECORD_KEY

    project, record = _project_and_record(tmp_path, monkeypatch)
    assert key in record
    tuned = {"train": {"batching": {"micro_batch_size": 4}}, RECORD_KEY: {**record, key: bad}}
    (project / TUNED).write_text(yaml.safe_dump(tuned))
    hook, catalog = _run(project / "conf", project)
    with pytest.raises(ConfigError) as raised:
        hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    message = str(raised.value)
    assert TUNED in message and f"{RECORD_KEY}.{key}" in message and "\n" not in message, message
    assert "--pipeline=tune" in message and "delete the file" in message, message


def test_a_tune_record_of_the_types_the_tune_writes_is_not_refused(tmp_path, monkeypatch):
    """The record as the tune writes it, lists of module names included, passes the type check."""
    from fastlm.pipelines.tune.record import RECORD_KEY, check_tuned_file

    _, record = _project_and_record(tmp_path, monkeypatch)
    record = {**record, "train.model.lora.target_modules": ["q_proj", "v_proj"], "model weights": "ab12"}
    check_tuned_file(TUNED, {"train": {"batching": {"micro_batch_size": 4}}, RECORD_KEY: record})


H100 = "cuda (NVIDIA H100 80GB HBM3, 79 GiB)"


def _on_card(tmp_path, monkeypatch, *, limit, card: str, memory_gb: float, float8_cores: bool = True):
    """A tuned file (micro-batch 4) tuned on an H100 with ``tune.memory_limit_gb: limit`` (None: none), read
    by a train run on ``card`` of ``memory_gb`` (fake names and memory: the device calls stand in), and the
    micro-batch the run trains with."""
    import fastlm.pipelines.tune.record as tune_record
    from fastlm.engine.config import TrainParams
    from fastlm.pipelines.tune.record import RECORD_KEY, measured_on

    project, record = _project_and_record(tmp_path, monkeypatch)
    train = TrainParams.model_validate(_run(project / "conf", project)[1].load("params:train"))
    tuned_on = measured_on(
        train,
        max_length=record["split.max_length"],
        data=None,
        device=H100,
        memory_limit_gb=limit,
        float8_cores=True,
    )
    (project / TUNED).write_text(
        yaml.safe_dump({"train": {"batching": {"micro_batch_size": 4}}, RECORD_KEY: tuned_on})
    )
    monkeypatch.setattr(tune_record, "device_description", lambda requested: card)
    monkeypatch.setattr(tune_record, "device_memory_gb", lambda requested: memory_gb)
    monkeypatch.setattr(tune_record, "float8_tensor_cores", lambda requested: float8_cores)
    hook, catalog = _run(project / "conf", project)
    hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    return catalog.load("params:train")["batching"]["micro_batch_size"]


@pytest.mark.parametrize("memory_gb", [24.0, 79.6])
def test_a_file_tuned_under_a_memory_limit_applies_on_a_card_of_at_least_that_memory(
    tmp_path, monkeypatch, memory_gb
):
    """``tune.memory_limit_gb: 24`` on an H100, to tune for a 24 GB card: on a CUDA card of 24 GB or more it
    is applied, and the line applying it says it was tuned on the H100 limited to 24 GB. (The record's
    device, the H100, was compared as a whole: the file was set aside on the very card it was tuned for.)"""
    lines = _lines(monkeypatch)
    card = "cuda (NVIDIA GeForce RTX 4090, 24 GiB)" if memory_gb < 30 else H100
    assert _on_card(tmp_path, monkeypatch, limit=24, card=card, memory_gb=memory_gb) == 4
    said = [line for line in lines if "is in effect" in line]
    assert len(said) == 1 and f"tuned on {H100} limited to 24 GB" in said[0], lines
    assert not any("not applied" in line for line in lines), lines


@pytest.mark.parametrize(
    ("card", "memory_gb", "float8_cores", "named"),
    [
        ("cuda (NVIDIA A10, 22 GiB)", 22.49, False, "22.49 GB, less than the 24 GB"),
        ("cuda (NVIDIA A10, 22 GiB)", 23.99, True, "tune.memory_limit_gb: 23.99"),
        ("cpu", 500.0, False, f"device {H100} -> cpu"),
        ("cuda (NVIDIA A100-SXM4-40GB, 39 GiB)", 39.4, False, "float8 tensor cores"),
    ],
    ids=["less-memory", "just-under", "other-kind", "no-float8-cores"],
)
def test_a_file_tuned_under_a_memory_limit_is_set_aside_where_that_limit_does_not_hold(
    tmp_path, monkeypatch, card, memory_gb, float8_cores, named
):
    """The same file on a card of less memory than the limit, on another kind of device, or on a card
    without the float8 tensor cores its ``float8: auto`` measured with (other activation memory): not
    applied, one warning naming why."""
    lines = _lines(monkeypatch)
    base = _on_card(
        tmp_path, monkeypatch, limit=24, card=card, memory_gb=memory_gb, float8_cores=float8_cores
    )
    assert base != 4
    warned = [line for line in lines if "not applied" in line]
    assert len(warned) == 1 and named in warned[0], lines
    assert not any("is in effect" in line for line in lines), lines


def test_a_file_tuned_without_a_limit_applies_on_its_own_card_only(tmp_path, monkeypatch):
    """Without ``tune.memory_limit_gb`` the record names the card alone, as before: another card of more
    memory sets it aside; its own card applies it, without a word of a limit."""
    lines = _lines(monkeypatch)
    other = "cuda (NVIDIA H200, 139 GiB)"
    assert _on_card(tmp_path / "other", monkeypatch, limit=None, card=other, memory_gb=139.8) != 4
    assert any("not applied" in line and f"device {H100} -> {other}" in line for line in lines), lines
    lines.clear()
    assert _on_card(tmp_path / "own", monkeypatch, limit=None, card=H100, memory_gb=79.6) == 4
    said = [line for line in lines if "is in effect" in line]
    assert len(said) == 1 and "limited to" not in said[0], lines


def test_a_file_tuned_on_a_cpu_applies_on_a_host_of_its_memory_only(tmp_path, monkeypatch):
    """On a CPU the trials' memory is the host's RAM (the headroom is a share of it), as a GPU's is the
    card's: a file tuned on a 512 GiB server, in a project copied whole to a 16 GiB laptop, is set aside
    there, one warning naming both; the same host applies it. (The record said ``cpu`` alone: the server's
    micro-batch was applied on the laptop, where it did not fit.)"""
    import fastlm.engine.observe.metrics as metrics
    from fastlm.pipelines.tune.record import RECORD_KEY

    lines = _lines(monkeypatch)
    monkeypatch.setattr(metrics, "device_memory_mb", lambda device: 512 * 1024.0)
    project, record = _project_and_record(tmp_path, monkeypatch)
    assert record["device"] == "cpu (512 GiB)", record["device"]
    (project / TUNED).write_text(
        yaml.safe_dump({"train": {"batching": {"micro_batch_size": 4}}, RECORD_KEY: record})
    )
    monkeypatch.setattr(metrics, "device_memory_mb", lambda device: 16 * 1024.0 - 300)  # 15.7 GiB
    hook, catalog = _run(project / "conf", project)
    hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    assert catalog.load("params:train")["batching"]["micro_batch_size"] != 4
    warned = [line for line in lines if "not applied" in line]
    assert len(warned) == 1 and "device cpu (512 GiB) -> cpu (16 GiB)" in warned[0], lines
    lines.clear()
    monkeypatch.setattr(metrics, "device_memory_mb", lambda device: 512 * 1024.0)
    hook, catalog = _run(project / "conf", project)
    hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    assert catalog.load("params:train")["batching"]["micro_batch_size"] == 4
    assert not any("not applied" in line for line in lines), lines


@pytest.mark.parametrize(
    ("local", "refused"),
    [
        ({"train": {"batching": {"micro_batch_size": 8}}}, "train.batching.micro_batch_size"),
        ({"train": {"batching": {"mode": "dynamic"}, "max_steps": 50}}, "train.batching.mode"),
        ({"train": {"model": {"gradient_checkpointing": "auto"}}}, "train.model.gradient_checkpointing"),
        ({"train": {"model": {"gradient_checkpointing": "full"}, "max_steps": 50}}, None),  # not auto: kept
        ({"train": {"max_steps": 50, "batching": {"row_length": 64}}}, None),
    ],
    ids=["micro_batch_size", "mode", "checkpointing_auto", "checkpointing_full", "other_keys"],
)
def test_a_tune_refuses_before_measuring_where_another_file_of_its_environment_sets_what_it_writes(
    tmp_path, monkeypatch, local, refused
):
    """conf/local/parameters.yml (the user's) setting a key the tune writes into
    conf/local/parameters_tuned.yml: Kedro refuses a key two files of one environment set, so the tune ran,
    wrote its file, and every later `kedro run` (another tune too) stopped on the clash until a file was
    edited by hand. Refused before any trial, in one line naming both files and the keys, nothing written;
    other keys are no clash."""
    from fastlm.errors import ConfigError

    project, _, _ = _project(tmp_path, monkeypatch)
    (project / "conf/local/parameters.yml").write_text(yaml.safe_dump(local))
    hook, catalog = _run(project / "conf", project)
    if refused is None:
        hook.before_pipeline_run({"env": None}, _pipeline("tune"), catalog)
        return
    with pytest.raises(ConfigError) as caught:
        hook.before_pipeline_run({"env": None}, _pipeline("tune"), catalog)
    said = str(caught.value)
    assert "\n" not in said and refused in said
    assert "conf/local/parameters.yml" in said and "conf/local/parameters_tuned.yml" in said
    assert not (project / TUNED).exists()


class _SweepTracker:
    """The RunTracker calls of a sweep's runs: none recorded."""

    def child_run(self, name, params):
        import contextlib

        return contextlib.nullcontext(f"id-{name}")

    def log_run_metrics(self, metrics):
        pass

    def log_params(self, params):
        pass

    def adopt_child_run(self, run_id):
        pass


def test_a_sweep_run_on_settings_the_tuned_file_was_not_measured_on_trains_without_it(tmp_path, monkeypatch):
    """A tune measured on this conf (gradient checkpointing off) chose micro-batch 4, accumulation 8; a sweep
    over gradient checkpointing: the run with it off (as measured) trains with the tuned batching, the run
    with it full (another peak memory, another fastest micro-batch) with the conf's, one warning naming the
    run, the setting and the file. Was: every run of the sweep took the tuned file's micro-batch."""
    import pandas as pd

    from fastlm import sweep_training
    from fastlm.pipelines.sweep import nodes
    from fastlm.pipelines.tune.record import RECORD_KEY
    from fastlm.sweeps import SweepRuns

    lines = module_log_lines(monkeypatch, sweep_training)
    project, record = _project_and_record(tmp_path, monkeypatch)
    assert record["train.model.gradient_checkpointing"] == "off"
    tuned = {
        "train": {"batching": {"micro_batch_size": 4, "gradient_accumulation_steps": 8}},
        RECORD_KEY: record,
    }
    (project / TUNED).write_text(yaml.safe_dump(tuned))
    hook, catalog = _run(project / "conf", project)
    hook.before_pipeline_run({"env": None}, _pipeline("train"), catalog)
    seen = {}

    def train_model(tokenized, fingerprint, tokenizer, params, split_params, run_name, tracker, choices_dir):
        seen[run_name] = params["batching"]
        history = pd.DataFrame({"step": [1], "loss": [2.0], "elapsed_s": [0.1]})
        evaluation = pd.DataFrame({"step": [1], "val_loss": [2.0]})
        return {"model": None}, history, evaluation, {"final_val_loss": 2.0, "steps": 1}

    monkeypatch.setattr(nodes, "train_model", train_model)
    sweep = tmp_path / "gc.yml"
    sweep.write_text(
        yaml.safe_dump({"name": "gc", "grid": {"train.model.gradient_checkpointing": ["off", "full"]}})
    )
    train = catalog.load("params:train")
    base = yaml.safe_load((project / "conf/base/parameters_train.yml").read_text())["train"]["batching"]

    class _Vocabulary:
        def __len__(self) -> int:
            return 300

    fingerprint = {"fingerprint": "f", "params": {}}
    nodes.run_sweep(
        None,
        fingerprint,
        _Vocabulary(),
        None,
        train,
        {},
        {},
        str(sweep),
        SweepRuns(tmp_path / "s"),
        _SweepTracker(),
    )
    assert (seen["gc-01"]["micro_batch_size"], seen["gc-01"]["gradient_accumulation_steps"]) == (4, 8)
    assert seen["gc-02"]["micro_batch_size"] == base["micro_batch_size"] != 4
    assert seen["gc-02"]["gradient_accumulation_steps"] == base["gradient_accumulation_steps"] != 8
    warned = [line for line in lines if "gc-02" in line and TUNED in line]
    assert len(warned) == 1 and "train.model.gradient_checkpointing off -> full" in warned[0], lines
    assert not any("gc-01" in line and TUNED in line for line in lines), lines
