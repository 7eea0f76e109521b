"""Dilated attention inside tiny random transformers models (Llama and Qwen3, built from configs, nothing
downloaded), on the CPU in float64: (a) one whole-sequence branch of rate 1 gives sdpa's logits; (b) generation
with transformers' cache gives the tokens of generation without it; (c) packed documents (position_ids
restarting) give each document its own logits; (d) a training step gives finite gradients; (e) a config
without the pattern is refused; (f) left-padded prompts of different lengths get the tokens each gets alone;
grouped key/value heads are read as they are (no repeat)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the transformers integration needs the 'hf' extra "
                                                          "(pip install 'hilbert-lab[hf]')")

from hilbert_lab.integrations.transformers import NAME, register, use_dilated_attention  # noqa: E402

VOCAB = 48
PATTERN = ([8, 16, 32], [1, 2, 4])


pytestmark = pytest.mark.usefixtures("single_thread")  # decoding steps are tiny ops


def _model(family: str, *, kv_heads: int = 2, attention_dropout: float = 0.0, **extra):
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=kv_heads, max_position_embeddings=256, attention_dropout=attention_dropout,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa", **extra)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=8, **common))
    return model.double().eval()


def _ids(batch, length, seed=1):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


FAMILIES = ["llama", "qwen3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_whole_sequence_branch_of_rate_one_is_sdpa(family):
    model = _model(family)
    ids = _ids(2, 37)
    with torch.no_grad():
        dense = model(ids).logits
        use_dilated_attention(model, [1 << 20], [1])
        assert model.config._attn_implementation == NAME
        dilated = model(ids).logits
    assert (dense - dilated).abs().max() < 1e-10


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_with_the_cache_gives_the_tokens_without_it(family):
    model = use_dilated_attention(_model(family), *PATTERN)
    prompt = _ids(2, 11)
    cached = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                            use_cache=True, pad_token_id=0)
    plain = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                           use_cache=False, pad_token_id=0)
    assert cached.shape == (2, 41) and torch.equal(cached, plain)
    static = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                            cache_implementation="static", pad_token_id=0)  # keys past the written ones left out
    assert torch.equal(static, plain)
    with torch.no_grad():  # the pattern matters: dense attention gives other logits on the same tokens
        dilated = model(cached).logits
        model.set_attn_implementation("sdpa")
        assert (model(cached).logits - dilated).abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_documents_get_their_own_logits(family):
    model = use_dilated_attention(_model(family), *PATTERN)
    lengths = (13, 1, 40, 7)
    docs = [_ids(1, n, seed=i) for i, n in enumerate(lengths)]
    packed = torch.cat(docs, 1)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        together = model(packed, position_ids=position_ids).logits
        alone = torch.cat([model(doc).logits for doc in docs], 1)
    assert (together - alone).abs().max() < 1e-10


@pytest.mark.parametrize("family", FAMILIES)
def test_a_training_step_gives_finite_gradients(family):
    model = use_dilated_attention(_model(family, attention_dropout=0.1), *PATTERN).train()
    ids = _ids(2, 45)
    loss = model(ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and float(loss.detach()) > 0
    model.zero_grad()
    model.config.attention_dropout = 0.0
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.0
    packed = model(ids[:1], labels=ids[:1], position_ids=torch.cat([torch.arange(20), torch.arange(25)])[None]).loss
    packed.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_a_config_without_the_pattern_is_refused():
    model = _model("llama")
    model.set_attn_implementation(register())
    with pytest.raises(ValueError, match="dilated_segment_lengths and dilated_dilation_rates"):
        model(_ids(1, 5))
    model.config.dilated_segment_lengths, model.config.dilated_dilation_rates = [8], [16]
    with pytest.raises(ValueError, match="config.dilated_segment_lengths.*dilation_rates must not exceed"):
        model(_ids(1, 5))
    with pytest.raises(ValueError, match="name must be"):
        register("sdpa")


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_prompts_get_the_tokens_they_get_alone(family):
    model = use_dilated_attention(_model(family), *PATTERN)
    prompts = [_ids(1, n, seed=10 + n)[0] for n in (5, 19, 12)]
    width = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.zeros(width - len(p), dtype=torch.long), p]) for p in prompts])
    mask = torch.stack([torch.cat([torch.zeros(width - len(p), dtype=torch.long), torch.ones(len(p), dtype=torch.long)])
                        for p in prompts])
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=25, do_sample=False, pad_token_id=0)
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=25, do_sample=False, pad_token_id=0)
        got, want = batched[row, width:], alone[0, len(prompt):]  # alone stops at its end-of-sequence token
        assert torch.equal(got[:len(want)], want) and (got[len(want):] == 0).all(), row


def test_what_the_pattern_cannot_express_is_refused():
    model = use_dilated_attention(_model("llama"), *PATTERN)
    ids = _ids(1, 6)
    with pytest.raises(ValueError, match="4D attention mask"):
        model(ids, attention_mask=torch.ones(1, 1, 6, 6, dtype=torch.bool))
    qwen = _model("qwen3", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    use_dilated_attention(qwen, *PATTERN)
    with pytest.raises(ValueError, match="sliding_window = None"):
        qwen(ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_bf16_prefill_and_cached_steps_match_sdpa():
    """On the GPU in bf16: one whole-sequence branch of rate 1 gives sdpa's logits, and the logits of cached
    decoding steps under a dilated pattern equal the teacher-forced ones (bf16 tolerance)."""
    model = _model("llama").to("cuda", torch.bfloat16)
    ids = _ids(2, 300).cuda()
    with torch.no_grad():
        dense = model(ids).logits.float()
        use_dilated_attention(model, [1 << 20], [1])
        assert (model(ids).logits.float() - dense).abs().max() < 5e-2 * dense.abs().max()
        use_dilated_attention(model, [64, 128, 256], [1, 2, 4])
        full = model(ids).logits.float()
        out = model(ids[:, :200], use_cache=True)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        steps = [out.logits.float()]
        for position in range(200, 300):
            out = model(ids[:, position:position + 1], use_cache=True, past_key_values=cache)
            steps.append(out.logits.float())
    assert (torch.cat(steps, 1) - full).abs().max() < 5e-2 * full.abs().max()


def test_inference_mode_and_padding_inside_a_row():
    """Under torch.inference_mode (no version counters) and with right padding: the real tokens of each row get
    the logits they get alone."""
    model = use_dilated_attention(_model("llama"), *PATTERN)
    ids = _ids(2, 30)
    mask = torch.ones_like(ids)
    mask[1, 21:] = 0
    with torch.inference_mode():
        both = model(ids, attention_mask=mask).logits
        alone = model(ids[1:, :21]).logits
    assert (both[1, :21] - alone[0]).abs().max() < 1e-10


def test_attn_implementation_at_construction_and_the_pattern_in_a_saved_config(tmp_path):
    name = register()
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, attn_implementation=name,
                                      dilated_segment_lengths=[8, 16], dilated_dilation_rates=[1, 2])
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert model.config._attn_implementation == name
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=name)
    assert loaded.config.dilated_segment_lengths == [8, 16] and loaded.config.dilated_dilation_rates == [1, 2]
    ids = _ids(1, 20)
    with torch.no_grad():
        assert (loaded(ids).logits - model(ids).logits).abs().max() < 1e-6
