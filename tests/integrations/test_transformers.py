"""Dilated attention inside tiny random transformers models (Llama and Qwen3, built from configs, nothing
downloaded), on the CPU in float64: (a) one whole-sequence branch of rate 1 gives sdpa's logits; (b) generation
with transformers' cache gives the tokens of generation without it; (c) packed documents (position_ids
restarting) give each document its own logits; (d) training gradients equal those of a dense float64 reference
model (the pattern's multiplicities from tests/attention/_oracle.py, same weights); (e) a config without the
pattern is refused; (f) left-padded prompts of different lengths get the tokens each gets alone; (g) position ids
changed in place between calls are read anew; (h) a saved model loads dilated; (i) mask-function overlays are
refused; grouped key/value heads are read as they are (no repeat); (j) random patterns, families, key/value heads and
packings (hypothesis) give the reference model's logits and gradients."""
from __future__ import annotations

import copy
import functools
import importlib.util
import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the transformers integration needs the 'hf' extra "
                                                          "(pip install 'hilbert-lab[hf]')")

from property_testing import given, settings, st  # noqa: E402

from hilbert_lab.integrations.transformers import (NAME, dilated_attention_forward, register,  # noqa: E402
                                                   use_dilated_attention)

_ORACLE_FILE = Path(__file__).parents[1] / "attention" / "_oracle.py"  # the pattern written from its definition
_spec = importlib.util.spec_from_file_location("_attention_oracle", _ORACLE_FILE)
_oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_oracle)

VOCAB = 48
PATTERN = ([8, 16, 32], [1, 2, 4])
RESTARTS = (torch.arange(40), torch.cat([torch.arange(13), torch.arange(27)]),
            torch.cat([torch.arange(5), torch.arange(30), torch.arange(5)]), torch.arange(40))


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


ORACLE = "dilated_float64_oracle"


def _oracle_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """The reference: dense float64 softmax attention over the pattern's multiplicities (tests/attention/_oracle.py,
    written from the definition), each document (position ids restarting) on its own, 0 for a query without keys;
    transformers' convention."""
    assert attention_mask is None and dropout == 0.0
    batch, heads, n, dim = query.shape
    config = module.config
    causal = is_causal if is_causal is not None else module.is_causal
    groups = heads // key.shape[1]
    k, v = key.double().repeat_interleave(groups, 1), value.double().repeat_interleave(groups, 1)
    positions = kwargs.get("position_ids")
    positions = (torch.arange(n)[None] if positions is None else positions).expand(batch, n).tolist()
    bias = torch.full((batch, heads, n, n), -math.inf, dtype=torch.float64)
    for row, pos in enumerate(positions):
        bounds = [0] + [i for i in range(1, n) if pos[i] != pos[i - 1] + 1] + [n]
        for a, b in zip(bounds, bounds[1:]):
            bias[row, :, a:b, a:b] = _log_multiplicity(tuple(config.dilated_segment_lengths),
                                                       tuple(config.dilated_dilation_rates),
                                                       getattr(config, "dilated_mode", "longnet"), causal, b - a, heads)
    keys = torch.isfinite(bias).any(-1, keepdim=True)  # a query the pattern gives no key: output 0, no gradient
    scale = dim ** -0.5 if scaling is None else scaling
    scores = query.double() @ k.transpose(-1, -2) * scale + torch.where(keys, bias, 0.0)
    return ((scores.softmax(-1) @ v) * keys).to(query.dtype).transpose(1, 2).contiguous(), None


@functools.lru_cache(maxsize=None)
def _log_multiplicity(lengths, rates, mode, causal, n, heads):
    return torch.from_numpy(_oracle.brute_multiplicity(lengths, rates, mode, causal, n, heads)).double().log()


def _oracle_model(model):
    """A copy of `model` (same weights, same config) whose attention is the float64 reference."""
    transformers.AttentionInterface.register(ORACLE, _oracle_attention)
    reference = copy.deepcopy(model)
    reference.set_attn_implementation(ORACLE)
    return reference


def _gradients(model, ids, position_ids):
    """(gradients of the summed next-token loss w.r.t. every parameter, the loss)."""
    model.zero_grad(set_to_none=True)
    logits = model(ids, position_ids=position_ids, use_cache=False).logits  # sdpa finds documents without a cache
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1),
                                             reduction="sum")
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads, float(loss.detach())


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


