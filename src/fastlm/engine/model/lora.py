"""LoRA adapters through peft: which modules get adapters, frozen base weights, QLoRA, saving and merging.

``train.model.lora`` (``LoraParams``) turns it on for a pretrained ``train.model.name_or_path``. The base
model is frozen (bf16 on GPUs that have it: half the memory of fp32, and LoRA needs no fp32 master copy of
frozen weights); the adapters are fp32 (peft's ``autocast_adapter_dtype``) and are all the optimizer sees
(``optim`` skips frozen parameters). The packed path is unchanged: adapters wrap Linear layers, attention and
its block-diagonal mask are the base model's.

Gradient checkpointing with frozen embeddings: the embedding output does not require grad, so a *reentrant*
checkpoint would see no input needing a gradient and drop the adapters' gradients. fastlm checkpoints
non-reentrantly (``use_reentrant=False``), which does not need it, and also calls
``enable_input_require_grads`` so that any reentrant path still works.

QLoRA (``load_in_4bit``): NF4 base weights with double quantization (``BitsAndBytesConfig``), dequantized to
and multiplied in ``base_dtype`` (auto: bf16; ``qlora_compute_dtype``), then ``prepare_quantized`` (frozen,
everything that is not 4-bit left in the compute dtype, norms and head included, unlike peft's
``prepare_model_for_kbit_training``); it needs the bitsandbytes package (on CUDA, or on CPU from its version
0.50) and is refused with one line without it. On a GPU without native bf16 (T4, V100) it trains rather than
being refused: the 4-bit matmuls compute in fp16, as the runtime's autocast does there (emulated bf16 would be
slow and would disagree with it), and the fp16 GradScaler is safe because everything it unscales is fp32: the
adapters (peft's ``autocast_adapter_dtype``), ``modules_to_save`` (cast to fp32 after ``get_peft_model``), and
nothing frozen (the optimizer holds the trainable parameters only).

Saving: ``PeftModel.save_pretrained`` writes ``adapter_config.json`` + ``adapter_model.safetensors``; the
config names the base folder (an absolute path, so the adapter loads from anywhere), and ``base_digest.json``
(``BASE_DIGEST``, taken when the model is built) records the base weights it trains on: loading or merging
the adapter onto a base folder whose weights changed since is refused in one line (``check_base``; an
adapter saved without one loads with one warning). A LoRA checkpoint holds only the adapters, so the resume
digest records the base weights too (``resume.run_digest``). ``merge_adapter`` folds the adapters into the
base weights (in fp32) and returns a plain transformers model in the base folder's saved dtype
(``saved_dtype``; ``save_pretrained`` it for a full model folder: ``python -m fastlm merge-adapter``).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import json
import logging
import math
import os
import re
import time
import warnings
from pathlib import Path

import torch

from fastlm.engine import config as engine_config
from fastlm.engine.config import MERGE_DTYPES, LoraParams, ModelParams
from fastlm.engine.paths import project_relative
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

PARAM = "train.model.lora"
ADAPTER_CONFIG = "adapter_config.json"
GENERATION_CONFIG = "generation_config.json"  # an encoder-decoder adapter's: how it generates as it trained
_ATTENTION_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT_TARGETS: dict[str, list[str]] = {
    **{
        name: _ATTENTION_MLP
        for name in (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen3",
            "gemma",
            "gemma2",
            "gemma3_text",
            "olmo2",
            "exaone",
            "solar",
        )
    },
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],  # q/k/v and gate/up fused
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    # encoder-decoder families: self- and cross-attention and the feed-forward, in encoder and decoder alike
    **{name: ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"] for name in ("bart", "mbart")},
    **{name: ["q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo"] for name in ("t5", "mt5", "umt5")},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def check_supported(params: ModelParams) -> None:
    """Refuse, with one line, LoRA without a pretrained base and 4-bit weights without bitsandbytes (or with
    one too old for CPU on a machine without CUDA: ``config.bitsandbytes_missing``)."""
    if params.name_or_path is None:
        raise ConfigError(
            f"{PARAM}.enabled is true but train.model.name_or_path is null: LoRA adapts a pretrained model.",
            fix="set train.model.name_or_path to a local save_pretrained folder, or set "
            "train.model.lora.enabled: false.",
        )
    if params.lora.load_in_4bit:
        missing = engine_config.bitsandbytes_missing()
        if missing:
            raise ConfigError(
                f"{PARAM}.load_in_4bit is true but {missing} (4-bit QLoRA weights run through bitsandbytes, "
                "on CUDA or, from its version 0.50, on CPU).",
                fix=f"set {PARAM}.load_in_4bit: false (LoRA on bf16/fp32 weights), or "
                "`pip install 'bitsandbytes>=0.50'`.",
            )


def _native_bf16() -> bool:
    """bf16 tensor cores (Ampere and newer), as ``runtime.environment.gpu_has_native_bf16`` decides the
    training precision: torch's plain ``is_bf16_supported()`` also says yes for emulated bf16 (T4, V100)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def base_dtype(lora: LoraParams) -> torch.dtype:
    """The frozen base weights' dtype: ``auto`` = bf16 on a GPU that has it natively, else fp32."""
    if lora.base_dtype != "auto":
        return DTYPES[lora.base_dtype]
    return torch.bfloat16 if _native_bf16() else torch.float32


def qlora_compute_dtype(lora: LoraParams) -> torch.dtype:
    """The 4-bit matmuls' dtype (what the weights are dequantized to and multiplied in; also the frozen
    embedding, head and norms): ``lora.base_dtype`` where given (fp32: a run with mixed precision off), else
    bf16 where the GPU has it natively or on CPU, else fp16 (the runtime then trains in fp16 with a
    GradScaler; see the module docstring)."""
    if lora.base_dtype != "auto":
        return DTYPES[lora.base_dtype]
    return torch.bfloat16 if _native_bf16() or not torch.cuda.is_available() else torch.float16


def load_kwargs(lora: LoraParams) -> dict:
    """Extra ``from_pretrained`` arguments for the base model (dtype; 4-bit quantization for QLoRA)."""
    if not lora.load_in_4bit:
        return {"dtype": base_dtype(lora)}
    from transformers import BitsAndBytesConfig

    compute = qlora_compute_dtype(lora)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    return {"dtype": compute, "quantization_config": quantization, "device_map": {"": device}}


