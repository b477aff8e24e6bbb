"""Progress bar: ETA and tokens/s, refreshed from logging-step records only (no per-step sync)."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)


class Progress:
    """A tqdm bar on an interactive terminal; log lines otherwise; nothing but warnings when ``quiet``."""

    def __init__(self, total: int, *, initial: int = 0, quiet: bool = False):
        self.quiet = quiet
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, mininterval=0.5)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def show(self, record: dict) -> None:
        summary = (f"loss {record['loss']:.4f}  {record['real_tokens_per_s']:,.0f} tok/s  "
                   f"eta {record['eta_s'] or 0:,.0f}s")
        if self.bar is not None:
            self.bar.set_postfix_str(summary, refresh=False)
        elif not self.quiet:
            log.info("step %d: %s  lr %.2e  grad-norm %.3g  data-wait %.1f%%  padding-eff %.1f%%",
                     record["step"], summary, record["lr"] or 0, record["grad_norm"] or 0,
                     100 * record["data_wait_share"], 100 * (record["padding_efficiency"] or 0))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