def test_rows_packed_each_their_own_way_match_the_float64_reference():
    """Each row of a batch with its own documents (position ids restarting at other places; one row a single
    document, one with rows the head_groups pattern leaves without keys): logits and training gradients equal the
    dense float64 reference model's."""
    model = use_dilated_attention(_model("qwen3", kv_heads=1), [3, 8], [1, 2], mode="head_groups").train()
    reference = _oracle_model(model)
    documents = ((29,), (4, 25), (13, 1, 9, 6), (29,))
    position_ids = torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in documents])
    ids = _ids(len(documents), 29, seed=3)
    with torch.no_grad():
        got, want = (m(ids, position_ids=position_ids, use_cache=False).logits for m in (model, reference))
    assert (got - want).abs().max() < 1e-10
    (got, loss), (want, want_loss) = (_gradients(m, ids, position_ids) for m in (model, reference))
    assert abs(loss - want_loss) < 1e-10
    assert max((a - b).abs().max().item() for a, b in zip(got, want)) < 1e-10


@st.composite
def models_and_rows(draw):
    """A random pattern (1-3 branches, either mode), model family, key/value heads, batch and length, and per row
    documents made by position ids that restart at random places (or no position ids)."""
    segments = sorted(set(draw(st.lists(st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 32, 64]), min_size=1, max_size=3))))
    batch, length = draw(st.integers(1, 3)), draw(st.integers(2, 40))
    rows = [draw(st.lists(st.integers(1, length - 1), max_size=3, unique=True)) for _ in range(batch)]
    return dict(family=draw(st.sampled_from(FAMILIES)), kv_heads=draw(st.sampled_from([1, 2, 4])), segments=segments,
                rates=[draw(st.integers(1, min(w, 4))) for w in segments],
                mode=draw(st.sampled_from(["longnet", "head_groups"])), batch=batch, length=length,
                restarts=None if draw(st.integers(0, 9)) < 3 else [sorted(cuts) for cuts in rows])


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(models_and_rows())
def test_random_patterns_and_documents_match_the_float64_reference(case):
    """Logits exactly (1e-10) and training gradients of a random model, pattern and packing equal the dense float64
    reference model's. Gradients to 1e-7 of their size: transformers' RMSNorm computes in float32 inside a float64
    model, so a last-bit difference of the attention's gradient (1e-17) may round a norm's gradient to the next
    float32 (3.7e-9 on q_proj of one case in 3000), while a wrong gradient is wrong by far more."""
    model = use_dilated_attention(_model(case["family"], kv_heads=case["kv_heads"]), case["segments"], case["rates"],
                                  mode=case["mode"]).train()
    reference = _oracle_model(model)
    length, position_ids = case["length"], None
    if case["restarts"] is not None:
        position_ids = torch.stack([torch.cat([torch.arange(b - a) for a, b in zip([0, *cuts], [*cuts, length])])
                                    for cuts in case["restarts"]])
    ids = _ids(case["batch"], length, seed=length)
    with torch.no_grad():
        got, want = (m(ids, position_ids=position_ids, use_cache=False).logits for m in (model, reference))
    assert (got - want).abs().max() < 1e-10
    (got, loss), (want, want_loss) = (_gradients(m, ids, position_ids) for m in (model, reference))
    assert abs(loss - want_loss) < 1e-10 * max(1.0, abs(want_loss))
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-7 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("family", FAMILIES)
def test_training_gradients_equal_the_float64_reference(family):
    """The gradients of a training step, one sequence per row and packed documents, equal the dense float64
    reference model's (same weights) and, for one whole-sequence branch of rate 1, sdpa's."""
    model = use_dilated_attention(_model(family), *PATTERN).train()
    reference = _oracle_model(model)
    ids = _ids(2, 45)
    packed = torch.cat([torch.arange(20), torch.arange(25)])[None].expand(2, -1)
    for position_ids in (None, packed):
        got, loss = _gradients(model, ids, position_ids)
        want, want_loss = _gradients(reference, ids, position_ids)
        assert abs(loss - want_loss) < 1e-12
        assert max((a - b).abs().max().item() for a, b in zip(got, want)) < 1e-10
    dense = copy.deepcopy(model)
    dense.set_attn_implementation("sdpa")
    use_dilated_attention(model, [1 << 20], [1])
    for position_ids in (None, packed):
        got, _ = _gradients(model, ids, position_ids)
        want, _ = _gradients(dense, ids, position_ids)
        assert max((a - b).abs().max().item() for a, b in zip(got, want)) < 1e-10