def target_modules(model, requested) -> list[str] | str:
    """``auto``: the architecture's attention and MLP projections (``DEFAULT_TARGETS``; a multimodal model's:
    its language model's family, in its language model only, a pattern peft matches), else every Linear layer
    except the output head (peft's ``all-linear``)."""
    if requested != "auto":
        return requested
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config:  # multimodal: its language model's family, in its language model only
        names = DEFAULT_TARGETS.get(getattr(text, "model_type", ""))
        inside = [name for name, _ in model.named_modules() if name.endswith("language_model")]
        if names and inside:
            return rf".*{re.escape(inside[0])}\..*\.({'|'.join(names)})"
    return DEFAULT_TARGETS.get(getattr(config, "model_type", ""), "all-linear")


def _matches_target(name: str, module_name: str) -> bool:
    """peft's rule for a listed target: the module is called ``name`` or its name ends in ``.<name>``."""
    return module_name == name or module_name.endswith(f".{name}")


def _matches_saved(name: str, module_name: str) -> bool:
    """peft's rule for ``modules_to_save``: the module's name ends in ``name``."""
    return module_name.endswith(name)


def check_named_modules(model, lora: LoraParams) -> None:
    """Every module a LoRA setting names exists in ``model`` (matched as peft matches it), else one line with
    the missing names and names the model has. peft adapts the names it finds and drops the others silently.

    ``target_modules: auto`` is not checked name by name: it lists an architecture family's names, some of
    which a given member lacks (T5's ``wi`` or ``wi_0``/``wi_1``); peft refuses it when none is found.
    """
    named = [name for name, _ in model.named_modules() if name]
    requested = [("target_modules", lora.target_modules, _matches_target, _adaptable_names(model))]
    if lora.modules_to_save:
        requested.append(("modules_to_save", lora.modules_to_save, _matches_saved, _weighted_names(model)))
    for param, names, matches, candidates in requested:
        if not isinstance(names, list):  # auto / all-linear
            continue
        missing = [name for name in names if not any(matches(name, module) for module in named)]
        if missing:
            close = [found for name in missing for found in difflib.get_close_matches(name, candidates, n=2)]
            shown = list(dict.fromkeys(close + candidates))
            listed = ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "")
            raise ConfigError(
                f"{PARAM}.{param} names {', '.join(missing)}, which no module of the model "
                f"({type(model).__name__}) is called or ends with: peft would leave "
                f"{'it' if len(missing) == 1 else 'them'} out.",
                fix=f"name modules the model has (e.g. {listed}) in {PARAM}.{param}"
                + (", or set it to auto." if param == "target_modules" else ", or remove the missing names."),
            )


def _adaptable_names(model) -> list[str]:
    """The last name component of the layers LoRA can adapt (a weight matrix: Linear, Conv1D, Embedding)."""
    return list(
        dict.fromkeys(
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if name and getattr(getattr(module, "weight", None), "ndim", 0) >= 2
        )
    )


def _weighted_names(model) -> list[str]:
    """The last name component of every module with weights of its own (what ``modules_to_save`` names), the
    embedding and output head first (what it usually names)."""
    from fastlm.engine.model import pretrained

    return list(
        dict.fromkeys(
            [
                *sorted(pretrained.embedding_module_names(model)),
                *(
                    name.rsplit(".", 1)[-1]
                    for name, module in model.named_modules()
                    if name and any(True for _ in module.parameters(recurse=False))
                ),
            ]
        )
    )


