"""The weights attacker of split fine-tuning (attacks/splitft/weights_label.py): the label set of a step read
from the client's weight update, by hand on a linear head, on real split steps of the tiny model with SGD
and AdamW, its pairing of steps, and its skip where the head does not train."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from attacks.splitft import weights_label
from attacks.splitft.cell import assess
from attacks.splitft.white_box import ServerCopy
from harness.adversary_view import AdversaryView, Exposure
from harness.models import load_model
from harness.splitft import defences, trainable
from harness.splitft.client import make_optimizer
from harness.splitft.data import load_split_data
from harness.splitft.step import CLIENT_WEIGHTS, Recorder, split_step

from ..conftest import CONF
from ..conftest import model_cfg as _model_cfg

SECTION = OmegaConf.load(CONF / "splitft" / "default.yaml")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _f1(truth, guess) -> float:
    tp = len(set(truth) & set(guess))
    return 0.0 if tp == 0 else 200.0 * tp / (len(set(truth)) + len(set(guess)))


def _linear_head_update(optimizer: str):
    """One step of a V × d linear head on N positions whose hidden states share a mean direction (as an
    LM's final hidden states do): the update ΔW, the labels and the rows' gradient."""
    gen = torch.Generator().manual_seed(1)
    V, d, N = 40, 16, 12
    mu = torch.randn(d, generator=gen)
    h = mu + 0.3 * torch.randn(N, d, generator=gen)
    y = torch.randint(0, V, (N,), generator=gen)
    head = torch.nn.Linear(d, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(0.1 * torch.randn(V, d, generator=gen))
    before = head.weight.detach().clone()
    opt = make_optimizer(optimizer, [head.weight], lr=0.1)
    torch.nn.functional.cross_entropy(head(h), y).backward()
    grad = head.weight.grad.clone()
    opt.step()
    return head.weight.detach() - before, sorted(set(y.tolist())), grad


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_by_hand_one_step_of_a_linear_head_gives_exactly_its_labels(optimizer):
    """ΔW = −η (P − Y)ᵀH / N (SGD) or its sign step (AdamW's first): the rows anti-aligned with the median
    row are exactly the batch's labels. SGD's mean row is zero (Σ_v g_v = 0), so it could not anchor; AdamW
    moves every row by the same norm, so a norm score could not rank."""
    delta, labels, grad = _linear_head_update(optimizer)
    assert 1 < len(labels) < delta.shape[0] // 2
    assert weights_label.predict(delta) == labels
    median_row = delta.median(dim=0).values.norm()
    if optimizer == "sgd":
        torch.testing.assert_close(delta, -0.1 * grad)
        assert delta.mean(dim=0).norm() < 1e-5 * median_row          # the mean anchors nothing
    else:
        norms = delta.norm(dim=-1)
        assert float(norms.max() / norms.min()) < 1.01               # every row moved by ≈ η√d
        by_norm = norms.topk(len(labels)).indices.tolist()
        assert _f1(labels, by_norm) < 50.0


def _split_updates(optimizer: str, steps: int = 3, train_head: bool = True, name: str = "tiny-llama-4l",
                   lora: dict | None = None):
    """Per client c < `steps`, one split step from the same start on its own batch of real text with a
    fresh optimizer (each pair a first step), recorded as the view would: client_weights at step 10c
    (before) and 10c + 1 (after), both of client c in round 1. Returns the view, the truth, the public blocks."""
    k, m = (1, 3) if name == "tiny-llama-4l" else (1, 2)
    cfg = _model_cfg(name)
    loaded = load_model(cfg)
    model = loaded.model
    data = load_split_data(OmegaConf.merge(SECTION.data, {"seq_len": 16, "n_train": 24, "n_heldout": 8,
                                                          "n_align": 8}), loaded.tokenizer, 1, 0)
    blocks = torch.tensor(data.clients[0], dtype=torch.long)
    part, names = trainable.make_trainable(model, k, m, lora, train_head)
    start = trainable.state(model, names)
    params = dict(model.named_parameters())
    exposures, truth, steps_meta = [], {}, {}
    for c in range(steps):
        trainable.load(model, names, start)
        record = Recorder(step=10 * c)
        record.add(CLIENT_WEIGHTS, "theta_a_c", None, trainable.flat(model, names))
        ids = blocks[4 * c:4 * c + 4]
        split_step(part, defences.Defence(), ids, make_optimizer(optimizer, [params[n] for n in names], 3e-3),
                   record=record, send_gradient=train_head)
        exposures += record.exposures
        exposures.append({"channel": CLIENT_WEIGHTS, "op": "theta_a_c", "layer": None, "step": 10 * c + 1,
                          "tensor": trainable.flat(model, names)})
        truth[10 * c] = record.truth[0]
        steps_meta.update({10 * c: {"client": c, "round": 1}, 10 * c + 1: {"client": c, "round": 1}})
    view = AdversaryView([Exposure(e["op"], e["layer"], e["step"], tuple(e["tensor"].shape), e["tensor"],
                                   e["channel"]) for e in exposures],
                         {"splitft": {"k": k, "m": m, "lora": lora or {"enabled": False}, "weight_layout": names,
                                      "train_head": train_head, "grad_up": None, "optimizer": optimizer,
                                      "lr": 3e-3, "steps": steps_meta}})
    return view, cfg, truth, data.align


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_split_steps_give_their_label_sets_far_above_the_references(optimizer):
    """On real split steps of the tiny model (untied head in C; AdamW at its first step) the predicted set
    is the batch's distinct labels; another step's labels (the control) score only what the public
    frequency prior scores; the positive control (one fresh undefended step) reads the same."""
    view, cfg, truth, public = _split_updates(optimizer)
    copy = ServerCopy(view, cfg)
    assert weights_label.why_not(copy) is None
    assert weights_label.step_pairs(copy) == [(0, 1), (10, 11), (20, 21)]
    guesses = weights_label.infer_label_sets(copy)
    sets = [weights_label.label_set(truth[s]["ids"]) for s, _ in guesses]
    own = [_f1(t, g) for t, (_, g) in zip(sets, guesses)]
    other = [_f1(sets[i], g) for i in range(3) for j, (_, g) in enumerate(guesses) if i != j]
    prior = [_f1(t, weights_label.frequency_prior(public, len(g))) for t, (_, g) in zip(sets, guesses)]
    assert min(own) > 80.0 and sum(own) / len(own) > 90.0, own
    assert sum(other) / len(other) < sum(prior) / len(prior) + 10.0 < min(own) - 40.0, (other, prior)
    plain = weights_label.infer_label_sets(copy, weights_label.undefended_updates(copy, truth))
    assert all(_f1(a, b) > 95.0 for (_, a), (_, b) in zip(guesses, plain))
    scores = assess("weights_label", sets, [g for _, g in guesses], sets, [g for _, g in plain], 1.0, 5.0,
                    kind="set", prior_guesses=[weights_label.frequency_prior(public, len(g)) for _, g in guesses],
                    plain_prior_guesses=[weights_label.frequency_prior(public, len(g)) for _, g in plain])
    assert scores["weights_label_token_f1"] == pytest.approx(sum(own) / 3)
    assert scores["weights_label_reference_token_f1"] == max(scores["weights_label_prior_token_f1"],
                                                              scores["weights_label_exposure_free_token_f1"])
    assert scores["weights_label_verdict"] == "leak" and scores["weights_label_positive_control_pass"]
    assert "weights_label_top1" not in scores


def test_adamw_momentum_carries_the_previous_batch_into_the_next_update():
    """Two AdamW steps of one client: the second update (its m̂ weighs the first gradient ≈ 47 %) still
    recovers its own batch's labels but predicts labels of the first batch too: precision falls."""
    cfg = _model_cfg("tiny-llama-4l")
    loaded = load_model(cfg)
    model = loaded.model
    data = load_split_data(OmegaConf.merge(SECTION.data, {"seq_len": 16, "n_train": 24, "n_heldout": 8,
                                                          "n_align": 8}), loaded.tokenizer, 1, 0)
    blocks = torch.tensor(data.clients[0], dtype=torch.long)
    part, names = trainable.make_trainable(model, 1, 3, None)
    opt = make_optimizer("adamw", [dict(model.named_parameters())[n] for n in names], 3e-3)
    weights, batches = [], [blocks[0:4], blocks[8:12]]
    for ids in batches:
        weights.append(trainable.flat(model, names))
        split_step(part, defences.Defence(), ids, opt)
    weights.append(trainable.flat(model, names))
    view = AdversaryView([Exposure("theta_a_c", None, s, tuple(w.shape), w, CLIENT_WEIGHTS)
                          for s, w in enumerate(weights)],
                         {"splitft": {"k": 1, "m": 3, "lora": {"enabled": False}, "weight_layout": names,
                                      "train_head": True, "steps": {s: {"client": 0, "round": 1} for s in range(3)}}})
    (_, first), (_, second) = weights_label.infer_label_sets(ServerCopy(view, cfg))
    own = [weights_label.label_set(ids) for ids in batches]
    only_first = set(own[0]) - set(own[1])
    assert _f1(own[0], first) > 90.0
    recall = len(set(second) & set(own[1])) / len(own[1])
    precision = len(set(second) & set(own[1])) / len(second)
    assert recall > 0.9 and precision < 0.85 and set(second) & only_first


def test_steps_of_another_client_or_round_are_not_paired():
    """A pair straddling a FedAvg (another round) or two clients is not an update of one client."""
    cfg = _model_cfg("tiny-llama-4l")
    model = load_model(cfg).model
    _, names = trainable.make_trainable(model, 1, 3, None)
    w = trainable.flat(model, names)
    owners = {0: (0, 1), 1: (0, 1), 2: (0, 2), 3: (1, 2), 4: (1, 2), 6: (1, 2)}
    view = AdversaryView([Exposure("theta_a_c", None, s, tuple(w.shape), w, CLIENT_WEIGHTS) for s in owners],
                         {"splitft": {"k": 1, "m": 3, "lora": {"enabled": False}, "weight_layout": names,
                                      "train_head": True,
                                      "steps": {s: {"client": c, "round": r} for s, (c, r) in owners.items()}}})
    assert weights_label.step_pairs(ServerCopy(view, cfg)) == [(0, 1), (3, 4)]


@pytest.mark.parametrize("name, lora, train_head, reason", [
    ("tiny-llama-tied", None, False, "tied to A's input embedding"),
    ("tiny-llama-4l", {"enabled": True, "r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]}, True, "LoRA"),
])
def test_a_frozen_head_is_skipped_with_its_reason(name, lora, train_head, reason):
    """With the head frozen (tied to a frozen A; LoRA) the attacker has nothing to read: a reason, no score."""
    view, cfg, _, _ = _split_updates("sgd", steps=2, train_head=train_head, name=name, lora=lora)
    copy = ServerCopy(view, cfg)
    assert weights_label.step_pairs(copy) == [(0, 1), (10, 11)]     # the pairs are there; the head is not
    assert weights_label.head_span(copy) is None
    assert reason in weights_label.why_not(copy)


def test_an_untied_head_trains_with_a_frozen_and_is_attacked():
    """splitft.train_head=false freezes A; an untied LM head is C's and still trains, so it is read."""
    view, cfg, truth, _ = _split_updates("sgd", steps=2, train_head=False)
    copy = ServerCopy(view, cfg)
    assert weights_label.why_not(copy) is None
    for s, g in weights_label.infer_label_sets(copy):
        assert _f1(weights_label.label_set(truth[s]["ids"]), g) > 90.0
