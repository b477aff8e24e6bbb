"""LoRA adapters through peft: which modules get adapters, frozen base weights, QLoRA, saving and merging.

``train.model.lora`` (``LoraParams``) turns it on for a pretrained ``train.model.name_or_path``. The base
model is frozen (bf16 on GPUs that have it: half the memory of fp32, and LoRA needs no fp32 master copy of
frozen weights); the adapters are fp32 (peft's ``autocast_adapter_dtype``) and are all the optimizer sees
(``optim`` skips frozen parameters). The packed path is unchanged: adapters wrap Linear layers, attention and
its block-diagonal mask are the base model's.

Gradient checkpointing with frozen embeddings: the embedding output does not require grad, so a *reentrant*
checkpoint would see no input needing a gradient and drop the adapters' gradients. fastlm checkpoints
non-reentrantly (``use_reentrant=False``), which does not need it, and also calls
``enable_input_require_grads`` so that any reentrant path (e.g. ``prepare_model_for_kbit_training`` on
older peft) still works.

QLoRA (``load_in_4bit``): NF4 base weights with double quantization and bf16 compute
(``BitsAndBytesConfig``), then ``prepare_model_for_kbit_training``; it needs CUDA and the bitsandbytes
package and is refused with one line without them.

Saving: ``PeftModel.save_pretrained`` writes ``adapter_config.json`` + ``adapter_model.safetensors``; the
config names the base folder (an absolute path, so the adapter loads from anywhere). ``merge_adapter``
folds the adapters into the base weights and returns a plain transformers model (``save_pretrained`` it for a
full model folder: ``python -m fastlm merge-adapter``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import warnings
from pathlib import Path

import torch

from fastlm.engine.config import LoraParams, ModelParams
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

PARAM = "train.model.lora"
ADAPTER_CONFIG = "adapter_config.json"
_ATTENTION_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT_TARGETS: dict[str, list[str]] = {
    **{name: _ATTENTION_MLP for name in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2",
                                         "gemma3_text", "phi3", "olmo2", "exaone", "solar")},
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    # encoder-decoder families: self- and cross-attention and the feed-forward, in encoder and decoder alike
    **{name: ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"] for name in ("bart", "mbart")},
    **{name: ["q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo"] for name in ("t5", "mt5", "umt5")},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def check_supported(params: ModelParams) -> None:
    """Refuse, with one line, LoRA without a pretrained base and 4-bit weights without CUDA/bitsandbytes."""
    if params.name_or_path is None:
        raise ConfigError(
            f"{PARAM}.enabled is true but train.model.name_or_path is null: LoRA adapts a pretrained model.",
            fix="set train.model.name_or_path to a local save_pretrained folder, or set train.model.lora.enabled: false.",
        )
    if params.lora.load_in_4bit:
        missing = [what for what, ok in (("a CUDA GPU", torch.cuda.is_available()),
                                         ("the bitsandbytes package", importlib.util.find_spec("bitsandbytes")
                                          is not None)) if not ok]
        if missing:
            raise ConfigError(
                f"{PARAM}.load_in_4bit is true but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                "missing (4-bit QLoRA weights run on CUDA through bitsandbytes).",
                fix=f"set {PARAM}.load_in_4bit: false (LoRA on bf16/fp32 weights), or run on a GPU machine with "
                "`pip install bitsandbytes`.",
            )


def base_dtype(lora: LoraParams) -> torch.dtype:
    """The frozen base weights' dtype: ``auto`` = bf16 on a GPU that has it, else fp32."""
    if lora.base_dtype != "auto":
        return DTYPES[lora.base_dtype]
    return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32


def load_kwargs(lora: LoraParams) -> dict:
    """Extra ``from_pretrained`` arguments for the base model (dtype; 4-bit quantization for QLoRA)."""
    if not lora.load_in_4bit:
        return {"dtype": base_dtype(lora)}
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.bfloat16)
    return {"dtype": torch.bfloat16, "quantization_config": quantization,
            "device_map": {"": torch.cuda.current_device()}}


def target_modules(model, requested) -> list[str] | str:
    """``auto``: the architecture's attention and MLP projections (``DEFAULT_TARGETS``), else every Linear
    layer except the output head (peft's ``all-linear``)."""
    if requested != "auto":
        return requested
    return DEFAULT_TARGETS.get(getattr(model.config, "model_type", ""), "all-linear")