def adapted_modules(peft_model) -> list[str]:
    """The names of the modules that carry a LoRA adapter (peft's tuner layers), in model order."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [
        name
        for name, module in peft_model.get_base_model().named_modules()
        if isinstance(module, BaseTunerLayer)
    ]


def _described(names: list[str]) -> str:
    """``q_proj, v_proj (4 modules)``: the distinct last name components and how many modules."""
    short = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name in names))
    return f"{', '.join(short)} ({len(names)} module{'' if len(names) == 1 else 's'})"


def apply_lora(model, lora: LoraParams, *, gradient_checkpointing: str | bool):
    """Wrap ``model`` in a peft LoRA model: base frozen, everything trainable (adapters, ``modules_to_save``)
    in fp32.

    ``gradient_checkpointing``: the policy (``engine.model.recompute``; a boolean is full/off), applied to a
    4-bit base after ``prepare_quantized``, so that ``selective`` stays every other layer.
    """
    from peft import LoraConfig, TaskType, get_peft_model

    from fastlm.engine.model.recompute import enable_checkpointing, resolve_policy

    policy = resolve_policy({True: "full", False: "off"}.get(gradient_checkpointing, gradient_checkpointing))
    if lora.load_in_4bit:
        prepare_quantized(model)
        enable_checkpointing(model, policy)
    if policy != "off":
        model.enable_input_require_grads()
    check_named_modules(model, lora)
    targets = target_modules(model, lora.target_modules)
    task = TaskType.SEQ_2_SEQ_LM if getattr(model.config, "is_encoder_decoder", False) else TaskType.CAUSAL_LM
    config = LoraConfig(
        task_type=task,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias=lora.bias,
        modules_to_save=lora.modules_to_save,
        use_rslora=lora.use_rslora,
        use_dora=lora.use_dora,
        init_lora_weights={"default": True}.get(lora.init, lora.init),
    )
    started = time.perf_counter()
    try:
        with _seeded_decomposition(lora.init):
            peft_model = get_peft_model(model, config)
    except ValueError as error:  # e.g. target modules not found in the model
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            f"{PARAM}.target_modules = {lora.target_modules!r} does not fit the model: {first}",
            fix=f"set {PARAM}.target_modules to auto or to Linear module names of the model.",
        ) from error
    transposed = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in peft_model.named_modules()
            if type(getattr(module, "base_layer", None)).__name__ == "Conv1D"
        }
    )
    if lora.init == "olora" and transposed:  # peft's OLoRA reads W as [out x in]: shapes mismatch in forward
        raise ConfigError(
            f"{PARAM}.init = 'olora' cannot decompose this model's {', '.join(transposed)} layers (GPT-2's "
            "Conv1D holds its weight transposed).",
            fix=f"set {PARAM}.init: pissa or default for this model.",
        )
    _say_biasless(peft_model, lora.bias)
    for parameter in peft_model.parameters():  # modules_to_save copies keep the base's 16-bit dtype
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
    saved_modules_compute_in_fp32(peft_model)
    if moves_base_weights(lora):
        _remember_initial_adapters(peft_model)
        log.info(
            "%s init: the adapted weights decomposed in %.1f s (in every process that builds the model)%s",
            init_name(lora.init),
            time.perf_counter() - started,
            "; pissa_niter_<n> draws a randomized SVD, far quicker on large weights"
            if lora.init == "pissa"
            else "",
        )
    if lora.fused_forward:
        from fastlm.engine.model.lora_forward import fuse_lora_forward, group_shared_inputs

        fuse_lora_forward(peft_model)
        if lora.shared_input:
            group_shared_inputs(peft_model)
    counts = parameter_counts(peft_model)
    saved = f"; fully training {', '.join(lora.modules_to_save)}" if lora.modules_to_save else ""
    kind = "DoRA" if lora.use_dora else "LoRA"
    kind += " (rank-stabilized: alpha / sqrt(r))" if lora.use_rslora else ""
    kind += f" ({init_name(lora.init)} init)" if lora.init != "default" else ""
    log.info(
        "%s r=%d alpha=%g adapting %s%s: %s trainable of %s parameters (%.3f%%)",
        kind,
        lora.r,
        lora.alpha,
        _described(adapted_modules(peft_model)),
        saved,
        f"{counts['trainable_parameters']:,}",
        f"{counts['total_parameters']:,}",
        100 * counts["trainable_share"],
    )
    return peft_model


def _say_biasless(peft_model, bias: str) -> None:
    """``lora.bias: all`` trains every bias of the model, ``lora_only`` those of the adapted modules (peft's
    rule): one warning where there is none to train (a Llama's projections and norms have no bias), as the
    setting then changes nothing."""
    if bias == "none":
        return
    if bias == "all":
        where = "the model has no bias parameters"
        found = [
            name
            for name, _ in peft_model.named_parameters()
            if name.endswith(".bias") and "lora_" not in name
        ]
    else:
        modules = adapted_modules(peft_model)
        where = f"the adapted modules, {_described(modules)}, carry no bias"
        base = peft_model.get_base_model()
        found = [name for name in modules if base.get_submodule(name).get_base_layer().bias is not None]
    if not found:
        log.warning(
            "%s.bias: %s trains nothing beyond the adapters: %s, so the setting changes nothing; set "
            "%s.bias: none.",
            PARAM,
            bias,
            where,
            PARAM,
        )


def _floats_to(dtype: torch.dtype, value):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value


def _inputs_to_own_dtype(dtype: torch.dtype, module, args, kwargs):
    return tuple(_floats_to(dtype, a) for a in args), {k: _floats_to(dtype, v) for k, v in kwargs.items()}


def _output_to(dtype: torch.dtype, module, args, output):
    return _floats_to(dtype, output)


def saved_modules_compute_in_fp32(peft_model) -> None:
    """Each ``modules_to_save`` copy (trained in fp32) over a 16-bit frozen base (QLoRA's compute dtype, or
    ``base_dtype`` bf16) computes in its fp32: its floating inputs (the head's bf16 hidden states) cast to
    fp32, as peft casts an adapter's; its output goes on in the dtype the frozen module gave (the embedding's,
    a norm's: bf16, so the layers after it compute as in a run without it), the LM head's stays fp32 (logits
    for the fp32 loss). Without mixed precision (``runtime.precision: fp32``, what ``auto`` measures on CPU)
    a bf16 input met the fp32 weight (``expected m1 and m2 to have the same dtype``); under autocast the casts
    change nothing autocast does not."""
    get_head = getattr(peft_model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    for wrapper in peft_model.modules():
        copies = getattr(wrapper, "modules_to_save", None)
        original = getattr(wrapper, "original_module", None)
        if not isinstance(copies, torch.nn.ModuleDict) or original is None:
            continue
        frozen = next((p.dtype for p in original.parameters() if p.is_floating_point()), torch.float32)
        for copy in copies.values():
            own = next((p.dtype for p in copy.parameters() if p.is_floating_point()), frozen)
            if own == frozen:
                continue
            copy.register_forward_pre_hook(functools.partial(_inputs_to_own_dtype, own), with_kwargs=True)
            if wrapper is not head:
                copy.register_forward_hook(functools.partial(_output_to, frozen))


INIT_NAMES = {"gaussian": "Gaussian", "pissa": "PiSSA", "olora": "OLoRA"}


def init_name(init: str) -> str:
    """``train.model.lora.init``'s name in the log: ``pissa_niter_4`` -> ``PiSSA``."""
    return INIT_NAMES[init.split("_niter_")[0]]


_INITIAL = (
    "_fastlm_initial_adapters"  # PiSSA's / OLoRA's initial A and B, kept on the model until it is saved
)


def moves_base_weights(lora: LoraParams) -> bool:
    """PiSSA and OLoRA move each weight's principal part into the adapters: the base trains changed."""
    return lora.init not in engine_config.BASE_KEEPING_INITS


@contextlib.contextmanager
def _seeded_decomposition(init: str):
    """A randomized SVD (``pissa_niter_<n>``) drawn from a fixed seed, the caller's random state kept: every
    process that builds the model (the workers, the launcher's parent, a resume) derives the same residual
    base. The other inits are exact decompositions, or random adapters that the trained ones replace."""
    if "_niter_" not in init:
        yield
        return
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []  # this process's GPU alone
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        yield


def _remember_initial_adapters(peft_model) -> None:
    from peft import get_peft_model_state_dict

    initial = {
        name: tensor.detach().to("cpu", copy=True)
        for name, tensor in get_peft_model_state_dict(peft_model).items()
        if ".lora_A." in name or ".lora_B." in name
    }
    object.__setattr__(peft_model, _INITIAL, initial)


def save_generation_config(peft_model, folder: Path) -> None:
    """An encoder-decoder's generation config into its adapter folder: how it generates as it trained
    (``encoder_decoder.generate_as_trained``: the decoder start token and a forced BOS, which the base's own
    config may lack); ``load_adapter_model`` gives it to the base the adapter is loaded or merged into."""
    base = peft_model.get_base_model()
    generation = getattr(base, "generation_config", None)
    if generation is not None and getattr(base.config, "is_encoder_decoder", False):
        generation.save_pretrained(str(folder))


_said_rebuilt: set[str] = set()


def adapter_generation_config(model, folder: str | Path) -> None:
    """``model`` (the base of the adapter in ``folder``) gets the generation config saved with the adapter
    (``save_generation_config``), where the folder holds one. An encoder-decoder adapter folder saved without
    one (an earlier fastlm) gets the setting its training used, rebuilt from what the folder holds: the
    base's decoder start and the tokens the folder's tokenizer puts before a text (``TextEnds.head``, as
    ``batching.seq2seq_batching`` gives them to ``generate_as_trained``), said once per folder."""
    if not (Path(folder) / GENERATION_CONFIG).is_file():
        if getattr(model.config, "is_encoder_decoder", False):
            _rebuild_generation_config(model, folder)
        return
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig.from_pretrained(str(folder))
    start = model.generation_config.decoder_start_token_id
    if start is not None:
        model.config.decoder_start_token_id = start


def _rebuild_generation_config(model, folder: str | Path) -> None:
    """``generate_as_trained`` on ``model`` as training called it, from the adapter folder's tokenizer and the
    base config; one line in the log per folder (a warning where the folder has no tokenizer to rebuild it
    from: the base's generation config then stays)."""
    from transformers import AutoTokenizer

    from fastlm.engine.data.collators import TextEnds
    from fastlm.engine.model.encoder_decoder import generate_as_trained

    key = str(Path(folder).resolve())
    start = model.config.decoder_start_token_id
    start = model.config.pad_token_id if start is None else start
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as error:  # noqa: BLE001 - no tokenizer (or none that loads): nothing to rebuild from
        if key not in _said_rebuilt:
            _said_rebuilt.add(key)
            log.warning(
                "The encoder-decoder LoRA adapter in %s has no %s (saved by an earlier fastlm) and no "
                "tokenizer that loads (%s): it generates with its base's generation config, which may "
                "differ from how it trained.",
                folder,
                GENERATION_CONFIG,
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
            )
        return
    if start is None:
        return
    head = TextEnds.of(tokenizer).head
    generate_as_trained(model, int(start), head)
    if key not in _said_rebuilt:
        _said_rebuilt.add(key)
        forced = f"{head[0]} forced first" if len(head) == 1 else "none forced"
        log.info(
            "The encoder-decoder LoRA adapter in %s has no %s (saved by an earlier fastlm): it generates as "
            "it trained, from its base's decoder start token %d and what its tokenizer puts before a text "
            "(%s)",
            folder,
            GENERATION_CONFIG,
            int(start),
            forced,
        )


def save_adapter(peft_model, folder: str | Path) -> None:
    """``save_pretrained`` the adapter into ``folder``; a PiSSA or OLoRA adapter as its trained difference,
    a plain LoRA of rank 2 r for the unchanged base (peft's conversion: ``W_res + s B A = W + s [B | -B0]
    [A ; A0]``, alpha doubled, or times sqrt(2) when rank-stabilized), its other trained weights as they
    are."""
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    peft_model.save_pretrained(str(folder), safe_serialization=True)
    save_generation_config(peft_model, folder)
    initial = peft_model.__dict__.get(_INITIAL)
    if initial is None:
        return
    weights = folder / "adapter_model.safetensors"
    trained = load_file(weights)
    if set(initial) - set(trained):
        raise RuntimeError(f"the saved adapter lacks {sorted(set(initial) - set(trained))[:3]}")
    for name, start in initial.items():
        if ".lora_A." in name:
            trained[name] = torch.cat([trained[name], start.to(trained[name].dtype)], dim=0).contiguous()
        else:
            trained[name] = torch.cat([trained[name], -start.to(trained[name].dtype)], dim=1).contiguous()
    save_file(trained, weights, metadata={"format": "pt"})
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise RuntimeError("a PiSSA or OLoRA adapter with per-module ranks has no conversion here")
    config["r"] *= 2
    config["lora_alpha"] *= math.sqrt(2) if config.get("use_rslora") else 2
    config["init_lora_weights"] = True
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def prepare_quantized(model) -> None:
    """A 4-bit base made ready for adapters: every parameter frozen, and every one that is not 4-bit left
    in the compute dtype, as the frozen base of a plain LoRA run is.

    peft's ``prepare_model_for_kbit_training`` casts every 16-bit parameter that is not 4-bit to fp32: for a
    128k-vocabulary 3B model the embedding and LM head grow by 0.8 GB per copy (1.6 GB for the tied one) and
    the head multiplies in fp32. Even fp32 *norms* alone cost more than they give: an fp32 weight times a
    bf16 input makes each norm's output fp32, bitsandbytes' layers return their input's dtype, so the
    residual stream, the MLP and every projection's output turn fp32 from the first layer on (twice the
    activation memory and traffic, and a cast before each 4-bit matmul), while a frozen norm's statistics
    are computed in fp32 either way (tests/engine/model/test_qlora_forward.py). Gradient checkpointing is
    the caller's (``recompute.enable_checkpointing``, non-reentrant)."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for module in model.modules():
        # bitsandbytes repacks a 4-bit weight, in place and for good, for its CPU inference kernel (which
        # has no backward) the first time the layer runs in eval mode without gradients on a CPU with
        # AVX-512 bf16: training after an evaluation pass would back-propagate nothing through the base
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def adapter_description(lora: LoraParams) -> str:
    """The adapter as configured, in a few words (the summary's ``adapter``, the report's model line)."""
    kind = f"{'Q' if lora.load_in_4bit else ''}{'DoRA' if lora.use_dora else 'LoRA'}"
    parts = [f"r {lora.r}", f"alpha {lora.alpha:g}"]
    if lora.use_rslora:
        parts.append("rank-stabilized scaling")
    if lora.init != "default":
        parts.append(f"{lora.init} init")
    if lora.loraplus_lr_ratio is not None:
        parts.append(f"B at {lora.loraplus_lr_ratio:g}x the rate")
    if lora.load_in_4bit:
        parts.append("NF4 base")
    return f"{kind} ({', '.join(parts)})"


def parameter_counts(model) -> dict:
    """Trainable and total parameters (each shared tensor once; 4-bit packed weights counted unpacked)."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
    else:
        total = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "trainable_parameters": int(trainable),
        "total_parameters": int(total),
        "trainable_share": round(trainable / total, 6) if total else 0.0,
    }


def base_weights_digest(folder: str | Path) -> dict[str, str]:
    """``{tensor name: digest}`` of the weights of a model folder (``{file name: digest}`` for a
    ``pytorch_model*.bin``, which has no tensor index to read).

    A tensor's digest (SHA-256, 16 hex digits) covers its dtype, shape and bytes: whole up to 64 KiB (norms,
    biases, small layers), else 4 blocks of 4 KiB spread from its first byte to its last. A ``.bin`` file's
    covers its size and 256 such blocks. A multi-GB base costs a few MB of reads (7B: ~300 tensors, ~5 MB,
    milliseconds from a warm cache); a retrained, fine-tuned or other model changes every sampled block, and
    a change confined to the unsampled middle of a large tensor alone would go unseen. Neither paths, shard
    layout nor file metadata count: the same weights moved, re-sharded or re-saved match.
    """
    from fastlm.engine.model import pretrained

    digests: dict[str, str] = {}
    for pattern in pretrained.WEIGHT_PATTERNS:
        for path in sorted(Path(folder).glob(pattern)):
            if not path.is_file() or path.name.endswith(".index.json"):
                continue
            with path.open("rb") as handle:
                tensors = _safetensors_index(handle) if path.suffix == ".safetensors" else None
                if tensors is None:  # a .bin file, or a header that does not parse: the file as a whole
                    size = path.stat().st_size
                    digests[path.name] = _sampled_digest(handle, f"{size}", 0, size, _FILE_BLOCKS)
                    continue
                for name, (dtype, shape, start, end) in tensors.items():
                    digests[name] = _sampled_digest(handle, f"{dtype}{shape}", start, end, _TENSOR_BLOCKS)
    return dict(sorted(digests.items()))


def folder_identity(folder: str | Path, suffixes: tuple[str, ...] | None = None) -> str:
    """A digest (24 hex digits) of the files in ``folder`` and below it (those whose name ends in one of
    ``suffixes`` when given) by their names and content: a safetensors file's tensors as
    :func:`base_weights_digest` samples them (dtype, shape and bytes, whole up to 64 KiB, else 4 spread
    blocks), any other file's bytes whole up to 16 MiB, else its size and 256 spread blocks of 4 KiB.

    File metadata does not count: a folder copied or restored (new inodes and times) keeps its identity, and
    other weights written over a file, its size and time put back (``cp -p``, ``rsync -t``), change it. A
    multi-GB model costs a few MB of reads (as ``base_weights_digest``); a change confined to the unsampled
    middle of a large tensor alone would go unseen."""
    root = Path(folder)
    digest = hashlib.sha256()
    files = sorted(
        path
        for path in root.rglob("*")
        if path.is_file() and (suffixes is None or path.name.endswith(tuple(suffixes)))
    )
    for path in files:
        digest.update(f"{path.relative_to(root).as_posix()}\n".encode())
        for name, value in _file_digests(path).items():
            digest.update(f"{name}:{value}\n".encode())
    return digest.hexdigest()[:24]


_WHOLE_FILE = 16 * 2**20  # bytes: a file other than safetensors read whole up to this size


def _file_digests(path: Path) -> dict[str, str]:
    """``{tensor: digest}`` of a safetensors file; ``{"": digest}`` of another file (or one whose header does
    not parse)."""
    with path.open("rb") as handle:
        tensors = _safetensors_index(handle) if path.suffix == ".safetensors" else None
        if tensors is not None:
            return {
                name: _sampled_digest(handle, f"{dtype}{shape}", start, end, _TENSOR_BLOCKS)
                for name, (dtype, shape, start, end) in sorted(tensors.items())
            }
        size = os.fstat(handle.fileno()).st_size
        handle.seek(0)
        if size <= _WHOLE_FILE:
            return {"": hashlib.sha256(handle.read()).hexdigest()[:16]}
        return {"": _sampled_digest(handle, f"{size}", 0, size, _FILE_BLOCKS)}


_WHOLE = 64 * 1024  # bytes: read whole up to this size
_BLOCK = 4096
_TENSOR_BLOCKS, _FILE_BLOCKS = 4, 256


def _safetensors_index(handle) -> dict[str, tuple[str, list, int, int]] | None:
    """``{tensor: (dtype, shape, first byte, end byte)}`` from a safetensors header; None when it does not
    parse (loading the file then names the damage)."""
    head = handle.read(8)
    if len(head) < 8:
        return None
    length = int.from_bytes(head, "little")
    try:
        header = json.loads(handle.read(length))
        begin = 8 + length
        return {
            name: (
                entry["dtype"],
                list(entry["shape"]),
                begin + int(entry["data_offsets"][0]),
                begin + int(entry["data_offsets"][1]),
            )
            for name, entry in header.items()
            if name != "__metadata__"
        }
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, MemoryError, OverflowError):
        return None


