"""LongNet blocks and LM: exactness against the float64 oracle, causality, blindness of short segments,
rotary/ordering invariance, generation, checkpointing/autocast/compile, bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention
from hilbert_lab.models import DilatedTransformerBlock, LongNetEncoder, LongNetLM, apply_rotary

VOCAB = 20


def _lm(segment_lengths=(8, 16, 64), dilation_rates=(1, 2, 1), *, dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    model = LongNetLM(VOCAB, 32, 2, 4, list(segment_lengths), list(dilation_rates), max_seq_len=64, **kwargs)
    return model.to(dtype).eval()


def _tokens(batch=2, length=64, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_block_matches_float64_oracle_composition():
    """Block output == x + W_o ref_attn(rot(W_q LN x), rot(W_k LN x), W_v LN x) + MLP(...), to 1e-12."""
    torch.manual_seed(0)
    segment_lengths, dilation_rates = [4, 8, 16], [1, 2, 4]
    block = DilatedTransformerBlock(16, 4, segment_lengths, dilation_rates, causal=True, mlp_ratio=2.0).double()
    x = torch.randn(2, 19, 16, dtype=torch.float64)  # ragged: 19 is not a multiple of any segment
    positions = torch.arange(19)
    got = block(x, positions)

    mha = block.attention
    h = block.attention_norm(x)
    split = lambda t: t.unflatten(-1, (4, 4))  # noqa: E731
    q = apply_rotary(split(mha.q_proj(h)), positions)
    k = apply_rotary(split(mha.k_proj(h)), positions)
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, causal=True)
    attended, _ = reference_attention(q, k, split(mha.v_proj(h)), pattern)
    expected = x + mha.out_proj(attended.flatten(-2))
    expected = expected + block.mlp(block.mlp_norm(expected))
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


def test_lm_is_causal_and_prefix_consistent():
    model = _lm()
    tokens = _tokens()
    logits = model(tokens)
    for cut in (1, 9, 33, 63):
        changed = tokens.clone()
        changed[:, cut:] = (changed[:, cut:] + 7) % VOCAB
        other = model(changed)
        torch.testing.assert_close(other[:, :cut], logits[:, :cut], atol=1e-12, rtol=0)
        assert (other[:, cut:] - logits[:, cut:]).abs().max() > 1e-3  # the changed part does matter
        # a prefix alone gives the same logits as inside the longer sequence (what generate relies on)
        torch.testing.assert_close(model(tokens[:, :cut]), logits[:, :cut], atol=1e-12, rtol=0)


def test_segments_shorter_than_the_distance_are_provably_blind():
    """With segments 8 and 16 (nested), position 62 sees nothing before 48, through any depth."""
    short, spanning = _lm((8, 16), (1, 2)), _lm()
    tokens = _tokens(batch=4)
    changed = tokens.clone()
    changed[:, :48] = torch.randint(0, VOCAB, (4, 48), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(short(changed)[:, 48:], short(tokens)[:, 48:], atol=1e-12, rtol=0)
    assert (spanning(changed)[:, 62] - spanning(tokens)[:, 62]).abs().max() > 1e-3


def test_rotary_is_a_relative_position_rotation():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, 2, 8, dtype=torch.float64, generator=generator)
    k = torch.randn(1, 6, 2, 8, dtype=torch.float64, generator=generator)
    positions = torch.tensor([0, 3, 4, 10, 11, 40])
    scores = torch.einsum("bnhd,bmhd->bhnm", apply_rotary(q, positions), apply_rotary(k, positions))
    shifted = torch.einsum("bnhd,bmhd->bhnm", apply_rotary(q, positions + 1000), apply_rotary(k, positions + 1000))
    torch.testing.assert_close(shifted, scores, atol=1e-9, rtol=0)  # depends only on differences
    torch.testing.assert_close(apply_rotary(q, positions).norm(dim=-1), q.norm(dim=-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(apply_rotary(q, torch.zeros(6, dtype=torch.long)), q, atol=0, rtol=0)
    assert not torch.allclose(apply_rotary(q, positions), q)


def test_rotary_angles_are_the_float64_formula_with_cached_frequencies():
    """cos and sin of position * base^(-2i/D) in float64, bitwise, up to a position of 2^20; the frequencies are
    computed once per (D, base, device) and kept."""
    from hilbert_lab.models import rotary

    positions = torch.tensor([0, 1, 5, 131071, 1048575])
    for head_dim, base in ((128, 10000.0), (64, 500000.0)):
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        angles = positions.double()[:, None] * base ** (-exponents)
        cos, sin = rotary.rotary_angles(positions, head_dim, base=base)
        assert torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin())
        assert cos.is_contiguous() and sin.is_contiguous() and cos.dtype == torch.float64
        first = rotary.inverse_frequencies(head_dim, base, torch.device("cpu"))
        assert rotary.inverse_frequencies(head_dim, base, torch.device("cpu")) is first
    rotary._INVERSE_FREQUENCIES.clear()
    with torch.inference_mode():  # a first call in inference mode keeps a plain tensor for later passes
        rotary.rotary_angles(positions, 16)
    assert not rotary.inverse_frequencies(16, 10000.0, torch.device("cpu")).is_inference()


@pytest.mark.parametrize("mode", ["inference", "no_grad"])
def test_positions_changed_in_place_between_calls_are_read_anew(mode):
    """A positions tensor reused with new values (packed rows whose positions restart) rotates by its new
    values: the logits equal a fresh tensor's and, on the first call, a model whose positions never changed."""
    model = LongNetLM(50, dim=32, depth=2, num_heads=4, segment_lengths=[4, 8], dilation_rates=[1, 2],
                      max_seq_len=64).double().eval()
    tokens = torch.randint(0, 50, (1, 8))
    restarting = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    context = torch.inference_mode() if mode == "inference" else torch.no_grad()
    with context:
        positions = torch.arange(8)
        before = model(tokens, positions=positions)
        positions.copy_(restarting)
        after = model(tokens, positions=positions)
        fresh = model(tokens, positions=restarting.clone())
        plain = model(tokens)
    torch.testing.assert_close(after, fresh, atol=0, rtol=0)
    torch.testing.assert_close(before, plain, atol=0, rtol=0)
    assert (after - before).abs().max() > 1e-6  # the restart changes the logits


