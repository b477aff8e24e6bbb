"""Issue 21: a pretrained folder trains as what it is, with all its weights, or is refused in one line.

Tiny GPT-2, Llama, BART, T5 and BERT folders are built from configs and saved with ``save_pretrained`` into
temporary folders (no hub access); ``build_model`` (what the train pipeline calls) and the trained-model
loaders (report, merge-adapter) are checked against each row of the issue's table.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from fastlm.engine.config import parse_train_params
from fastlm.engine.model.build import build_model
from fastlm.errors import ConfigError
from tests.support.tiny_seq2seq import SMALL_BART_LAYERS

MAX_LENGTH = 32


def _tiny(kind: str, vocab: int):
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        BertConfig,
        BertForMaskedLM,
        BertLMHeadModel,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        LlamaModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    torch.manual_seed(0)
    llama = {
        "vocab_size": vocab,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    }
    bert = {
        "vocab_size": vocab,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 64,
    }
    if kind == "gpt2":
        return GPT2LMHeadModel(
            GPT2Config(
                vocab_size=vocab,
                n_embd=16,
                n_layer=1,
                n_head=2,
                n_positions=64,
                bos_token_id=0,
                eos_token_id=0,
            )
        )
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**llama))
    if kind == "llama_without_head":
        return LlamaModel(LlamaConfig(**llama))
    if kind == "bart":
        return BartForConditionalGeneration(
            BartConfig(
                vocab_size=vocab,
                **SMALL_BART_LAYERS,
            )
        )
    if kind == "t5":
        return T5ForConditionalGeneration(
            T5Config(vocab_size=vocab, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
        )
    if kind == "bert":
        return BertForMaskedLM(BertConfig(**bert))
    if kind == "bert_decoder":
        return BertLMHeadModel(BertConfig(**bert, is_decoder=True))
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, bpe_tokenizer) -> dict[str, Path]:
    """One save_pretrained folder per family, each with the tokenizer the tests train with."""
    root = tmp_path_factory.mktemp("checkpoints")
    made = {}
    for kind in ("gpt2", "llama", "llama_without_head", "bart", "t5", "bert", "bert_decoder"):
        made[kind] = root / kind
        _tiny(kind, len(bpe_tokenizer)).save_pretrained(made[kind])
        bpe_tokenizer.save_pretrained(made[kind])
    return made


def _params(folder, **model):
    return parse_train_params({"model": {"name_or_path": str(folder), **model}}).model


def _build(folder, tokenizer, **model):
    return build_model(
        _params(folder, **model), tokenizer, max_length=MAX_LENGTH, attn_implementation="eager"
    )


def _refused(folder, tokenizer, *expected: str, **model) -> str:
    with pytest.raises(ConfigError) as raised:
        _build(folder, tokenizer, **model)
    message = str(raised.value)
    assert "\n" not in message and "Fix:" in message, message
    for part in expected:
        assert part in message, message
    return message


def _copy(folder: Path, tmp_path: Path, name: str = "copy") -> Path:
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    return copy


# --------------------------------------------------------------------------- the class follows the checkpoint


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"), ("bert_decoder", "BertLMHeadModel")],
)
def test_a_causal_lm_trains_as_itself_with_its_own_weights(folders, bpe_tokenizer, kind, expected):
    from safetensors.torch import load_file

    model = _build(folders[kind], bpe_tokenizer)
    assert type(model).__name__ == expected and model.training
    saved = load_file(folders[kind] / "model.safetensors")
    state = model.state_dict()
    assert saved and all(torch.equal(state[key], value) for key, value in saved.items())


@pytest.mark.parametrize(
    ("kind", "expected"), [("bart", "BartForConditionalGeneration"), ("t5", "T5ForConditionalGeneration")]
)
def test_an_encoder_decoder_trains_as_seq2seq_with_its_own_weights(folders, bpe_tokenizer, kind, expected):
    from safetensors.torch import load_file

    model = _build(folders[kind], bpe_tokenizer)
    assert type(model).__name__ == expected and model.training and model.config.is_encoder_decoder
    saved = load_file(folders[kind] / "model.safetensors")
    state = model.state_dict()
    assert any(".encoder." in f".{key}" for key in saved)
    assert saved and all(torch.equal(state[key], value) for key, value in saved.items())


def test_a_masked_lm_is_refused_in_one_line(folders, bpe_tokenizer):
    _refused(
        folders["bert"],
        bpe_tokenizer,
        "fastlm trains causal and seq2seq LMs",
        "BertForMaskedLM",
        "model type bert",
        str(folders["bert"]),
    )


def test_a_model_type_transformers_does_not_know_is_one_line(folders, bpe_tokenizer, tmp_path):
    folder = _copy(folders["llama"], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "model_type": "frobnicator", "architectures": ["FrobForCausalLM"]})
    )
    _refused(folder, bpe_tokenizer, str(folder), "model type 'frobnicator'")


# ----------------------------------------------------------------------------------------- weights load whole


def _remove_tensor_from(file: Path, key: str) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(file)
    del weights[key]
    save_file(weights, file, metadata={"format": "pt"})


def _remove_tensor(folder: Path, key: str) -> None:
    _remove_tensor_from(folder / "model.safetensors", key)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_removed_tensor_is_refused(folders, bpe_tokenizer, tmp_path, lora):
    folder = _copy(folders["llama"], tmp_path)
    _remove_tensor(folder, "model.layers.1.mlp.up_proj.weight")
    extra = {"lora": {"enabled": True, "r": 2}} if lora else {}
    _refused(
        folder,
        bpe_tokenizer,
        "model.layers.1.mlp.up_proj.weight",
        str(folder),
        "missing",
        "train.model.allow_new_weights",
        **extra,
    )


def test_a_refusal_is_the_only_report_of_the_missing_keys(folders, bpe_tokenizer, tmp_path):
    """transformers' own multi-line load report would print above fastlm's one line: it is kept quiet."""
    folder = _copy(folders["llama"], tmp_path)
    _remove_tensor(folder, "model.layers.1.mlp.up_proj.weight")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    library = logging.getLogger("transformers")  # its own stderr handler; it does not propagate
    library.addHandler(handler)
    try:
        _refused(folder, bpe_tokenizer, "model.layers.1.mlp.up_proj.weight")
    finally:
        library.removeHandler(handler)
    reports = [record.getMessage() for record in records if "LOAD REPORT" in record.getMessage()]
    assert not reports, reports[0]


def test_a_new_head_needs_allow_new_weights_and_is_logged(folders, bpe_tokenizer, caplog):
    _refused(folders["llama_without_head"], bpe_tokenizer, "lm_head.weight", "train.model.allow_new_weights")
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        model = _build(folders["llama_without_head"], bpe_tokenizer, allow_new_weights=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert any(
        "lm_head.weight" in record.getMessage() and "newly initialised" in record.getMessage()
        for record in caplog.records
    ), caplog.text


# ----------------------------------------------------------------------------- broken folders name the file


def test_an_empty_folder_names_its_missing_config(bpe_tokenizer, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    _refused(folder, bpe_tokenizer, f"{folder / 'config.json'}", "save_pretrained")


def test_a_cut_off_config_names_the_file(folders, bpe_tokenizer, tmp_path):
    folder = _copy(folders["llama"], tmp_path)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text[: len(text) // 2])
    _refused(folder, bpe_tokenizer, f"{folder / 'config.json'}", "not valid JSON")


def test_a_cut_off_safetensors_names_the_file(folders, bpe_tokenizer, tmp_path):
    folder = _copy(folders["llama"], tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    _refused(folder, bpe_tokenizer, f"{folder / 'model.safetensors'}", "unreadable")


def test_a_folder_without_weights_names_the_folder(folders, bpe_tokenizer, tmp_path):
    folder = _copy(folders["llama"], tmp_path)
    (folder / "model.safetensors").unlink()
    _refused(folder, bpe_tokenizer, str(folder), "no weights")


# --------------------------------------------------------------------------------------- vocabulary hints


def test_a_tokenizer_from_another_model_is_told_to_use_the_models_own(bpe_tokenizer, tmp_path, sample_texts):
    from tests.support.tiny_llama import llama_style_tokenizer

    folder = tmp_path / "other"
    _tiny("llama", 60).save_pretrained(folder)
    llama_style_tokenizer(sample_texts[:200], vocab_size=60).save_pretrained(folder)
    message = _refused(folder, bpe_tokenizer, "not the model's own", f"split.tokenizer.source: {folder}")
    assert "resize_embeddings" not in message
    _refused(folder, bpe_tokenizer, "not the model's own", resize_embeddings=True)  # resizing would not help


def test_the_models_own_larger_tokenizer_is_told_to_resize(bpe_tokenizer, tmp_path, caplog):
    folder = tmp_path / "small-embedding"
    _tiny("gpt2", len(bpe_tokenizer) - 8).save_pretrained(folder)
    bpe_tokenizer.save_pretrained(folder)
    message = _refused(
        folder, bpe_tokenizer, f"has {len(bpe_tokenizer) - 8}", "train.model.resize_embeddings: true"
    )
    assert "split.tokenizer.source" not in message  # the hint that looped: the user already did that
    with caplog.at_level(logging.INFO, logger="fastlm"):
        model = _build(folder, bpe_tokenizer, resize_embeddings=True)
    assert model.get_input_embeddings().num_embeddings == len(bpe_tokenizer)
    assert any("resized" in record.getMessage().lower() for record in caplog.records), caplog.text


def test_new_parameters_default_off_and_are_validated():
    model = parse_train_params({}).model
    assert model.allow_new_weights is False and model.resize_embeddings is False
    with pytest.raises(ConfigError, match="train.model.resize_embeddings"):
        parse_train_params({"model": {"resize_embeddings": "sometimes"}})
    with pytest.raises(ConfigError, match="train.model.allow_new_weights"):
        parse_train_params({"model": {"allow_new_weights": "sometimes"}})


# --------------------------------------------------- the trained-model loaders do not re-shape a model either


def test_the_report_loader_loads_an_encoder_decoder_folder_as_seq2seq(folders):
    from fastlm.datasets.pretrained_model import PretrainedModelDataset

    model = PretrainedModelDataset(str(folders["bart"])).load()["model"]
    assert type(model).__name__ == "BartForConditionalGeneration"


def test_merge_adapter_refuses_a_base_that_is_not_whole(folders, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from fastlm.__main__ import merge_adapter_command

    base = AutoModelForCausalLM.from_pretrained(folders["llama"], local_files_only=True)
    adapter = tmp_path / "adapter"
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    cut = _copy(folders["llama"], tmp_path, "cut-base")
    _remove_tensor(cut, "model.layers.1.mlp.up_proj.weight")
    for bad_base, expected in (
        (cut, "model.layers.1.mlp.up_proj.weight"),
        (folders["bart"], "does not load"),
    ):
        code = merge_adapter_command(
            ["--adapter", str(adapter), "--base", str(bad_base), "--out", str(tmp_path / "merged")]
        )
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert code == 2 and "Traceback" not in err, err
        assert last.startswith("fastlm: error:") and expected in last and "Fix:" in last, last
        assert not (tmp_path / "merged").exists()


def test_lora_with_resized_embeddings_trains_the_new_rows_and_loads_back(bpe_tokenizer, tmp_path):
    from fastlm.engine.model.adapter_folder import load_adapter_model

    folder = tmp_path / "base"
    _tiny("llama", len(bpe_tokenizer) - 8).save_pretrained(folder)
    bpe_tokenizer.save_pretrained(folder)
    lora = {"enabled": True, "r": 2}
    _refused(
        folder,
        bpe_tokenizer,
        "LoRA keeps the embedding frozen",
        "train.model.lora.modules_to_save",
        resize_embeddings=True,
        lora=lora,
    )
    model = _build(
        folder,
        bpe_tokenizer,
        resize_embeddings=True,
        lora={**lora, "modules_to_save": ["embed_tokens", "lm_head"]},
    )
    embedding = model.get_input_embeddings()
    assert embedding.weight.requires_grad and embedding.weight.shape[0] == len(bpe_tokenizer)
    with torch.no_grad():
        embedding.weight.add_(1.0)  # stands in for training
    model.save_pretrained(tmp_path / "adapter")
    bpe_tokenizer.save_pretrained(tmp_path / "adapter")
    back = load_adapter_model(tmp_path / "adapter")
    assert torch.equal(back.get_input_embeddings().weight, embedding.weight)


def test_merge_adapter_refuses_an_adapter_that_is_not_whole(folders, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from fastlm.__main__ import merge_adapter_command

    base = AutoModelForCausalLM.from_pretrained(folders["llama"], local_files_only=True)
    adapter = tmp_path / "adapter"
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    cut = _copy(adapter, tmp_path, "cut-adapter")
    data = (cut / "adapter_model.safetensors").read_bytes()
    (cut / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    edited = _copy(adapter, tmp_path, "edited-adapter")
    _remove_tensor_from(
        edited / "adapter_model.safetensors", "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"
    )
    for bad, expected in (
        (cut, f"{cut}/adapter_model.safetensors is unreadable"),
        (edited, "layers.1.self_attn.q_proj.lora_B"),
    ):
        code = merge_adapter_command(["--adapter", str(bad), "--out", str(tmp_path / "merged")])
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert code == 2 and "Traceback" not in err, err
        assert last.startswith("fastlm: error:") and expected in last and "Fix:" in last, last
        assert not (tmp_path / "merged").exists()


@pytest.mark.parametrize(
    ("model_type", "changes", "kind"),
    [
        ("qwen3", {}, "causal LM"),
        ("mistral", {}, "causal LM"),
        ("gpt_neox", {}, "causal LM"),
        ("bert", {"is_decoder": True, "architectures": ["BertLMHeadModel"]}, "causal LM"),
        ("roberta", {"architectures": ["RobertaForMaskedLM"]}, "encoder-only or masked LM"),
        ("electra", {}, "encoder-only or masked LM"),
        ("deberta-v2", {}, "encoder-only or masked LM"),
        ("mbart", {}, "encoder-decoder (seq2seq) model"),
        ("mt5", {}, "encoder-decoder (seq2seq) model"),
        ("vit", {}, "unknown kind of model"),
    ],
)
def test_the_kind_follows_the_config(model_type, changes, kind):
    from transformers import AutoConfig

    from fastlm.engine.model import pretrained

    config = AutoConfig.for_model(model_type, **changes)
    assert pretrained.checkpoint_kind(config) == kind
    checkpoint = pretrained.PretrainedFolder(
        source="./m", location="./m", label="train.model.name_or_path = './m'", config=config, kind=kind
    )
    if kind in pretrained.TRAINABLE:
        assert pretrained.require_trainable(checkpoint) == (
            "AutoModelForSeq2SeqLM" if kind == pretrained.SEQ2SEQ else "AutoModelForCausalLM"
        )
    else:
        with pytest.raises(ConfigError, match=f"model type {model_type}.*fastlm trains"):
            pretrained.require_trainable(checkpoint)


def test_threads_load_a_model_folder_one_at_a_time(folders, monkeypatch):
    """Round six: `kedro run --pipeline=report --runner=ThreadRunner` loads the trained model in two nodes
    at once; transformers' lazy imports raced (an ImportError traceback, or the intact folder reported as
    missing lm_head.weight). The catalog's model dataset loads one folder at a time per process."""
    import threading
    import time

    from fastlm.datasets.pretrained_model import PretrainedModelDataset
    from fastlm.engine.model import pretrained

    inside, most = [0], [0]
    real = pretrained.load_pretrained

    def counted(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.2)
        try:
            return real(*args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(pretrained, "load_pretrained", counted)
    loaded = []
    threads = [
        threading.Thread(target=lambda: loaded.append(PretrainedModelDataset(str(folders["llama"])).load()))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loaded) == 3 and most[0] == 1


def test_a_trained_model_folder_is_saved_for_inference(bpe_tokenizer, tmp_path):
    """Training switches the key/value cache off; the folder kept `use_cache: false`, so a plain forward of
    the loaded model returned no cache (hand-written decoding loops, servers reading the config), where a
    merged adapter's folder had it on. A base without a pad id beside a tokenizer that pads with its EOS
    saved no pad id for generation. The folder is saved with the cache on and the tokenizer's pad id in its
    generation config (not in the model config: an embedding built with padding_idx = EOS would freeze the
    EOS row in a later fine-tune); the model the run keeps is left as it was."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fastlm.datasets.pretrained_model import PretrainedModelDataset

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(bpe_tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            eos_token_id=bpe_tokenizer.eos_token_id,
            pad_token_id=None,
        )
    )
    model.config.use_cache = False  # as the build leaves it for training
    assert bpe_tokenizer.pad_token_id is not None
    PretrainedModelDataset(str(tmp_path / "model")).save({"model": model, "tokenizer": bpe_tokenizer})
    config = json.loads((tmp_path / "model/config.json").read_text())
    generation = json.loads((tmp_path / "model/generation_config.json").read_text())
    assert config["use_cache"] is True and generation.get("use_cache", True) is True
    assert generation["pad_token_id"] == bpe_tokenizer.pad_token_id and config.get("pad_token_id") is None
    assert model.config.use_cache is False


def test_a_model_folder_without_a_tokenizer_says_the_data_tokenizer_could_not_be_checked(
    bpe_tokenizer, tmp_path, caplog
):
    """A folder of weights and config alone (no tokenizer beside them) over data tokenized with another
    model's tokenizer of no more tokens: nothing to compare, the run trained on embeddings whose ids meant
    other tokens, its only hint a first loss far from ln(vocab). One warning says the pairing is unchecked."""
    folder = tmp_path / "no-tokenizer"
    _tiny("llama", len(bpe_tokenizer) + 4).save_pretrained(folder)
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        _build(folder, bpe_tokenizer)
    said = [r.getMessage() for r in caplog.records if "holds no tokenizer" in r.getMessage()]
    assert len(said) == 1 and str(folder) in said[0] and "split.tokenizer.source" in said[0]
    bpe_tokenizer.save_pretrained(folder)  # its own beside it: compared, nothing said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        _build(folder, bpe_tokenizer)
    assert not [r for r in caplog.records if "holds no tokenizer" in r.getMessage()]


def test_an_adapter_over_a_grown_embedding_says_at_its_save_how_it_loads(bpe_tokenizer, tmp_path, caplog):
    """LoRA with ``train.model.resize_embeddings`` saves an adapter whose embedding and head have more rows
    than its base folder's: transformers' ``AutoModelForCausalLM.from_pretrained`` and ``pipeline()`` on that
    folder load the base as it is and stop with a size mismatch, though fastlm's own loading (predict, the
    report, merge-adapter) grows the base first. Its save says so, with the commands that load it; an
    adapter over an embedding of the base's size says nothing of it."""
    import logging

    from fastlm.datasets.pretrained_model import PretrainedModelDataset
    from fastlm.engine.model.adapter_folder import save_adapter

    folder = tmp_path / "base"
    _tiny("llama", len(bpe_tokenizer) - 8).save_pretrained(folder)
    bpe_tokenizer.save_pretrained(folder)
    lora = {"enabled": True, "r": 2, "modules_to_save": ["embed_tokens", "lm_head"]}
    model = _build(folder, bpe_tokenizer, resize_embeddings=True, lora=lora)
    with caplog.at_level(logging.WARNING, logger="fastlm"):  # as the train pipeline saves it: atomically
        PretrainedModelDataset(str(tmp_path / "adapter")).save({"model": model, "tokenizer": bpe_tokenizer})
    said = [record.getMessage() for record in caplog.records if "size mismatch" in record.getMessage()]
    assert len(said) == 1, [record.getMessage() for record in caplog.records]
    # the folder it is in once saved, never the temporary one it is written into
    assert f"The adapter in {tmp_path / 'adapter'} trained" in said[0] and ".tmp-" not in said[0], said
    assert f"from {len(bpe_tokenizer) - 8} to {len(bpe_tokenizer)} tokens" in said[0], said
    assert "merge-adapter --adapter" in said[0] and "resize_token_embeddings" in said[0], said
    caplog.clear()
    same = tmp_path / "same"
    _tiny("llama", len(bpe_tokenizer)).save_pretrained(same)
    bpe_tokenizer.save_pretrained(same)
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        save_adapter(_build(same, bpe_tokenizer, lora=lora), tmp_path / "adapter2")
    assert not [record for record in caplog.records if "size mismatch" in record.getMessage()]