def _sampled_digest(handle, described: str, start: int, end: int, blocks: int) -> str:
    """SHA-256 (16 hex digits) of ``described`` and the bytes ``start:end`` of ``handle``: whole up to
    ``_WHOLE`` bytes, else ``blocks`` blocks of ``_BLOCK`` bytes spread from the first byte to the last."""
    digest = hashlib.sha256(f"{described}|{end - start}|".encode())
    if end - start <= _WHOLE:
        reads = [(start, max(end - start, 0))]
    else:
        step = (end - start - _BLOCK) / (blocks - 1)
        reads = [(start + round(index * step), _BLOCK) for index in range(blocks)]
    for offset, length in reads:
        handle.seek(offset)
        digest.update(handle.read(length))
    return digest.hexdigest()[:16]


BASE_DIGEST = "base_digest.json"  # beside adapter_config.json: the base weights the adapter was trained on
_BASE_RECORD = "_fastlm_base_weights"  # the record, kept on the LoRA model from build to save
_warned_unchecked: set[str] = set()
_said_4bit: set[str] = set()


def remember_base(peft_model, base: str | Path) -> None:
    """Digest the base folder the adapters are trained on (at build time: what the training reads), and a
    4-bit base's quantization (``quantized``: ``quantization_record``, null for a 16- or 32-bit base; a
    folder without the entry was saved before it was recorded, ``say_unrecorded_quantization``)."""
    record = {
        "base_model": str(base),
        "weights": base_weights_digest(base),
        "method": "per tensor: sha256 of dtype, shape and its bytes, whole up to 64 KiB, else 4 spread "
        "4 KiB blocks (fastlm.engine.model.lora.base_weights_digest)",
        "quantized": quantization_record(peft_model),
    }
    object.__setattr__(peft_model, _BASE_RECORD, record)


