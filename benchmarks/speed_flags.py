"""The ``--precision`` and ``--compile`` options the speed benchmarks share: one setting for every contender."""

from __future__ import annotations

import argparse

# --compile: auto = each contender's own default, on / off = the same for all (fastlm runtime.compile, the peers'
# torch_compile=True only for "on").
COMPILE_FLAGS = {"auto": "auto", "on": True, "off": False}


def add_speed_flags(parser: argparse.ArgumentParser, peers: str) -> None:
    """``--precision``, ``--peer-precision`` and ``--compile``; ``peers`` names the other side in the help."""
    parser.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="fp32",
                        help=f"fastlm runtime.precision (auto: its default, bf16 where it measures faster); also "
                             f"{peers} bf16=True for bf16 unless --peer-precision says otherwise")
    parser.add_argument("--peer-precision", choices=("fp32", "bf16"), default=None,
                        help=f"{peers} precision (default: as --precision; fp32 with --precision auto)")
    parser.add_argument("--compile", choices=tuple(COMPILE_FLAGS), default="auto",
                        help=f"torch.compile: auto = each contender's default (fastlm runtime.compile auto, {peers} "
                             f"off); on = fastlm compile=true and {peers} torch_compile=True; off = neither")


def peer_bf16(args: argparse.Namespace) -> bool:
    """Whether the peers (Trainer, TRL) run with ``bf16=True``."""
    return (args.peer_precision or ("fp32" if args.precision == "auto" else args.precision)) == "bf16"


def speed_flag_args(args: argparse.Namespace) -> list[str]:
    """The flags again, for a contender's child process."""
    peer = ["--peer-precision", args.peer_precision] if args.peer_precision else []
    return ["--precision", args.precision, *peer, "--compile", args.compile]