def test_a_training_step_with_attention_dropout_drops():
    model = use_dilated_attention(_model("llama", attention_dropout=0.5), *PATTERN).train()
    ids = _ids(2, 45)
    dropped, loss = _gradients(model, ids, None)
    plain, plain_loss = _gradients(_oracle_model(model).eval(), ids, None)  # eval mode: no dropout
    assert all(torch.isfinite(g).all() for g in dropped) and loss != plain_loss
    model.eval()
    assert max((a - b).abs().max().item() for a, b in zip(_gradients(model, ids, None)[0], plain)) < 1e-10


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


def test_gemv_linears_run_the_decoding_steps_linear_layers_and_keep_the_tokens(monkeypatch):
    """gemv_linears=True: every linear layer of each decoding step (q, k, v, o, gate, up, down per layer, the head)
    runs the GEMV (a float64 stand-in here, as on a GPU), the prompt's layers nn.Linear's product, and generate
    gives the tokens of the model without it."""
    from hilbert_lab.kernels import gemv_linear

    prompt = _ids(2, 11)

    def generate(model):
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                              cache_implementation="static", pad_token_id=0)

    want = generate(use_dilated_attention(_model("llama"), *PATTERN))
    calls = []
    monkeypatch.setattr(gemv_linear, "few_rows_gemv",
                        lambda x, w, b=None: x.numel() <= 8 * x.shape[-1] and not torch.is_grad_enabled())
    monkeypatch.setattr(gemv_linear, "gemv", lambda x, w, b, activation=None, residual=None:
                        calls.append((x.shape[:-1], tuple(w.shape))) or torch.nn.functional.linear(x, w, b))
    model = use_dilated_attention(_model("llama"), *PATTERN, gemv_linears=True)
    assert torch.equal(generate(model), want)
    per_step = [((2, 1), shape) for shape in [(32, 32), (16, 32), (16, 32), (32, 32), (48, 32), (48, 32), (32, 48)]]
    assert calls == [((2, 1), (VOCAB, 32))] + (per_step * 2 + [((2, 1), (VOCAB, 32))]) * 11  # prompt's last row
    with pytest.raises(ValueError, match="gemv_linears must be True or False"):
        use_dilated_attention(_model("llama"), *PATTERN, gemv_linears="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_gemv_linears_steps_match_the_float64_model():
    """On the GPU in float32 with gemv_linears=True: the cached steps' logits (every linear layer through the GEMV,
    counted) are the float64 model's within float32 sums."""
    from hilbert_lab.kernels import gemv_linear

    calls = []
    gemv = gemv_linear.gemv
    reference = use_dilated_attention(_model("llama"), [64, 128, 256], [1, 2, 4]).cuda()
    model = use_dilated_attention(copy.deepcopy(reference).float(), [64, 128, 256], [1, 2, 4], gemv_linears=True)
    ids = _ids(2, 240).cuda()
    try:
        gemv_linear.gemv = lambda *a, **kw: calls.append(a[1].shape) or gemv(*a, **kw)
        with torch.no_grad():
            want = reference(ids).logits[:, 200:]
            out = model(ids[:, :200], use_cache=True)
            cache = out.past_key_values
            steps = []
            for position in range(200, 240):
                out = model(ids[:, position:position + 1], use_cache=True, past_key_values=cache)
                steps.append(out.logits)
    finally:
        gemv_linear.gemv = gemv
    got = torch.cat(steps, 1).double()
    assert len(calls) == 40 * (7 * 2 + 1)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-4
    x = torch.randn(2, 1, 32, device="cuda")
    layer = model.lm_head
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):  # autocast's product, in its dtype
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight), rtol=0, atol=0)
        assert layer(x).dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_layouts_from_device_tensors():
    """On the GPU (float32): position ids changed in place under inference mode give a fresh tensor's logits, and
    left-padded rows (the layout kept on the per-forward mask) give the logits of each row alone."""
    model = use_dilated_attention(_model("llama"), *PATTERN).to("cuda", torch.float32)
    ids = _ids(2, 40).cuda()
    with torch.inference_mode():
        positions = torch.zeros(1, 40, dtype=torch.long, device="cuda")
        reused = [model(ids, position_ids=positions.copy_(values)).logits for values in RESTARTS]
        for values, got in zip(RESTARTS, reused):
            fresh = model(ids, position_ids=values[None].cuda()).logits
            assert (got - fresh).abs().max().item() < 1e-5
        mask = torch.ones_like(ids)
        mask[0, :15] = 0  # row 0: 15 tokens of left padding; decoding steps read its layout from the mask's copy
        settings = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, output_logits=True,
                        return_dict_in_generate=True)
        both = model.generate(ids, attention_mask=mask, **settings)
        alone = model.generate(ids[:1, 15:], attention_mask=mask[:1, 15:], **settings)
    want = alone.sequences[0, 25:]  # alone may stop earlier, at its end-of-sequence token
    assert torch.equal(both.sequences[0, 40:40 + len(want)], want)
    assert max((a[0] - b[0]).abs().max().item() for a, b in zip(both.logits, alone.logits)) < 1e-4


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
    """A model built with attn_implementation in its config records it on its first forward pass: saved after it,
    it loads dilated without naming the implementation."""
    name = register()
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, attn_implementation=name,
                                      dilated_segment_lengths=[8, 16], dilated_dilation_rates=[1, 2])
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert model.config._attn_implementation == name
    ids = _ids(1, 20)
    with torch.no_grad():
        want = model(ids).logits
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == name
    assert loaded.config.dilated_segment_lengths == [8, 16] and loaded.config.dilated_dilation_rates == [1, 2]
    with torch.no_grad():
        assert (loaded(ids).logits - want).abs().max() < 1e-6
        loaded.set_attn_implementation("sdpa")
        assert (loaded(ids).logits - want).abs().max() > 1e-3



