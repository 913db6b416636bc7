"""Progress bars for every loop a person waits on (generation, training, capture, federated rounds).

One place decides how they look and when they stay quiet: they draw on stderr only when stderr is a
terminal, so CI logs, pipes and sweep-job logs get no bar noise, unless asked with SPLITBENCH_PROGRESS=1 (a
log one follows with `tail -f`); SPLITBENCH_PROGRESS=0 silences them on a terminal too. They disappear when
done (leave=False) so the terminal keeps the results table. The same switch decides for the libraries' bars
(transformers, the hub, datasets, lm-eval's tqdm): quiet_bars_in_environment, quiet_library_bars.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
ASK = "SPLITBENCH_PROGRESS"


def bars_wanted() -> bool:
    """SPLITBENCH_PROGRESS=1 or 0 when the user set it, else whether stderr is a terminal."""
    asked = os.environ.get(ASK, "").strip().lower()
    if asked in ("1", "true", "yes", "on"):
        return True
    if asked in ("0", "false", "no", "off"):
        return False
    return sys.stderr.isatty()


def progress(iterable: Iterable[T] | None = None, *, desc: str, total: int | None = None, unit: str = "step",
             **kwargs: Any) -> Any:
    """A tqdm bar over `iterable` (or a manual one of `total` steps: call .update(n), then .close()).
    The rate and ETA are tqdm's own, in `unit`s per second (e.g. unit="token" for generation)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, file=sys.stderr, disable=not bars_wanted(),
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
# by datasets and by the Hugging Face hub. Our own bars pass `disable` explicitly, which wins over TQDM_DISABLE.
LIBRARY_BAR_SWITCHES = ("TQDM_DISABLE", "HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS")


def quiet_bars_in_environment() -> None:
    """When bars are not wanted (bars_wanted), switch off third-party progress bars through the environment,
    before any of them is imported (runners/run.py main(), runners/lm_eval_model.py); sweep workers inherit
    it. A value the user set stays."""
    if bars_wanted():
        return
    for name in LIBRARY_BAR_SWITCHES:
        os.environ.setdefault(name, "1")


def quiet_library_bars() -> None:
    """Silence transformers' and the Hugging Face hub's own bars (weight loading) when bars are not wanted
    (bars_wanted): unlike ours they draw into pipes and logs too. Called once per job (runners/run.py)."""
    if bars_wanted():
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # also the hub's (huggingface_hub.utils.disable_progress_bars)
