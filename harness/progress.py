"""Progress bars for every loop a person waits on (generation, training, capture, federated rounds).

One place decides how they look and when they stay quiet: they draw on stderr only when stderr is a
terminal (tqdm's disable=None), so CI logs, pipes and sweep-job logs get no bar noise, and they disappear
when done (leave=False) so the terminal keeps the results table.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def progress(iterable: Iterable[T] | None = None, *, desc: str, total: int | None = None, unit: str = "step",
             **kwargs: Any) -> Any:
    """A tqdm bar over `iterable` (or a manual one of `total` steps: call .update(n), then .close()).
    The rate and ETA are tqdm's own, in `unit`s per second (e.g. unit="token" for generation)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, file=sys.stderr, disable=None,
                dynamic_ncols=True, **kwargs)


@contextlib.contextmanager
def progress_with_logs(*, desc: str, total: int, unit: str, loggers: Iterable[str] = ()) -> Iterator[Any]:
    """A manual `progress` bar for a loop that logs while it runs (Flower's rounds): while the bar is open,
    the console handlers of the root logger and of `loggers` (by name) write through tqdm, which clears the
    bar, prints the line and redraws the bar below it, so a log line never lands on the bar's own line."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = progress(desc=desc, total=total, unit=unit)
    try:
        with logging_redirect_tqdm(loggers=[logging.root, *(logging.getLogger(n) for n in loggers)]):
            yield bar
    finally:
        bar.close()


# Read by tqdm when it is first imported (its defaults: TQDM_<ARG>, so lm-eval's and transformers' GGUF bars),
# by datasets and by the Hugging Face hub. Our own bars pass disable=None explicitly, which wins over TQDM_DISABLE.
LIBRARY_BAR_SWITCHES = ("TQDM_DISABLE", "HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS")


def quiet_bars_in_environment() -> None:
    """When stderr is not a terminal, switch off third-party progress bars through the environment, before
    any of them is imported (runners/run.py main()); sweep workers inherit it. A value the user set stays."""
    if sys.stderr.isatty():
        return
    for name in LIBRARY_BAR_SWITCHES:
        os.environ.setdefault(name, "1")


def quiet_library_bars() -> None:
    """Silence transformers' and the Hugging Face hub's own bars (weight loading) when stderr is not a
    terminal: unlike ours they draw into pipes and logs too. Called once per job (runners/run.py)."""
    if sys.stderr.isatty():
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # also the hub's (huggingface_hub.utils.disable_progress_bars)