def test_position_ids_changed_in_place_under_inference_mode():
    """Packed rows whose position ids restart elsewhere, written in place into one tensor between calls (no version
    counter under inference mode): each call gets the logits of a fresh tensor and of the float64 reference."""
    model = use_dilated_attention(_model("llama"), *PATTERN)
    reference = _oracle_model(model)
    ids = _ids(2, 40)
    with torch.inference_mode():
        positions = torch.zeros(1, 40, dtype=torch.long)
        reused = [model(ids, position_ids=positions.copy_(values)).logits for values in RESTARTS]
        for values, got in zip(RESTARTS, reused):
            fresh = model(ids, position_ids=values[None].clone()).logits
            want = reference(ids, position_ids=values[None].clone()).logits
            assert (got - fresh).abs().max().item() < 1e-10 and (fresh - want).abs().max().item() < 1e-10


def test_dilated_attention_forward_reads_position_ids_changed_in_place():
    config = transformers.LlamaConfig(dilated_segment_lengths=PATTERN[0], dilated_dilation_rates=PATTERN[1],
                                      dilated_mode="longnet")
    module = torch.nn.Module()
    module.config, module.is_causal = config, True
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(2, 4, 40, 8, generator=gen, dtype=torch.float64)
    key, value = (torch.randn(2, 2, 40, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    with torch.inference_mode():
        positions = torch.zeros(2, 40, dtype=torch.long)
        reused = [dilated_attention_forward(module, query, key, value, None, position_ids=positions.copy_(values))[0]
                  for values in RESTARTS]
        for values, got in zip(RESTARTS, reused):
            fresh, _ = dilated_attention_forward(module, query, key, value, None,
                                                 position_ids=values[None].expand(2, -1).clone())
            want, _ = _oracle_attention(module, query, key, value, None, position_ids=values[None].clone())
            assert (got - fresh).abs().max().item() < 1e-12 and (fresh - want).abs().max().item() < 1e-12


def test_a_saved_dilated_model_loads_dilated(tmp_path):
    """save_pretrained -> from_pretrained (no attn_implementation) gives the dilated model's logits, and so does a
    second round trip of the loaded model; the config file names the implementation."""
    model = use_dilated_attention(_model("llama"), *PATTERN)
    ids = _ids(2, 40)
    model.save_pretrained(tmp_path / "first")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "first", dtype=torch.float64)
    assert loaded.config._attn_implementation == NAME
    with torch.no_grad():
        want = model(ids).logits
        assert (loaded(ids).logits - want).abs().max() < 1e-10
        loaded.save_pretrained(tmp_path / "second")
        again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "second", dtype=torch.float64)
        assert (again(ids).logits - want).abs().max() < 1e-10
        model.set_attn_implementation("sdpa")  # the pattern matters: dense attention gives other logits
        assert (model(ids).logits - want).abs().max() > 1e-3


def test_a_saved_dilated_model_is_refused_where_its_attention_is_not_registered(tmp_path, monkeypatch):
    from transformers.masking_utils import AttentionMaskInterface

    name = register("hilbert_dilated_saved")
    use_dilated_attention(_model("llama"), *PATTERN, name=name).save_pretrained(tmp_path)
    monkeypatch.delitem(transformers.AttentionInterface._global_mapping, name)
    monkeypatch.delitem(AttentionMaskInterface._global_mapping, name)
    with pytest.raises(ValueError, match=name):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


