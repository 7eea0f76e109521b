"""Dilated attention as one custom op: torch.compile(fullgraph=True) runs the function, the module and LongNetLM
forward and backward with no graph break, equal to eager; the op's backward, which rebuilds every executor's
per-call states from shapes, equals the eager backward that keeps them; torch.library's own op checks pass."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import dilated_attention
from hilbert_lab.attention.executors import get_executor
from hilbert_lab.attention.modules import MultiheadDilatedAttention
from hilbert_lab.models.blocks import LongNetLM

from ._oracle import max_diff

CASES = {
    "longnet": dict(segment_lengths=[8, 16, 32], dilation_rates=[1, 2, 4]),
    "longnet_causal": dict(segment_lengths=[8, 16, 32], dilation_rates=[1, 2, 4], causal=True),
    "head_groups_causal": dict(segment_lengths=[8, 16], dilation_rates=[1, 2], mode="head_groups", causal=True),
    "ragged": dict(segment_lengths=[16, 32], dilation_rates=[1, 2], causal=True, seq_len=45),
    "gqa": dict(segment_lengths=[8, 32], dilation_rates=[1, 2], causal=True, kv_heads=2),
    "fewer_queries": dict(segment_lengths=[8, 32], dilation_rates=[1, 2], causal=True, queries=5),
    "packed": dict(segment_lengths=[8, 16], dilation_rates=[1, 2], causal=True, batch=1, cu_seqlens=[0, 13, 40, 64]),
}


def _inputs(case: dict, dtype=torch.float64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    batch, seq_len, heads, dim = case.get("batch", 2), case.get("seq_len", 64), 4, 8
    draw = lambda *shape: torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_()  # noqa: E731
    q = draw(batch, case.get("queries", seq_len), heads, dim)
    k, v = (draw(batch, seq_len, case.get("kv_heads", heads), dim) for _ in range(2))
    return q, k, v, generator


def _arguments(case: dict) -> dict:
    return {name: value for name, value in case.items() if name not in ("seq_len", "kv_heads", "queries", "batch")}


def _fwd_bwd(fn, q, k, v, generator):
    """out, lse and (dq, dk, dv) for random upstream gradients of out and lse."""
    out, lse = fn(q, k, v)
    grad_out = torch.randn(out.shape, generator=generator, dtype=out.dtype)
    grad_lse = torch.randn(lse.shape, generator=generator, dtype=lse.dtype)
    return (out, lse, *torch.autograd.grad((out, lse), (q, k, v), (grad_out, grad_lse)))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("backend", ["sdpa", "manual", "reference"])
def test_the_op_backward_rebuilds_states_and_equals_the_eager_one(name, backend):
    """A backend name runs the custom op (states rebuilt from shapes in its backward); an Executor object runs
    the eager function that keeps its forward's states: the two agree bit for bit, and with the float64 oracle."""
    case = CASES[name]
    q, k, v, generator = _inputs(case)
    arguments = _arguments(case)
    seed = torch.randint(1 << 30, (1,), generator=generator).item()
    results = []
    for chosen in (backend, get_executor(backend)):
        generator.manual_seed(seed)
        results.append(_fwd_bwd(lambda *t: dilated_attention(*t, backend=chosen, return_lse=True, **arguments),
                                q, k, v, generator))
    for op_value, eager_value in zip(*results):
        assert torch.equal(op_value, eager_value)
    generator.manual_seed(seed)  # and the float64 oracle executor, kept states and all
    expected = _fwd_bwd(lambda *t: dilated_attention(*t, backend=get_executor("reference"), return_lse=True,
                                                     **arguments), q, k, v, generator)
    assert max(max_diff(a, b) for a, b in zip(results[0], expected)) < 1e-10


@pytest.mark.parametrize("name", list(CASES))
def test_the_function_compiles_whole_and_equals_eager(name):
    case = CASES[name]
    q, k, v, generator = _inputs(case)
    arguments = _arguments(case)

    def fn(q, k, v):
        return dilated_attention(q, k, v, return_lse=True, **arguments)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(q, k, v)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    seed = torch.randint(1 << 30, (1,), generator=generator).item()
    generator.manual_seed(seed)
    compiled = _fwd_bwd(torch.compile(fn, fullgraph=True, backend="aot_eager"), q, k, v, generator)
    generator.manual_seed(seed)
    eager = _fwd_bwd(fn, q, k, v, generator)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)


