"""The training engine: plain PyTorch, no Kedro imports, unit-tested on its own.

One concern per module (see docs/architecture.md): ``data`` (labels, packing, collators, samplers), ``batching``,
``step``, ``loop``, ``checkpointer`` / ``checkpoint`` / ``resume``, ``records`` / ``metrics`` / ``health``,
``evaluation``, ``generation``, ``runtime``, ``distributed``, ``tune``.
"""
