"""The ``--precision`` and ``--compile`` options the speed benchmarks share: one setting for every contender."""

from __future__ import annotations

import argparse

# --compile: auto = each contender's own default, on / off = the same for all (fastlm runtime.compile, the peers'
# torch_compile=True only for "on").
COMPILE_FLAGS = {"auto": "auto", "on": True, "off": False}


def add_speed_flags(parser: argparse.ArgumentParser, peers: str) -> None:
    """``--precision {fp32,bf16}`` and ``--compile {auto,on,off}``; ``peers`` names the other side in the help."""
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help=f"every contender: fastlm runtime.precision, {peers} bf16=True (bf16 autocast)")
    parser.add_argument("--compile", choices=tuple(COMPILE_FLAGS), default="auto",
                        help=f"torch.compile: auto = each contender's default (fastlm runtime.compile auto, {peers} "
                             f"off); on = fastlm compile=true and {peers} torch_compile=True; off = neither")
