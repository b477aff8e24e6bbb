"""The ``--precision`` and ``--compile`` options the speed benchmarks share, and per-contender set-ups.

The options set every contender alike. A contender named ``NAME@SETUP`` (e.g.
``trainer_group_by_length@bf16``, ``trainer@bf16+compile``, ``fastlm@fp32``) runs with that set-up instead:
``fp32`` / ``bf16`` (fastlm's runtime.precision, the peers' ``bf16=True``), ``compile`` / ``eager`` (fastlm's
runtime.compile, the peers' ``torch_compile``). That is how one run measures a peer in each of its honest
set-ups and keeps the fastest.
"""

from __future__ import annotations

import argparse

# --compile: auto = each contender's own default, on / off = the same for all (fastlm runtime.compile, the
# peers' torch_compile=True only for "on").
COMPILE_FLAGS = {"auto": "auto", "on": True, "off": False}


def add_speed_flags(parser: argparse.ArgumentParser, peers: str) -> None:
    """``--precision``, ``--peer-precision`` and ``--compile``; ``peers`` names the other side in the help."""
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "auto"),
        default="auto",
        help=f"fastlm runtime.precision (auto: its default, bf16 where it measures faster); also "
        f"{peers} bf16=True for bf16 unless --peer-precision says otherwise",
    )
    parser.add_argument(
        "--peer-precision",
        choices=("fp32", "bf16"),
        default=None,
        help=f"{peers} precision (default: as --precision; fp32 with --precision auto)",
    )
    parser.add_argument(
        "--compile",
        choices=tuple(COMPILE_FLAGS),
        default="auto",
        help=f"torch.compile: auto = each contender's default (fastlm runtime.compile auto, {peers} "
        f"off); on = fastlm compile=true and {peers} torch_compile=True; off = neither",
    )


def peer_bf16(args: argparse.Namespace) -> bool:
    """Whether the peers (Trainer, TRL) run with ``bf16=True``."""
    return (args.peer_precision or ("fp32" if args.precision == "auto" else args.precision)) == "bf16"


def speed_flag_args(args: argparse.Namespace) -> list[str]:
    """The flags again, for a contender's child process."""
    peer = ["--peer-precision", args.peer_precision] if args.peer_precision else []
    return ["--precision", args.precision, *peer, "--compile", args.compile]


# NAME@SETUP: the flags a set-up word overrides, for that contender alone.
SETUPS = {
    "fp32": {"precision": "fp32", "peer_precision": "fp32"},
    "bf16": {"precision": "bf16", "peer_precision": "bf16"},
    "compile": {"compile": "on"},
    "eager": {"compile": "off"},
}


def split_setup(name: str) -> tuple[str, tuple[str, ...]]:
    """``"trainer@bf16+compile"`` -> ``("trainer", ("bf16", "compile"))``."""
    base, _, setup = name.partition("@")
    return base, tuple(word for word in setup.split("+") if word)


def contender_type(bases: tuple[str, ...]):
    """An argparse ``type`` accepting ``NAME`` or ``NAME@SETUP`` for NAME in ``bases``."""

    def parse(value: str) -> str:
        base, setup = split_setup(value)
        if base not in bases:
            raise argparse.ArgumentTypeError(f"unknown contender {base!r}: one of {', '.join(bases)}")
        unknown = [word for word in setup if word not in SETUPS]
        if unknown or ("@" in value and not setup):
            raise argparse.ArgumentTypeError(
                f"unknown set-up in {value!r}: words joined by '+' from {', '.join(SETUPS)}"
            )
        return value

    return parse


def with_setup(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """``args`` with the overrides of ``name``'s set-up words (a copy; ``args`` is left as it is)."""
    overrides = {key: value for word in split_setup(name)[1] for key, value in SETUPS[word].items()}
    return argparse.Namespace(**{**vars(args), **overrides})
