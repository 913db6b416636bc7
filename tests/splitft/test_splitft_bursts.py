"""Issue 31 item 5: every crossing of PrivPair's alignment bursts enters the view, and BiSR(b) reads the
gradient with the round-start global C as well as with the step's C."""
from __future__ import annotations

import torch
from omegaconf import OmegaConf

from attacks.splitft.bisr_backward import bisr_backward
from attacks.splitft.white_box import ServerCopy
from harness.adversary_view import AdversaryView, Exposure
from harness.splitft.client import ClientTrainer, Recipe
from harness.splitft.step import ALIGN_DOWN, ALIGN_OPS, ALIGN_UP, CLIENT_WEIGHTS, GRAD_UP

from ..conftest import CONF
from ..conftest import model_cfg as _model_cfg

SECTION = OmegaConf.load(CONF / "splitft" / "default.yaml")


def _round(configuration: str, epsilon: float | None, local_steps: int, **extra):
    section = OmegaConf.to_container(OmegaConf.merge(SECTION, {
        "k": 1, "m": 2, "rounds": 1, "local_steps": local_steps, "batch_size": 2,
        "record": {"last_rounds": 1, "steps_per_round": local_steps}, **extra}))
    blocks = torch.randint(0, 500, (6, 8), generator=torch.Generator().manual_seed(3)).tolist()
    trainer = ClientTrainer(Recipe(_model_cfg(), None, configuration, epsilon, section, 0, [blocks], blocks[:4],
                                   blocks[:2]))
    return trainer, trainer.run_round(0, 1, trainer.initial_state(), {}, 0)


def test_every_burst_step_of_a_recorded_step_enters_the_view():
    # local steps 0..4, bursts before step 0 (warm-up, 3 adapter steps) and before steps 2 and 4 (2 each):
    # 3 + 2 + 2 = 7 burst steps, each with the 6 crossings of ALIGN_OPS
    _, out = _round("privpair", 1.0, 5, privpair={"hidden": 8, "align_every": 2, "align_steps": 2,
                                                 "warmup_align_steps": 3, "align_batch_size": 2})
    crossings = [e for e in out.exposures if e["channel"] in (ALIGN_UP, ALIGN_DOWN)]
    assert len(crossings) == 7 * len(ALIGN_OPS)
    assert [(e["channel"], e["op"]) for e in crossings] == list(ALIGN_OPS) * 7
    # a burst's crossings are filed under the private step it precedes
    assert sorted({e["step"] for e in crossings}) == [0, 2, 4]
    by_op = [e["tensor"] for e in crossings]
    # the adapters move between burst steps, so consecutive steps send different s'_A (not one copy 7 times)
    assert not torch.equal(by_op[1], by_op[1 + len(ALIGN_OPS)])
    # the gradient sent up has s'_B's shape, the one returned s'_A's
    assert by_op[4].shape == by_op[3].shape and by_op[5].shape == by_op[1].shape


def _view(trainer: ClientTrainer, out, local_steps: int) -> AdversaryView:
    exposures = [Exposure(e["op"], e["layer"], int(e["step"]), tuple(e["tensor"].shape), e["tensor"], e["channel"])
                 for e in out.exposures]
    meta = {"splitft": {"k": 1, "m": 2, "lora": trainer.section.lora, "train_head": True, "grad_up": None,
                        "weight_layout": list(trainer.names), "local_steps": local_steps}}
    return AdversaryView(exposures, meta)


def test_round_start_reading_equals_the_step_reading_with_one_local_step():
    # one local step per round: the step's C is the round's global C, so the two readings must agree exactly
    trainer, out = _round("splitft_none", None, 1)
    copy = ServerCopy(_view(trainer, out, 1), _model_cfg())
    kwargs = {"steps": 5, "lr": 1.0, "beta": 0.85, "temperature": 1.2, "max_examples": 2}
    assert bisr_backward(copy, **kwargs) == bisr_backward(copy, weights="round_start", **kwargs)


def test_round_start_reading_uses_the_round_s_first_weights():
    trainer, out = _round("splitft_none", None, 3)
    copy = ServerCopy(_view(trainer, out, 3), _model_cfg())
    steps = [e.step for e in copy.view.select(channel=GRAD_UP)]
    assert steps == [0, 1, 2] and [copy.round_start(s) for s in steps] == [0, 0, 0]
    weights = {e.step: e.tensor for e in copy.view.select(channel=CLIENT_WEIGHTS)}
    assert not torch.equal(weights[0], weights[2])   # the weights moved, so the readings differ in what they use
    # with only the last step recorded the round start is not in the view, and it says so
    partial = AdversaryView([e for e in copy.view.exposures if e.step == 2], copy.view.meta)
    assert ServerCopy(partial, _model_cfg()).round_start(2) is None
