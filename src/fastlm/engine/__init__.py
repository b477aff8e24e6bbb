"""The training engine: plain PyTorch, no Kedro imports, unit-tested on its own.

One concern per module (filled by the train issue): ``data`` (collators, packing, samplers),
``runtime`` (device, CUDA flags, environment), ``loop``, ``metrics``, ``checkpoint``, ``distributed``.
"""
