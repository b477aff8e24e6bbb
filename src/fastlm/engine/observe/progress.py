"""Progress: one summary line per logging step (kept in the scrollback) and, on a terminal, a tqdm bar between
them; refreshed from logging-step records only (no per-step sync). One ETA: fastlm's (from the measured step
time after warm-up), in the line and on the bar; tqdm's own remaining-time estimate is not shown."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)
# tqdm's default bar without its "<remaining" estimate: the ETA is fastlm's, in the postfix.
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"


class Progress:
    """A summary log line at every logging step; on an interactive terminal also a tqdm bar; nothing but
    warnings when ``quiet``. ``label_smoothing`` (``train.loss.label_smoothing``): the line's loss is the
    smoothed one the run optimises, higher than the plain cross-entropy of the validation lines logged between
    them, and named so: ``train loss (label-smoothed 0.1) 3.8969`` (``reporting.summaries.train_loss_name``'s
    words); a run without it keeps ``loss 3.8969``."""

    def __init__(self, total: int, *, initial: int = 0, quiet: bool = False, label_smoothing: float = 0.0):
        self.quiet = quiet
        self.loss_name = f"train loss (label-smoothed {label_smoothing:g})" if label_smoothing else "loss"
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                unit="step",
                dynamic_ncols=True,
                mininterval=0.5,
                bar_format=BAR_FORMAT,
                file=sys.stderr,
            )

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def show(self, record: dict) -> None:
        if self.quiet:
            return
        eta = f"eta {record['eta_s'] or 0:,.0f}s"
        summary = f"{self.loss_name} {record['loss']:.4f}  {record['real_tokens_per_s']:,.0f} tok/s"
        line = (
            "step %d: %s  lr %.2e  grad-norm %.3g  data-wait %.1f%%  padding-eff %.1f%%  %s",
            record["step"],
            summary,
            record["lr"] or 0,
            record["grad_norm"] or 0,
            100 * record["data_wait_share"],
            100 * (record["padding_efficiency"] or 0),
            eta,
        )
        if self.bar is None:
            log.info(*line)
            return
        self.bar.set_postfix_str(f"{summary}  {eta}", refresh=False)
        with self.bar.external_write_mode(file=sys.stderr):  # the line above the bar, the bar redrawn below
            log.info(*line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