@pytest.mark.parametrize("ordering", ["hilbert", "morton", "snake"])
def test_orderings_leave_the_lm_output_unchanged(ordering):
    """Rotary acts on original positions, so a memory layout (curve ordering) changes nothing."""
    tokens = _tokens()
    baseline = _lm(segment_lengths=(8, 16, 64), dilation_rates=(1, 2, 4))(tokens)
    ordered = _lm(segment_lengths=(8, 16, 64), dilation_rates=(1, 2, 4), ordering=ordering)(tokens)
    torch.testing.assert_close(ordered, baseline, atol=1e-10, rtol=0)


def test_weight_tying_shares_one_tensor():
    model = _lm()
    assert model.head.weight is model.embedding.weight
    names = [name for name, _ in model.named_parameters()]
    assert "head.weight" not in names and "embedding.weight" in names
    untied = _lm(tie_weights=False)
    assert untied.head.weight is not untied.embedding.weight
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == VOCAB * 32


def test_gradient_checkpointing_gives_the_same_gradients():
    tokens = _tokens()
    grads = []
    for checkpointing in (False, True):
        model = _lm(gradient_checkpointing=checkpointing).train()
        upstream = torch.randn(2, 64, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        (model(tokens) * upstream).sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-12, rtol=0, msg=name)