def apply_lora(model, lora: LoraParams, *, gradient_checkpointing: bool):
    """Wrap ``model`` in a peft LoRA model: base frozen, adapters trainable (fp32)."""
    from peft import LoraConfig, TaskType, get_peft_model, prepare_model_for_kbit_training

    if lora.load_in_4bit:
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    if gradient_checkpointing:
        model.enable_input_require_grads()
    targets = target_modules(model, lora.target_modules)
    task = TaskType.SEQ_2_SEQ_LM if getattr(model.config, "is_encoder_decoder", False) else TaskType.CAUSAL_LM
    config = LoraConfig(task_type=task, r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=targets, bias=lora.bias, modules_to_save=lora.modules_to_save)
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as error:  # e.g. target modules not found in the model
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(f"{PARAM}.target_modules = {lora.target_modules!r} does not fit the model: {first}",
                          fix=f"set {PARAM}.target_modules to auto or to Linear module names of the model.") from error
    counts = parameter_counts(peft_model)
    log.info("LoRA r=%d alpha=%g on %s: %s trainable of %s parameters (%.3f%%)", lora.r, lora.alpha, targets,
             f"{counts['trainable_parameters']:,}", f"{counts['total_parameters']:,}",
             100 * counts["trainable_share"])
    return peft_model


def parameter_counts(model) -> dict:
    """Trainable and total parameters (each shared tensor once; 4-bit packed weights counted unpacked)."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
    else:
        total = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable_parameters": int(trainable), "total_parameters": int(total),
            "trainable_share": round(trainable / total, 6) if total else 0.0}


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> str:
    """The base model folder an adapter was trained on (``base_model_name_or_path`` of its config)."""
    return json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8"))["base_model_name_or_path"]


def load_adapter_model(folder: str | Path, *, base: str | None = None, merge: bool = True, **load_args):
    """The base model (``base`` or the adapter config's) with the adapter of ``folder``, in fp32, offline.

    ``merge=True`` folds the adapters into the weights and returns a plain transformers model (what
    generation and evaluation want: no adapter overhead); else the peft model.
    """
    from fastlm.engine import pretrained

    base = base or adapter_base(folder)
    if not Path(base).is_dir():
        raise ConfigError(
            f"the base model folder {base} of the LoRA adapter in {folder} does not exist.",
            fix="put the base model back there, or pass its new folder (python -m fastlm merge-adapter --base <dir>).",
        )
    args = {"local_files_only": True, "dtype": torch.float32, **load_args}
    checkpoint = pretrained.inspect_checkpoint(
        base, str(Path(base).resolve()), label=f"the base model {base} of the LoRA adapter in {folder}",
        trust_remote_code=args.get("trust_remote_code", False), local_files_only=True)
    base_model = pretrained.load_pretrained(checkpoint, new_weights_param=None, **args)
    size = len(pretrained.folder_vocabulary(folder) or ())
    if size > base_model.get_input_embeddings().num_embeddings:  # trained with train.model.resize_embeddings
        log.info("Growing the embedding of %s to the %d tokens of the adapter's tokenizer", base, size)
        base_model.resize_token_embeddings(size)
    model = _load_adapter_whole(base_model, folder)
    return model.merge_and_unload() if merge else model


def _load_adapter_whole(base_model, folder: str | Path):
    """``PeftModel.from_pretrained``, refusing a cut-off adapter file or adapter weights missing from it (peft
    only warns and leaves those adapters at their initial values)."""
    from peft import PeftModel

    from fastlm.engine import pretrained

    fix = "train the adapter again (its folder is incomplete), or restore the folder from a backup."
    pretrained.check_safetensors(folder, str(folder), fix=fix)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base_model, str(folder))
    for warning in caught:
        text = str(warning.message)
        if "missing adapter keys" in text:
            keys = re.findall(r"'([^']+)'", text)
            raise ConfigError(f"the LoRA adapter in {folder} does not load whole: {len(keys)} adapter weights are "
                              f"missing from it ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}).", fix=fix)
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return model


def merge_adapter(folder: str | Path, *, base: str | None = None):
    """A full model: the adapter of ``folder`` merged into its base (then ``save_pretrained`` it)."""
    model = load_adapter_model(folder, base=base, merge=True)
    model.config.use_cache = True  # a model for inference again
    return model
