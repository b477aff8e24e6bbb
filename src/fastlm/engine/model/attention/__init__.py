"""Attention paths, one job per module: ``inputs`` (the device transfer and the model inputs or masks each
implementation needs to keep packed samples apart), ``kernels`` (the ``torch_varlen`` and ``sdpa_varlen``
attention functions, registered with transformers when ``kernels`` is imported) and ``choice`` (what
``auto`` picks, the path a compiled model trains on, SDPA meanwhile for generation).

Why a package: the three change for different reasons (a collator's format, a torch signature, a new
measurement), and the registered kernels are module-level state that must live in exactly one module.
"""