def test_dynamic_shapes_compile_whole_and_each_length_equals_eager():
    """torch.compile(dynamic=True): lengths, head dim and a scale argument traced symbolically. The call's plain
    values (pattern, scale, documents) are specialized under guards, so the graph holds the op whole and each new
    length (ragged, a multiple, fewer queries) equals eager."""
    segments = {"segment_lengths": [8, 16], "dilation_rates": [1, 2]}

    def fn(q, k, v, scale, cu_seqlens):
        return dilated_attention(q, k, v, causal=True, scale=scale, cu_seqlens=cu_seqlens, return_lse=True,
                                 **segments)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
    for seq_len, queries, scale, cu_seqlens in ((45, 45, 0.3, None), (64, 64, None, [0, 13, 64]),
                                                (37, 6, 0.7, None), (64, 64, 0.3, [0, 40, 64])):
        case = {"seq_len": seq_len, "queries": queries, "batch": 1 if cu_seqlens else 2}
        q, k, v, generator = _inputs(case, seed=seq_len)
        results = []
        for function in (compiled, fn):
            generator.manual_seed(seq_len)
            results.append(_fwd_bwd(lambda *t: function(*t, scale, cu_seqlens), q, k, v, generator))
        for a, b in zip(*results):
            assert torch.equal(a, b), (seq_len, queries, scale, cu_seqlens)
    generator.manual_seed(seq_len)  # the last case against the float64 oracle executor
    expected = _fwd_bwd(lambda *t: dilated_attention(*t, causal=True, scale=0.3, cu_seqlens=[0, 40, 64],
                                                     backend=get_executor("reference"), return_lse=True,
                                                     **segments), q, k, v, generator)
    assert max(max_diff(a, b) for a, b in zip(results[0], expected)) < 1e-10


@pytest.mark.parametrize("hilbert_pattern", [False, True])
def test_layouts_compile_whole_and_equal_eager_at_each_length(hilbert_pattern):
    """ordering= (read through a layout) and hilbert_pattern=True: the permutation of each length is a constant of
    the graph (built on the host while tracing), so dynamic shapes keep the call whole and equal to eager."""

    def fn(q, k, v):
        return dilated_attention(q, k, v, segment_lengths=[8, 32], dilation_rates=[1, 2], causal=True,
                                 ordering="hilbert", hilbert_pattern=hilbert_pattern, return_lse=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
    for seq_len in (64, 45, 70):
        q, k, v, generator = _inputs({"seq_len": seq_len}, seed=seq_len)
        results = []
        for function in (compiled, fn):
            generator.manual_seed(seq_len)
            results.append(_fwd_bwd(function, q, k, v, generator))
        for a, b in zip(*results):
            assert torch.equal(a, b), seq_len


def test_self_attention_on_one_tensor_compiles_whole():
    """q, k and v the very same tensor (attention of x on itself) still compile into one graph."""
    x = torch.randn(2, 64, 4, 8, dtype=torch.float64, requires_grad=True)

    def fn(x):
        return dilated_attention(x, x, x, segment_lengths=[16, 64], dilation_rates=[1, 2], causal=True)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    upstream = torch.randn(2, 64, 4, 8, dtype=torch.float64)
    compiled = torch.autograd.grad((torch.compile(fn, fullgraph=True, backend="aot_eager")(x) * upstream).sum(), x)
    assert torch.equal(compiled[0], torch.autograd.grad((fn(x) * upstream).sum(), x)[0])


@pytest.mark.slow  # inductor's code generation: about 15 s on a 2-core CPU
def test_inductor_compiles_the_function_whole_and_equals_eager():
    case = CASES["longnet_causal"]
    q, k, v, generator = _inputs(case, dtype=torch.float32)

    def fn(q, k, v):
        out, lse = dilated_attention(q, k, v, return_lse=True, **_arguments(case))
        return out * 2, lse  # with a pointwise op for inductor to fuse around the call

    torch._dynamo.reset()
    generator.manual_seed(1)
    compiled = _fwd_bwd(torch.compile(fn, fullgraph=True), q, k, v, generator)
    generator.manual_seed(1)
    eager = _fwd_bwd(fn, q, k, v, generator)
    assert max(max_diff(a, b) for a, b in zip(compiled, eager)) < 1e-6


def _grads_of(model, loss_fn):
    loss = loss_fn(model)
    return loss, torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])


