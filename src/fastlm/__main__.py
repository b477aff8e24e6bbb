"""``python -m fastlm`` runs the Kedro CLI of this project; ``python -m fastlm merge-adapter`` merges a LoRA
adapter into its base model and writes a full ``save_pretrained`` folder.

    python -m fastlm merge-adapter --adapter data/06_models/model --out data/06_models/merged
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

MERGE = "merge-adapter"


def main(*args, **kwargs):
    if not args and sys.argv[1:2] == [MERGE]:
        return merge_adapter_command(sys.argv[2:])
    from kedro.framework.cli.utils import find_run_command
    from kedro.framework.project import configure_project

    package_name = Path(__file__).parent.name
    configure_project(package_name)
    interactive = hasattr(sys, "ps1")
    kwargs["standalone_mode"] = not interactive
    run = find_run_command(package_name)
    return run(*args, **kwargs)


def merge_adapter_command(argv: list[str]) -> int:
    """Merge ``--adapter`` (a LoRA model folder from the train pipeline) into its base, write ``--out``.

    The output holds the merged weights (safetensors) and the adapter folder's tokenizer, and loads with
    ``AutoModelForCausalLM`` / ``AutoTokenizer`` like any full model. Its weights are in the dtype the base
    folder's are saved in (``--dtype auto``: a bf16 base gives a bf16 folder, its size; a QLoRA adapter's
    base folder likewise), or the one ``--dtype`` names; the merge computes in float32 and casts once. An
    existing ``--out`` is never replaced unless ``--overwrite`` is given; the folder is written atomically.
    """
    from fastlm.engine.config import MERGE_DTYPES

    parser = argparse.ArgumentParser(
        prog=f"python -m fastlm {MERGE}", description=merge_adapter_command.__doc__
    )
    parser.add_argument(
        "--adapter", default="data/06_models/model", help="LoRA adapter folder (adapter_config.json)"
    )
    parser.add_argument("--out", required=True, help="folder for the merged full model")
    parser.add_argument(
        "--base", default=None, help="base model folder (default: the one the adapter config names)"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=MERGE_DTYPES,
        help="dtype of the merged weights (default auto: the dtype the base folder's weights are saved in; "
        "the merge itself computes in float32 and casts once)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    args = parser.parse_args(argv)
    from fastlm.errors import FastlmError, InputDataError
    from fastlm.log_handler import quiet_library_imports

    quiet_library_imports()

    try:
        adapter, out = Path(args.adapter), Path(args.out)
        _check_adapter(adapter)
        if out.exists() and not out.is_dir():
            raise InputDataError(
                f"--out {out} is a file, not a folder: the merged model is a folder of files.",
                fix="choose a folder for --out (a new one, or an existing one with --overwrite).",
            )
        if args.base is not None and not Path(args.base).is_dir():
            raise InputDataError(
                f"--base {args.base} does not exist"
                + (" as a folder (it is a file)." if Path(args.base).exists() else "."),
                fix="give --base the folder that holds the adapter's base model (its config.json and "
                "weights), or leave --base out to use the one the adapter records.",
            )
        for role, folder in _read_folders(adapter, args.base):
            if out.resolve() == folder.resolve():
                raise InputDataError(
                    f"--out {out} would replace the {role} {folder}, which the merge reads.",
                    fix="choose another --out folder.",
                )
        if out.exists() and any(out.iterdir()) and not args.overwrite:
            raise InputDataError(
                f"{out} already exists and is not empty.", fix="choose another --out or add --overwrite."
            )
        dtype = _write_merged(adapter, out, args.base, args.dtype)
    except FastlmError as error:
        print(f"fastlm: error: {error}", file=sys.stderr)
        return error.exit_code
    print(f"Merged {adapter} into a full {dtype} model at {out}")
    return 0


def _check_adapter(adapter: Path) -> None:
    """One line where ``--adapter`` is no LoRA adapter folder: missing, a training checkpoint (kept for
    resuming its run), or a folder without adapter_config.json."""
    from fastlm.engine.checkpoint.layout import MARKER
    from fastlm.errors import InputDataError

    fix = "point --adapter at the model folder of a run with train.model.lora.enabled: true."
    if (adapter / "adapter_config.json").is_file():
        return
    if not adapter.exists():
        raise InputDataError(f"--adapter {adapter} does not exist.", fix=fix)
    if adapter.name.startswith("checkpoint-") and (adapter / MARKER).is_file():
        run = adapter.parent.name
        raise InputDataError(
            f"--adapter {adapter} is a checkpoint of the training {run} (weights, optimizer and state kept "
            "for resuming it), not an adapter folder.",
            fix=f"merge the model folder that training saved (data/06_models/runs/{run}/model in the "
            f"project), or finish it first (kedro run --pipeline=train --params run_name={run}).",
        )
    raise InputDataError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json).", fix=fix)


def _read_folders(adapter: Path, base: str | None) -> list[tuple[str, Path]]:
    """The folders a merge reads: the adapter, and its base (``--base``, else its adapter_config.json's)."""
    import json

    if base is None:
        try:
            config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
            base = config.get("base_model_name_or_path")
        except (OSError, ValueError):
            base = None
    return [("adapter folder", adapter)] + ([("base model folder", Path(base))] if base else [])


def _write_merged(adapter: Path, out: Path, base: str | None, dtype: str) -> str:
    """Write the merged model and its tokenizer to ``out``; the dtype its weights are written in."""
    from transformers import AutoTokenizer

    from fastlm.datasets.atomic_folder import write_folder_atomically
    from fastlm.datasets.pretrained_model import TRAINING_DATA, for_inference
    from fastlm.engine.model.adapter_folder import merge_adapter

    model = merge_adapter(adapter, base=base, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(adapter), local_files_only=True)

    def write(folder: Path) -> None:
        # as a full fine-tune's folder is saved: the tokenizer's pad id in its generation config
        with for_inference(model, tokenizer):
            model.save_pretrained(str(folder), safe_serialization=True)
        tokenizer.save_pretrained(str(folder))
        if (adapter / TRAINING_DATA).is_file():  # how its training data was made: predict reads it
            shutil.copy2(adapter / TRAINING_DATA, folder / TRAINING_DATA)

    write_folder_atomically(out, write)
    return str(model.dtype).removeprefix("torch.")


if __name__ == "__main__":
    sys.exit(main())