def _base_name(name: str) -> str:
    """A module's name in the plain base model, from its name in the peft model."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def quantization_record(peft_model) -> dict | None:
    """How a QLoRA base was quantized, for ``BASE_DIGEST`` (None for a 16- or 32-bit base): the 4-bit
    modules (named in the plain base model), bitsandbytes' quantization settings, and ``dtype``, what the
    base was loaded in before quantizing (the compute dtype: its other weights trained in it too). The
    adapter's model is these 4-bit weights plus the adapter; ``load_adapter_model`` rebuilds them."""
    modules, state, storage = [], None, None
    for name, module in peft_model.named_modules():
        weight = getattr(module, "weight", None)
        if type(weight).__name__ == "Params4bit" and weight.quant_state is not None:
            modules.append(_base_name(name))
            state, storage = weight.quant_state, weight.quant_storage
    if state is None:
        return None
    return {
        "format": "bitsandbytes 4-bit",
        "quant_type": state.quant_type,
        "blocksize": int(state.blocksize),
        "double_quant": bool(state.nested),
        "quant_storage": str(storage).removeprefix("torch."),
        "dtype": str(state.dtype).removeprefix("torch."),
        "modules": sorted(set(modules)),
    }


def _recorded_quantization(folder: str | Path) -> dict | None:
    try:
        record = json.loads((Path(folder) / BASE_DIGEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # check_base has said what is wrong with it
    quantized = record.get("quantized") if isinstance(record, dict) else None
    return quantized if isinstance(quantized, dict) else None


def as_trained_in_4bit(base_model, quantized: dict, folder: str | Path) -> None:
    """``base_model`` (its folder's weights, loaded in 16 or 32 bits) made the base a QLoRA adapter trained
    on, in place: each 4-bit module's weight quantized as the training's base was (``quantized``:
    ``quantization_record``) and dequantized back into the model's dtype, every other weight rounded to the
    dtype the training held it in. The adapter then gives the model that trained (merged: up to the merge's
    rounding); the folder's own weights with the adapter would be a model that never trained."""
    try:
        from bitsandbytes.functional import dequantize_4bit, quantize_4bit
    except ImportError as error:
        raise ConfigError(
            f"the LoRA adapter in {folder} was trained on a 4-bit (QLoRA) base, and rebuilding those 4-bit "
            f"weights needs bitsandbytes, which does not import here ({error}).",
            fix="pip install 'bitsandbytes>=0.50' (CPU, or CUDA), then load or merge the adapter again.",
        ) from error
    dtype = getattr(torch, quantized["dtype"])
    four_bit = set(quantized["modules"])
    missing = sorted(four_bit - {name for name, _ in base_model.named_modules()})
    if missing:
        raise ConfigError(
            f"the LoRA adapter in {folder} was trained on a 4-bit base with modules its base model lacks "
            f"({', '.join(missing[:3])}).",
            fix="merge it over the base it was trained on (python -m fastlm merge-adapter --base <dir>).",
        )
    done = set()
    with torch.no_grad():
        for name in sorted(four_bit):
            weight = base_model.get_submodule(name).weight
            packed, state = quantize_4bit(
                weight.detach().to(dtype).contiguous(),
                blocksize=quantized["blocksize"],
                compress_statistics=quantized["double_quant"],
                quant_type=quantized["quant_type"],
                quant_storage=getattr(torch, quantized["quant_storage"]),
            )
            weight.copy_(dequantize_4bit(packed, state).to(weight.dtype))
            done.add(id(weight))
        for param in base_model.parameters():
            if id(param) not in done and param.dtype.is_floating_point:
                done.add(id(param))
                param.copy_(param.to(dtype).to(param.dtype))
    if str(Path(folder).resolve()) not in _said_4bit:
        _said_4bit.add(str(Path(folder).resolve()))
        log.info(
            "The LoRA adapter in %s was trained on the 4-bit %s weights of its base (QLoRA): its base "
            "weights are those, dequantized to %s (the model that trained, which the adapter is merged "
            "into; the base folder's own weights with this adapter would be a model that never trained)",
            folder,
            quantized["quant_type"].upper(),
            str(next(base_model.parameters()).dtype).removeprefix("torch."),
        )


def write_base_digest(peft_model, folder: str | Path) -> None:
    """Write ``BASE_DIGEST`` into a saved adapter folder: the record taken at build time, else (a model built
    elsewhere) the base folder's digest now. A base that is no local folder (a hub id) gets none."""
    record = peft_model.__dict__.get(_BASE_RECORD)
    if record is None:
        config = peft_model.peft_config[getattr(peft_model, "active_adapter", "default")]
        base = getattr(config, "base_model_name_or_path", None)
        if not base or not Path(base).is_dir():
            return
        remember_base(peft_model, base)
        record = peft_model.__dict__[_BASE_RECORD]
    # where the base lies from the adapter and in the project (the working folder of every run): a project
    # moved or copied whole finds its own base there, from the adapter or from a copy of it elsewhere in it
    base = Path(record["base_model"]).resolve()
    record = {
        **record,
        "base_relative": os.path.relpath(base, Path(folder).resolve()),
        "base_in_project": project_relative(base),
    }
    (Path(folder) / BASE_DIGEST).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def check_base(folder: str | Path, base: str | Path) -> None:
    """Refuse, in one line, a base folder whose weights are not the ones the adapter of ``folder`` was trained
    on; an adapter saved without ``BASE_DIGEST`` (an earlier fastlm) loads with one warning."""
    path = Path(folder) / BASE_DIGEST
    if not path.is_file():
        if str(Path(folder).resolve()) not in _warned_unchecked:
            _warned_unchecked.add(str(Path(folder).resolve()))
            log.warning(
                "The LoRA adapter in %s has no %s (saved by an earlier fastlm): it is merged onto %s "
                "without checking that those are the base weights it was trained on.",
                folder,
                BASE_DIGEST,
                base,
            )
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))["weights"]
        if not isinstance(saved, dict):
            raise TypeError("weights is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path} is unreadable ({error}): the base weights of the LoRA adapter in {folder} "
            "cannot be checked.",
            fix="restore the adapter folder from a backup, or train the adapter again.",
        ) from error
    now = base_weights_digest(base)
    changed = sorted(name for name in saved.keys() | now.keys() if saved.get(name) != now.get(name))
    if changed:
        how = {
            name: "appeared" if name not in saved else "is gone" if name not in now else "changed"
            for name in changed
        }
        what = ", ".join(f"{name} {how[name]}" for name in changed[:3]) + (", ..." * (len(changed) > 3))
        raise ConfigError(
            f"the base model folder {base} of the LoRA adapter in {folder} no longer holds the weights the "
            f"adapter was trained on ({len(changed)} of {len(saved)} weights differ from {BASE_DIGEST}: "
            f"{what}): merged, it would be a model that was never trained.",
            fix=f"put the original base model back in {base} (or pass its folder: python -m fastlm "
            "merge-adapter --base <dir>), or train the adapter again on this base "
            "(kedro run --pipeline=train).",
        )


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> str:
    """The base model folder an adapter was trained on: where it lies relative to the adapter, as it did when
    the adapter was saved (``BASE_DIGEST``'s ``base_relative``: a project moved or copied whole), when that
    folder exists; else ``base_model_name_or_path`` of its config. Its weights are checked on loading."""
    recorded = json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8"))[
        "base_model_name_or_path"
    ]
    try:
        digest = json.loads((Path(folder) / BASE_DIGEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        digest = {}
    digest = digest if isinstance(digest, dict) else {}
    places = (
        (Path(folder).resolve(), digest.get("base_relative")),
        (Path.cwd().resolve(), digest.get("base_in_project")),  # a copy of the adapter elsewhere in it
    )
    for start, relative in places:
        if isinstance(relative, str) and (start / relative).resolve().is_dir():
            return str((start / relative).resolve())
    return recorded


def load_adapter_model(folder: str | Path, *, base: str | None = None, merge: bool = True, **load_args):
    """The base model (``base`` or the adapter config's) with the adapter of ``folder``, in fp32, offline.

    ``merge=True`` folds the adapters into the weights and returns a plain transformers model (what
    generation and evaluation want: no adapter overhead); else the peft model. A base that ties weights to
    one tensor (a head to its input embedding: Llama-3.2-1B/3B, Qwen3-4B; BART's head and its encoder's and
    decoder's embeddings) is untied for the merge, so that an adapter on one of them changes that one alone,
    as in training; tied again where the merged weights are all still equal.
    """
    from fastlm.engine.model import pretrained

    base = base or adapter_base(folder)
    if not Path(base).is_dir():
        raise ConfigError(
            f"the base model folder {base} of the LoRA adapter in {folder} does not exist.",
            fix="put the base model back there, or merge the adapter over its new folder: python -m fastlm "
            f"merge-adapter --adapter {folder} --base <new folder> --out <merged>, then use the merged model "
            "(predict.model=<merged>).",
        )
    check_base(folder, base)
    args = {"local_files_only": True, "dtype": torch.float32, **load_args}
    checkpoint = pretrained.inspect_checkpoint(
        base,
        str(Path(base).resolve()),
        label=f"the base model {base} of the LoRA adapter in {folder}",
        trust_remote_code=args.get("trust_remote_code", False),
        local_files_only=True,
    )
    base_model = pretrained.load_pretrained(checkpoint, new_weights_param=None, **args)
    quantized = _recorded_quantization(folder)
    if quantized is not None:  # QLoRA: the 4-bit weights it trained on, not the folder's
        as_trained_in_4bit(base_model, quantized, folder)
    adapter_generation_config(base_model, folder)
    size = len(pretrained.folder_vocabulary(folder) or ())
    if size > base_model.get_input_embeddings().num_embeddings:  # trained with train.model.resize_embeddings
        log.info("Growing the embedding of %s to the %d tokens of the adapter's tokenizer", base, size)
        base_model.resize_token_embeddings(size)
    tied = _tied_weights(base_model) if merge else {}
    if tied:
        _set_tied(base_model, tied, False)
    model = _load_adapter_whole(base_model, folder)
    if not merge:
        return model
    merged = model.merge_and_unload()
    weight = merged.get_parameter
    if tied and all(torch.equal(weight(target), weight(source)) for target, source in tied.items()):
        _set_tied(merged, tied, True)  # no adapter on any of them: one tensor again, saved once
    return merged


def _tied_weights(model) -> dict[str, str]:
    """The weights ``model`` ties to another (transformers' ``all_tied_weights_keys``: target -> source) that
    are one tensor in it: a decoder-only head and its input embedding; BART's head and its encoder's and
    decoder's embeddings to ``shared``."""
    keys = dict(getattr(model, "all_tied_weights_keys", None) or {})
    return {
        target: source
        for target, source in keys.items()
        if model.get_parameter(target) is model.get_parameter(source)
    }


def _set_tied(model, tied: dict[str, str], on: bool) -> None:
    """Tie each of ``tied``'s weights to its source (one tensor) or give it a copy of its own; the config (a
    multimodal model's text config too) and the model's list of tied weights say so, for the folder it is
    saved to (an untied weight is saved and loaded as itself)."""
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.tie_word_embeddings = on
    for target, source in tied.items():
        owner, _, name = target.rpartition(".")
        weight = model.get_parameter(source)
        own = weight if on else torch.nn.Parameter(weight.detach().clone())
        setattr(model.get_submodule(owner), name, own)
    model.all_tied_weights_keys = dict(tied) if on else {}


def _load_adapter_whole(base_model, folder: str | Path):
    """``PeftModel.from_pretrained``, refusing a cut-off adapter file or adapter weights missing from it (peft
    only warns and leaves those adapters at their initial values)."""
    from peft import PeftModel

    from fastlm.engine.model import pretrained

    fix = "train the adapter again (its folder is incomplete), or restore the folder from a backup."
    pretrained.check_safetensors(folder, str(folder), fix=fix)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base_model, str(folder))
    for warning in caught:
        text = str(warning.message)
        if "missing adapter keys" in text:
            keys = re.findall(r"'([^']+)'", text)
            raise ConfigError(
                f"the LoRA adapter in {folder} does not load whole: {len(keys)} adapter weights are "
                f"missing from it ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}).",
                fix=fix,
            )
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return model


def say_unrecorded_quantization(folder: str | Path) -> None:
    """One warning where the adapter folder's ``BASE_DIGEST`` has no ``quantized`` entry (saved before the
    quantization was recorded): whether it trained on a 4-bit base is unknown, and a QLoRA adapter would be
    merged into the base folder's full-precision weights, not the 4-bit ones it trained on. A folder without
    ``BASE_DIGEST`` at all has ``check_base``'s warning."""
    try:
        record = json.loads((Path(folder) / BASE_DIGEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(record, dict) and "quantized" not in record:
        log.warning(
            "The LoRA adapter in %s was saved before its %s recorded the base's quantization: if it trained "
            "with %s.load_in_4bit (QLoRA), this merge uses the base folder's full-precision weights, not "
            "the 4-bit weights it trained on (a model that never trained). Fix: train it again (`kedro run "
            "--pipeline=train` records the quantization), or load the base in 4-bit yourself "
            "(BitsAndBytesConfig(load_in_4bit=True)) and apply the adapter with peft's "
            "PeftModel.from_pretrained.",
            folder,
            BASE_DIGEST,
            PARAM,
        )


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def saved_dtype(folder: str | Path) -> torch.dtype:
    """The dtype a model folder's weights are saved in: the one most of its fp32, bf16 or fp16 safetensors
    tensors have (by elements; what its size on disk is made of). A quantized folder's packed 4-bit or fp8
    tensors do not count: its unquantized weights' dtype. A folder without safetensors (``pytorch_model.bin``)
    has its config's ``dtype`` (``torch_dtype``), else fp32, what transformers saves by default."""
    from fastlm.engine.model import pretrained

    elements: dict[torch.dtype, int] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with path.open("rb") as handle:
            for dtype, shape, _, _ in (_safetensors_index(handle) or {}).values():
                if dtype in _SAFETENSORS_DTYPES:
                    dtype = _SAFETENSORS_DTYPES[dtype]
                    elements[dtype] = elements.get(dtype, 0) + math.prod(shape)
    if elements:
        return max(elements, key=elements.__getitem__)
    checkpoint = pretrained.inspect_checkpoint(str(folder), str(folder), local_files_only=True)
    named = getattr(checkpoint.config, "dtype", None) or getattr(checkpoint.config, "torch_dtype", None)
    named = getattr(torch, named, None) if isinstance(named, str) else named
    return named if named in _SAFETENSORS_DTYPES.values() else torch.float32


def merge_adapter(folder: str | Path, *, base: str | None = None, dtype: str = "auto"):
    """A full model: the adapter of ``folder`` merged into its base (then ``save_pretrained`` it), its weights
    in ``dtype`` (``MERGE_DTYPES``; ``auto``: the base folder's saved dtype, ``saved_dtype``: a bf16 base
    merges to bf16, an fp32 one to fp32; a QLoRA adapter's too, its 4-bit base weights dequantized).

    The merge computes in fp32: the base's weights load exactly into it, ``W + scale * B @ A`` is taken there
    (peft's ``merge_and_unload``), and each merged weight is cast once to ``dtype``; a weight beyond its range
    (fp16: 65504) is refused in one line rather than written as inf."""
    if dtype not in MERGE_DTYPES:
        raise ConfigError(
            f"the merge dtype {dtype!r} is not one of {', '.join(MERGE_DTYPES)}.",
            fix="use --dtype auto (the base's saved dtype), float32, bfloat16 or float16.",
        )
    base = base or adapter_base(folder)
    model = load_adapter_model(folder, base=base, merge=True)
    say_unrecorded_quantization(folder)
    _cast_weights(model, saved_dtype(base) if dtype == "auto" else getattr(torch, dtype), asked=dtype)
    model.config.use_cache = True  # a model for inference again
    return model


def _cast_weights(model, dtype: torch.dtype, *, asked: str) -> None:
    """``model``'s floating parameters and saved buffers cast to ``dtype`` in place (a tied weight stays one
    tensor); one that overflows it (finite before, inf after) is refused in one line. Buffers that are not
    saved (rotary frequencies) keep their dtype, as ``from_pretrained`` in that dtype keeps them."""
    name = str(dtype).removeprefix("torch.")
    saved = set(model.state_dict())
    with torch.no_grad():
        for weight, param in model.named_parameters():
            if param.is_floating_point() and param.dtype != dtype:
                cast = param.data.to(dtype)
                if not torch.isfinite(cast).all() and torch.isfinite(param.data).all():
                    largest = param.data.abs().max().item()
                    how = f"--dtype {asked}" + (": the base's saved dtype" if asked == "auto" else "")
                    raise ConfigError(
                        f"the merged weight {weight} holds values up to {largest:.3g}, beyond the range of "
                        f"{name} ({how}): written in it, they would be inf.",
                        fix="merge with --dtype bfloat16 (fp32's range, half its size) or --dtype float32.",
                    )
                param.data = cast
        for buffer, value in list(model.named_buffers()):
            if buffer in saved and value.is_floating_point() and value.dtype != dtype:
                owner, _, leaf = buffer.rpartition(".")
                model.get_submodule(owner).register_buffer(leaf, value.to(dtype), persistent=True)


def trains_part_only(model: torch.nn.Module) -> bool:
    """Whether some of ``model``'s weights are frozen (LoRA: its base): what it saves, hands back and
    checkpoints is its trained weights alone (``load_trained_weights`` reads them back)."""
    return any(not param.requires_grad for param in model.parameters())


def load_trained_weights(model: torch.nn.Module, trained: dict) -> None:
    """A LoRA model's trained weights (``trained``: exactly its trainable parameters, as a trainable-only
    checkpoint or a worker hands them back) into ``model``, built over its base."""
    expected = {name for name, param in model.named_parameters() if param.requires_grad}
    if set(trained) != expected:
        raise RuntimeError(
            f"the trained weights hold {len(trained)} tensors where the model trains {len(expected)} "
            f"(first differences: {sorted(set(trained) ^ expected)[:3]})"
        )
    model.load_state_dict(trained, strict=False)