def test_the_module_compiles_whole_and_equals_eager():
    torch.manual_seed(0)
    module = MultiheadDilatedAttention(32, 4, segment_lengths=[8, 16, 32], dilation_rates=[1, 2, 4], causal=True,
                                       num_kv_heads=2).double()
    x = torch.randn(2, 64, 32, dtype=torch.float64)
    upstream = torch.randn(2, 64, 32, dtype=torch.float64)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(module)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    loss = lambda m: (m(x) * upstream).sum()  # noqa: E731
    (loss_c, grads_c), (loss_e, grads_e) = _grads_of(compiled, loss), _grads_of(module, loss)
    assert torch.equal(loss_c, loss_e)
    assert all(torch.equal(a, b) for a, b in zip(grads_c, grads_e))


def _lm():
    torch.manual_seed(0)
    return LongNetLM(64, 32, 2, 4, [8, 16, 32], [1, 2, 4], max_seq_len=64).double()


def _lm_loss(tokens):
    return lambda m: torch.nn.functional.cross_entropy(m(tokens).flatten(0, 1), tokens.flatten())


def test_longnet_lm_compiles_whole_and_equals_eager():
    model = _lm()
    tokens = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(tokens)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    (loss_c, grads_c), (loss_e, grads_e) = _grads_of(compiled, _lm_loss(tokens)), _grads_of(model, _lm_loss(tokens))
    assert torch.equal(loss_c, loss_e)
    assert all(torch.equal(a, b) for a, b in zip(grads_c, grads_e))


def test_longnet_lm_compiled_with_dynamic_shapes_equals_eager_at_each_length():
    """dynamic=True traces the model's integers (head dims, rotary bases' keys) symbolically too: they are
    specialized under guards, so the graph stays whole and each length (ragged or not) equals eager."""
    model = _lm()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for seq_len in (64, 45, 33):
        tokens = torch.randint(0, 64, (2, seq_len), generator=torch.Generator().manual_seed(seq_len))
        (loss_c, grads_c), (loss_e, grads_e) = _grads_of(compiled, _lm_loss(tokens)), _grads_of(model, _lm_loss(tokens))
        assert torch.equal(loss_c, loss_e), seq_len
        assert all(torch.equal(a, b) for a, b in zip(grads_c, grads_e)), seq_len


def _counting_backend(graphs: list):
    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return torch._dynamo.backends.debugging.aot_eager(graph_module, example_inputs)
    return backend


@pytest.mark.parametrize("kind", ["host tensor", "host integers"])
def test_longnet_lm_on_packed_rows_compiles_once_for_every_packing_and_equals_eager(kind):
    """Packed rows' boundaries as a tensor in host memory: the encoder hands it to every layer and the op reads it
    when it runs, so one graph, compiled once, takes every packing of as many boundaries (host integers:
    specialized once, then dynamic); loss and gradients equal eager's."""
    model = _lm()
    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=_counting_backend(graphs))
    as_kind = {"host tensor": torch.tensor, "host integers": list}[kind]
    for boundaries in ([0, 20, 33, 50], [0, 7, 7, 50], [0, 1, 2, 50], [0, 31, 40, 50]):
        tokens = torch.randint(0, 64, (1, 50), generator=torch.Generator().manual_seed(len(boundaries)))
        packed_loss = lambda m: torch.nn.functional.cross_entropy(  # noqa: E731
            m(tokens, cu_seqlens=as_kind(boundaries)).flatten(0, 1), tokens.flatten())
        (loss_c, grads_c), (loss_e, grads_e) = _grads_of(compiled, packed_loss), _grads_of(model, packed_loss)
        assert torch.equal(loss_c, loss_e), boundaries
        assert all(torch.equal(a, b) for a, b in zip(grads_c, grads_e)), boundaries
    assert len(graphs) == (1 if kind == "host tensor" else 2), len(graphs)


