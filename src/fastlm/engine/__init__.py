"""The training engine: plain PyTorch, no Kedro imports, unit-tested on its own.

Sub-packages by concern, in layers (a lower one never imports a higher one; tests/test_architecture.py):
``paths`` (folders named relative to the project) < ``config`` (the validated ``train.*`` parameters) <
``data`` (datasets, batch schema, labels, packing, collators, samplers) < ``observe`` (metrics, rates, health,
progress, profiling) < ``distributed`` (ranks, DDP/FSDP2) < ``model`` (building, pretrained folders, LoRA,
attention, losses) < ``runtime`` (device, precision, threads, the first-steps probe) < ``batching`` (the
micro-batch stream) < ``checkpoint`` (files, resume plan, disk space) < ``evaluate`` (evaluation, generation)
< ``train`` (the loop and its components) < ``launch`` (one or several processes). See docs/architecture.md.
"""