def test_encoder_non_causal_follows_the_dilated_pattern():
    """Segments [8, 16], dilations [1, 2], 2 heads: changing token 12 reaches position 8 (same 8-segment),
    the even positions 0..6 (branch 2, head 0 holds offset 0, like 12) and the future, but not 1, 3, 5, 7."""
    torch.manual_seed(0)
    encoder = LongNetEncoder(16, 1, 2, [8, 16], [1, 2], max_seq_len=16).double().eval()
    x = torch.randn(1, 16, 16, dtype=torch.float64)
    changed = x.clone()
    changed[:, 12] = torch.randn(16, dtype=torch.float64)  # (a constant shift would vanish in LayerNorm)
    difference = (encoder(changed) - encoder(x)).abs().amax(dim=-1)[0]
    assert (difference[[0, 2, 4, 6, 8, 9, 10, 11, 13, 14, 15]] > 1e-6).all(), difference
    assert (difference[[1, 3, 5, 7]] < 1e-14).all(), difference
    with pytest.raises(ValueError, match="max_seq_len"):
        encoder(torch.randn(1, 17, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="positions"):
        encoder(x, torch.arange(16) + 5)


def test_generate_greedy_equals_teacher_forced_argmax():
    model = _lm()
    prompt = _tokens(batch=3, length=5)
    out = model.generate(prompt, 12)
    assert out.shape == (3, 17) and torch.equal(out[:, :5], prompt)
    logits = model(out)
    torch.testing.assert_close(out[:, 5:], logits[:, 4:-1].argmax(dim=-1), atol=0, rtol=0)


def test_generate_top_k_samples_among_the_k_best():
    model = _lm()
    prompt = _tokens(batch=4, length=3)
    first = model.generate(prompt, 10, top_k=3, generator=torch.Generator().manual_seed(0))
    again = model.generate(prompt, 10, top_k=3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first, again)
    logits = model(first)[:, 2:-1]
    allowed = logits.topk(3, dim=-1).indices
    assert (allowed == first[:, 3:].unsqueeze(-1)).any(dim=-1).all()
    assert not torch.equal(first, model.generate(prompt, 10))  # sampling differs from greedy here


def test_autocast_bfloat16_stays_close_to_float32():
    model = _lm(dtype=torch.float32)
    tokens = _tokens()
    with torch.no_grad():
        reference = model(tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(tokens)
    assert low.dtype == torch.bfloat16
    error = (low.float() - reference).abs().max() / reference.abs().max()
    assert error < 3e-2, error
    assert float(F.cross_entropy(low.float().flatten(0, 1), tokens.flatten())) == pytest.approx(
        float(F.cross_entropy(reference.flatten(0, 1), tokens.flatten())), rel=1e-2)


@pytest.mark.slow  # torch.compile builds C++ kernels
def test_torch_compile_matches_eager():
    model = _lm(dtype=torch.float32).train()
    tokens = _tokens()
    upstream = torch.randn(2, 64, VOCAB, generator=torch.Generator().manual_seed(3))
    (model(tokens) * upstream).sum().backward()
    eager_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, backend="aot_eager")
    logits = compiled(tokens)
    torch.testing.assert_close(logits, model(tokens), atol=1e-5, rtol=1e-5)
    (logits * upstream).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_bad_input_is_refused_with_the_argument_named():
    model = _lm()
    with pytest.raises(ValueError, match="max_seq_len=64"):
        model(_tokens(length=65))
    with pytest.raises(ValueError, match=r"vocab_size=20\), got values in \[0, 20\]"):
        model(torch.tensor([[0, 20]]))
    with pytest.raises(ValueError, match=r"\[-1, 3\]"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="positions"):
        model(_tokens(length=4), positions=torch.tensor([0, 1, 2, 64]))
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(_tokens(length=60), 5)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(_tokens(length=4), 1, top_k=0)
    with pytest.raises(ValueError, match="num_heads"):
        LongNetLM(VOCAB, 30, 1, 4, [8], [1], max_seq_len=8)
    with pytest.raises(ValueError, match="even head dim"):
        LongNetLM(VOCAB, 12, 1, 4, [8], [1], max_seq_len=8)
    with pytest.raises(ValueError, match="depth"):
        LongNetLM(VOCAB, 32, 0, 4, [8], [1], max_seq_len=8)
    with pytest.raises(ValueError, match="dilation_rates"):
        LongNetLM(VOCAB, 32, 1, 4, [8, 16], [1], max_seq_len=8)
    with pytest.raises(ValueError, match="vocab_size"):
        LongNetLM(0, 32, 1, 4, [8], [1], max_seq_len=8)


def test_ring_switch_refuses_what_the_ring_cannot_do():
    from hilbert_lab.models.ring import use_local_attention, use_ring_attention

    with pytest.raises(ValueError, match="attention_dropout"):
        use_ring_attention(_lm(attention_dropout=0.1))
    with pytest.raises(ValueError, match="ordering"):
        use_ring_attention(_lm(ordering="hilbert"))
    with pytest.raises(ValueError, match="DilatedTransformerBlocks"):
        use_ring_attention(torch.nn.Linear(2, 2))
    from hilbert_lab.distributed import RingMultiheadDilatedAttention

    for kv_heads in (None, 2):  # grouped-query key/value heads carry over
        model = _lm(num_kv_heads=kv_heads)
        before = {name: p.clone() for name, p in model.state_dict().items()}
        use_ring_attention(model)  # constructing ring layers needs no process group
        rings = [m for m in model.modules() if isinstance(m, RingMultiheadDilatedAttention)]
        assert [ring.num_kv_heads for ring in rings] == [kv_heads or 4] * 2
        use_local_attention(model)
        after = model.state_dict()
        assert before.keys() == after.keys()
        assert all(torch.equal(before[name], after[name]) for name in before)


def test_generate_runs_in_eval_mode_and_restores_training_mode():
    """A model in training mode (dropout 0.5) generates with dropout off: its greedy tokens are the eval model's
    teacher-forced argmax; afterwards every module is back in training mode (and an eval model stays in eval)."""
    model = _lm(dropout=0.5).train()
    prompt = _tokens(batch=2, length=4)
    out = model.generate(prompt, 6)
    assert all(module.training for module in model.modules())
    logits = model.eval()(out)
    torch.testing.assert_close(out[:, 4:], logits[:, 3:-1].argmax(dim=-1), atol=0, rtol=0)
    model.generate(prompt, 1)
    assert not any(module.training for module in model.modules())


def test_config_rebuilds_the_same_architecture():
    model = _lm(dropout=0.1, rotary_base=500.0)
    rebuilt = LongNetLM.from_config(model.config).double().eval()
    rebuilt.load_state_dict(model.state_dict())  # strict: same parameter names and shapes
    tokens = _tokens()
    torch.testing.assert_close(rebuilt(tokens), model(tokens), atol=0, rtol=0)
    assert rebuilt.config == model.config and model.config["rotary_base"] == 500.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_autocast_training_step_matches_float64_cpu():
    cpu = _lm(dtype=torch.float64).train()
    gpu = _lm(dtype=torch.float32).cuda().train()
    tokens = _tokens()
    upstream = torch.randn(2, 64, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (cpu(tokens) * upstream).sum().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = gpu(tokens.cuda())
    (logits.float() * upstream.float().cuda()).sum().backward()
    torch.testing.assert_close(logits.double().cpu(), cpu(tokens).detach(), atol=5e-2, rtol=5e-2)
    for (name, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        scale = float(p.grad.abs().max()) + 1e-6
        assert float((q.grad.double().cpu() - p.grad).abs().max()) / scale < 0.1, name


def test_a_forward_pass_computes_its_rotary_angles_once_for_every_block(monkeypatch):
    """The encoder's tables: one rotary_angles call per pass, however many blocks rotate; the same outputs as each
    block computing its own."""
    from hilbert_lab.models import rotary

    torch.manual_seed(0)
    model = LongNetLM(64, 32, 3, 4, [8, 16], [1, 2], max_seq_len=32).double()
    tokens = torch.randint(0, 64, (2, 32))
    calls = []
    angles = rotary.rotary_angles
    monkeypatch.setattr(rotary, "rotary_angles", lambda *a, **k: calls.append(a) or angles(*a, **k))
    shared = model(tokens)
    assert len(calls) == 1
    monkeypatch.setattr(model.encoder, "rotary_tables", lambda positions, x: {})  # no tables: each block its own
    alone = model(tokens)
    assert len(calls) == 1 + 2 * 3  # q and k in each of the 3 blocks
    torch.testing.assert_close(shared, alone, rtol=0, atol=0)