def test_the_function_on_a_host_tensor_of_boundaries_compiles_once_for_every_packing():
    """dilated_attention with cu_seqlens in host memory: one graph for every packing (the op reads the boundaries
    when it runs), each equal to eager and to the float64 oracle executor."""
    graphs = []

    def fn(q, k, v, cu_seqlens):
        return dilated_attention(q, k, v, segment_lengths=[8, 16], dilation_rates=[1, 2], causal=True,
                                 cu_seqlens=cu_seqlens, return_lse=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=_counting_backend(graphs))
    for boundaries in ([0, 13, 64], [0, 40, 64], [0, 5, 64], [0, 64, 64]):
        q, k, v, generator = _inputs({"batch": 1}, seed=len(boundaries))
        cu = torch.tensor(boundaries)
        results = []
        for function in (compiled, fn, lambda *t: dilated_attention(
                *t[:3], segment_lengths=[8, 16], dilation_rates=[1, 2], causal=True, cu_seqlens=t[3],
                backend=get_executor("reference"), return_lse=True)):
            generator.manual_seed(1)
            results.append(_fwd_bwd(lambda *t: function(*t, cu), q, k, v, generator))
        assert all(torch.equal(a, b) for a, b in zip(results[0], results[1])), boundaries
        assert max(max_diff(a, b) for a, b in zip(results[0], results[2])) < 1e-10, boundaries
    assert len(graphs) == 1


def test_longnet_lm_with_gradient_checkpointing_compiles_whole_and_equals_eager():
    """Checkpointed blocks read the pass's rotary tables without changing them (a layer that mutated state from
    outside would break its checkpoint's graph)."""
    model = _lm()
    model.encoder.gradient_checkpointing = True
    tokens = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    (loss_c, grads_c), (loss_e, grads_e) = _grads_of(compiled, _lm_loss(tokens)), _grads_of(model, _lm_loss(tokens))
    assert torch.equal(loss_c, loss_e)
    assert all(torch.equal(a, b) for a, b in zip(grads_c, grads_e))


def test_a_compiled_forward_computes_the_rotary_angles_once():
    """The traced graph of LongNetLM (two rotating blocks) holds one cosine and one sine, the encoder's tables, and
    no power: the inverse frequencies are a constant."""
    model = _lm()
    tokens = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(2))
    graphs = []

    def record(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, fullgraph=True, backend=record)(tokens)
    names = [str(node.target) for graph in graphs for node in graph.graph.nodes]
    assert len(graphs) == 1 and names.count("cos") == 1 and names.count("sin") == 1, names
    assert not any("pow" in name for name in names), names  # the frequencies are a constant of the graph


@pytest.mark.slow
def test_longnet_lm_compiled_by_inductor_equals_eager():
    model = _lm()
    tokens = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    (loss_c, grads_c), (loss_e, grads_e) = _grads_of(compiled, _lm_loss(tokens)), _grads_of(model, _lm_loss(tokens))
    assert abs(loss_c.item() - loss_e.item()) < 1e-12
    assert max(max_diff(a, b) for a, b in zip(grads_c, grads_e)) < 1e-12


def test_torch_library_checks_the_ops():
    """Schema, fake implementations (shapes and strides) and AOT dispatch of the forward and backward ops, as
    torch.library.opcheck runs them on real inputs."""
    from hilbert_lab.attention.op import call_config, dilated_attention_backward_op, dilated_attention_op

    for name in ("longnet_causal", "gqa", "packed"):
        case = CASES[name]
        q, k, v, generator = (*(t.detach() for t in _inputs(case)[:3]), _inputs(case)[3])
        arguments = _arguments(case)
        boundaries = arguments.get("cu_seqlens")
        boundaries = None if boundaries is None else torch.tensor(boundaries)
        config = call_config(arguments["segment_lengths"], arguments["dilation_rates"],
                             arguments.get("mode", "longnet"), arguments.get("causal", False), "sdpa", 0.35, True, True)
        torch.library.opcheck(dilated_attention_op, (q, k, v, boundaries, config))
        out, lse = dilated_attention_op(q, k, v, boundaries, config)
        grad_out = torch.randn(out.shape, generator=generator, dtype=out.dtype)
        for grad_lse in (None, torch.randn(lse.shape, generator=generator, dtype=lse.dtype)):
            torch.library.opcheck(dilated_attention_backward_op,
                                  (grad_out, grad_lse, q, k, v, out, lse, boundaries, config))