def test_mask_function_overlays_are_refused():
    """Overlays that transformers composes into the mask function (or_mask_function, and_mask_function,
    block_sequence_ids) are refused by name; padding and packed documents, which the layer reads itself, pass."""
    from transformers.masking_utils import create_causal_mask

    model = use_dilated_attention(_model("llama"), *PATTERN)
    embeds = torch.zeros(1, 6, 32, dtype=torch.float64)
    prefix = lambda batch, head, q, kv: kv < 3  # noqa: E731 (bidirectional prefix, like image tokens)
    with pytest.raises(ValueError, match="or_mask_function"):
        create_causal_mask(model.config, embeds, None, None, or_mask_function=prefix)
    with pytest.raises(ValueError, match="and_mask_function"):
        create_causal_mask(model.config, embeds, None, None, and_mask_function=prefix)
    with pytest.raises(ValueError, match="block_sequence_ids"):
        create_causal_mask(model.config, embeds, None, None, block_sequence_ids=torch.tensor([[0, 0, 0, 1, 1, -1]]))
    packed = torch.tensor([[0, 1, 2, 0, 1, 2]])
    assert create_causal_mask(model.config, embeds, None, None, position_ids=packed) is None
    padding = torch.tensor([[0, 1, 1, 1, 1, 1]])
    assert torch.equal(create_causal_mask(model.config, embeds, padding, None, position_ids=packed), padding.bool())


@pytest.mark.slow  # dynamo and inductor on a 2-core CPU: about 35 s
def test_generate_compiles_the_decoding_steps_on_the_static_cache_in_one_graph():
    """transformers' generate on the static cache with its forward compiled for the decoding steps (what it does on
    a GPU by itself), here with fullgraph=True: each step reads the cache's storage in place, positions on the
    device, in one graph (a graph break would recompile the rest of every layer's attention, one frame per layer
    index, and run the layers past dynamo's recompile limit eagerly), and gives the eager tokens."""
    from transformers import CompileConfig

    model = use_dilated_attention(_model("llama").float(), *PATTERN)
    prompt = _ids(2, 11)

    def generate(**kwargs):
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                              cache_implementation="static", pad_token_id=0, **kwargs)

    eager = generate()
    config = CompileConfig(fullgraph=True, dynamic=False, mode="default")
    config._compile_all_devices = True  # transformers compiles on accelerators only unless told
    torch._dynamo.reset()
    try:
        assert torch.equal(generate(compile_config=config), eager)
        assert model._compiled_call is not None  # the steps did run compiled
    finally:
        torch._dynamo.reset()


def test_a_compiled_training_forward_equals_eager():
    """torch.compile of a model's training step (dynamo traces transformers' mask creation, which keeps the
    packed-sequence function, a closure over a tensor, in the mask function): the composed mask function is
    checked outside the graph, each layer's attention reads its documents eagerly, and the loss and gradients equal
    eager's, one document per row and packed rows alike."""
    model = use_dilated_attention(_model("llama"), *PATTERN).train()
    compiled = torch.compile(model, backend="aot_eager")
    packed = torch.cat([torch.arange(20), torch.arange(25)])[None].expand(2, -1)
    torch._dynamo.reset()
    try:
        for position_ids in (None, packed):
            ids = _ids(2, 45, seed=2)
            (got, loss), (want, want_loss) = (_gradients(m, ids, position_ids) for m in (compiled, model))
            assert loss == want_loss
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    finally:
        torch._dynamo.reset()


def test_the_mask_function_drops_a_mask_without_padding_and_keeps_one_with_padding():
    """An all-ones 2D mask, as long as the keys or shorter (a static cache's unwritten rows follow it, as generate
    passes it), is no padding: None, so a decoding step takes the in-place path; a padded mask stays, as bool."""
    from hilbert_lab.integrations.transformers import dilated_mask

    ones = torch.ones(2, 7, dtype=torch.int64)
    assert dilated_mask(2, 1, 7, attention_mask=ones) is None
    assert dilated_mask(2, 1, 32, attention_mask=ones) is None
    padded = ones.clone()
    padded[1, :3] = 0
    kept = dilated_mask(2, 1, 32, attention_mask=padded)
    assert kept.dtype == torch.bool and torch.equal(kept, padded.bool())
