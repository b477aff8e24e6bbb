"""Helpers shared by several test files (fixtures live in the conftest files, helpers here).

* ``project``: copies of the Kedro project and running a pipeline in-process,
* ``e2e``: the small split/train/report parameters the end-to-end tests share,
* ``toy_training``: the toy token data, tiny Llama and train parameters of the engine tests,
* ``tiny_llama``: a saved tiny Llama checkpoint with a Llama-style tokenizer,
* ``lora_models``: the LoRA parameters, train parameters and runs of the LoRA and adapter folder tests,
* ``tiny_models``: tiny Llamas built from configs for the collator and checkpoint tests,
* ``reporting``: summaries, histories and prompt/response frames of the reporting tests,
* ``browser``: headless Chromium for the HTML checks,
* ``renames``: a folder swap whose second rename fails,
* ``locked_store``: MLflow writes refused once as ``database is locked`` (another command writing the store).
"""