def test_an_eager_calls_config_is_the_string_of_its_plain_values():
    """The config string built once per plain values (eager calls) equals the one built value by value (compiled
    calls), for lists and tuples, numpy and Python numbers, and parses back to the call's values."""
    import numpy as np

    from hilbert_lab.attention.op import _config_string, _parsed, call_config

    cases = [([16, 32], [1, 2], "longnet", True, "auto", 0.125, True, False, None),
             ((np.int64(16), 64), (1, np.int32(4)), "head_groups", False, "sdpa", np.float32(0.3), False, True, (2, 8)),
             ([7], [1], "longnet", False, "manual", 1 / 3, True, True, [0, 4])]
    for values in cases:
        config = call_config(*values)
        assert config == _config_string(*values)
        assert call_config(*values) is config  # built once
        pattern, backend, scale, need_lse, training, heads = _parsed(config)
        assert pattern.segment_lengths == tuple(int(w) for w in values[0])
        assert pattern.dilation_rates == tuple(int(r) for r in values[1])
        assert (pattern.mode, pattern.causal, backend) == values[2:5]
        assert scale == float(values[5]) and (need_lse, training) == values[6:8]
        assert heads == (None if values[8] is None else tuple(values[8]))


def _gpu_lm(backend: str):
    torch.manual_seed(0)
    return LongNetLM(256, 128, 2, 2, [256, 512, 1024], [1, 2, 4], max_seq_len=1024, backend=backend).cuda()


def _relative(got: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    """The largest max |got - expected| / max |expected| over a list of gradients."""
    return max(max_diff(a, b) / max(b.abs().max().item(), 1e-30) for a, b in zip(got, expected))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")
@pytest.mark.parametrize("backend", ["auto", "sdpa", "fa4"])
def test_a_cuda_graph_captured_training_step_equals_eager(backend):
    """A fixed-shape training step (LongNetLM under bf16 autocast, forward and backward) captured once with
    torch.cuda.graph and replayed on new tokens gives eager's loss and gradients."""
    if backend != "auto" and get_executor(backend).unavailable_reason("cuda", torch.bfloat16, 64) is not None:
        pytest.skip(f"backend unavailable on this machine: {backend}")
    model = _gpu_lm(backend)
    draw = lambda seed: torch.randint(0, 256, (2, 1024), device="cuda",  # noqa: E731
                                      generator=torch.Generator(device="cuda").manual_seed(seed))
    static_tokens = draw(0)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(static_tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), static_tokens.flatten())
        loss.backward()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled, plans and device metadata cached
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step()
    static_grads = [p.grad for p in model.parameters()]  # the graph's gradient buffers, rewritten by each replay
    for seed in (1, 2):
        static_tokens.copy_(draw(seed))
        graph.replay()
        torch.cuda.synchronize()
        replayed_loss, replayed_grads = static_loss.item(), [g.clone() for g in static_grads]
        eager = []
        for _ in range(2):  # twice: backward kernels that add with atomics differ from run to run
            model.zero_grad(set_to_none=True)
            eager.append((step().item(), [p.grad.clone() for p in model.parameters()]))
        spread = _relative(eager[0][1], eager[1][1])
        assert abs(replayed_loss - eager[0][0]) <= 1e-6 * abs(eager[0][0])
        assert _relative(replayed_grads, eager[0][1]) <= max(2 * spread, 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (reduce-overhead mode)")
def test_reduce_overhead_compiles_a_training_step_that_equals_eager():
    """torch.compile(fullgraph=True, mode="reduce-overhead") (inductor with CUDA graphs) of LongNetLM:
    the loss and gradients of a step equal eager's within float32 rounding."""
    model = _gpu_lm("auto").float()
    tokens = torch.randint(0, 256, (2, 1024), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # recorded, then replayed
        loss_c, grads_c = _grads_of(compiled, _lm_loss(tokens))
    loss_e, grads_e = _grads_of(model, _lm_loss(tokens))
    assert abs(loss_c.item() - loss_e.item()) <= 1e-5 * abs(loss_e.item())
    assert _relative(list(grads_c), list(grads_e)) < 1e-4
