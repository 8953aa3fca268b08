"""A Llama-style decoder, attention and MLP from torch, with its norms served by autonorm.

Two stacked pre-norm layers (RMSNorm, causal attention with rotary embeddings through
``F.scaled_dot_product_attention``, RMSNorm, SwiGLU MLP, residual adds) and a final norm, in two
forms: torch's model with every ``nn.RMSNorm`` swapped by :func:`autonorm.torch.replace_rms_norms`,
and the form inference engines run, where each norm after a residual add is a
:class:`autonorm.torch.FusedAddRMSNorm` (functional or in place). Both are compared with the
unfused torch model holding the same weights: eagerly, under ``torch.compile(fullgraph=True)``
(no graph breaks) and, on a GPU, replayed from a captured CUDA graph.

CPU tests run everywhere torch is installed (there the norms run torch's own arithmetic, so they
check the wiring, the tracing and the gradients). Tests marked ``gpu`` need a CUDA GPU, torch with
CUDA and CuPy, and skip themselves otherwise.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from test_torch import gpu  # noqa: E402  (the torch tests' shared helpers)
from torch import nn  # noqa: E402

import autonorm.torch as at  # noqa: E402
from autonorm.torch import forward  # noqa: E402

# One shape for every test: on a GPU each distinct (dtype, hidden, weight form, rows bucket)
# compiles a kernel, and BATCH * SEQ rows keep them all in one bucket.
HIDDEN, HEADS, LAYERS, VOCAB = 256, 4, 2, 512
BATCH, SEQ = 2, 32
EPS = 1e-6
NORMS = 2 * LAYERS + 1  # two per layer and the final one


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, Llama's half-split form."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Causal self-attention with rotary embeddings on q and k."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        a = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v,
                                           is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, 2 * d, bias=False)
        self.up_proj = nn.Linear(d, 2 * d, bias=False)
        self.down_proj = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, norm) -> None:
        super().__init__()
        self.input_layernorm = norm(HIDDEN)
        self.self_attn = Attention(HIDDEN, HEADS)
        self.post_attention_layernorm = norm(HIDDEN)
        self.mlp = MLP(HIDDEN)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class FusedDecoderLayer(DecoderLayer):
    """The same layer carrying (x, residual): each norm after an add takes the add in."""

    def forward(self, x, residual, cos, sin):
        if residual is None:  # the first layer: nothing to add yet
            residual = x
            x = at.rms_norm(x, self.input_layernorm.weight, EPS)
        else:
            x, residual = self.input_layernorm(x, residual)
        x, residual = self.post_attention_layernorm(self.self_attn(x, cos, sin), residual)
        return self.mlp(x), residual


class Decoder(nn.Module):
    """Embedding, the layers, a final norm (Llama's model without its head)."""

    def __init__(self, layer: type = DecoderLayer, norm=lambda d: nn.RMSNorm(d, eps=EPS)) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(layer(norm) for _ in range(LAYERS))
        self.norm = norm(HIDDEN)
        head_dim = HIDDEN // HEADS
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def rotary(self, x):
        # Angles in float32 (float64 for the exact model), rounded to x's dtype once.
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        positions = torch.arange(x.shape[1], device=x.device, dtype=work)
        angles = torch.outer(positions, self.inv_freq.to(work))
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        cos, sin = self.rotary(x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class FusedDecoder(Decoder):
    """The inference engines' form: FusedAddRMSNorm everywhere but the first layer's input."""

    def __init__(self, in_place: bool = False) -> None:
        super().__init__(FusedDecoderLayer, lambda d: at.FusedAddRMSNorm(d, EPS, in_place=in_place))

    def forward(self, ids):
        x = self.embed_tokens(ids)
        cos, sin = self.rotary(x)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, cos, sin)
        return self.norm(x, residual)[0]


def reference(dtype=torch.float32, device="cpu", seed=0) -> Decoder:
    """torch's model with non-trivial norm weights (they initialize to ones)."""
    torch.manual_seed(seed)
    model = Decoder()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen))
    return model.to(device, dtype).eval()


def swapped(model: Decoder) -> Decoder:
    """A copy of ``model`` with its norms replaced by autonorm's."""
    new = copy.deepcopy(model)
    assert at.replace_rms_norms(new) == NORMS
    return new


def fused(model: Decoder, in_place: bool = False) -> FusedDecoder:
    """The fused form of ``model``, holding the same weights."""
    new = FusedDecoder(in_place).to(model.inv_freq.device, model.embed_tokens.weight.dtype)
    new.load_state_dict(model.state_dict(), strict=True)
    return new.eval()


def token_ids(device="cpu", seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).to(device)


def rel_error(actual, expected) -> float:
    """max|actual - expected| / max|expected| (normwise: robust near zeros)."""
    a, e = actual.double(), expected.double()
    return (a - e).abs().max().item() / max(e.abs().max().item(), 1e-30)


def assert_rel(actual, expected, tol: float, what: str = "") -> None:
    err = rel_error(actual, expected)
    assert err <= tol, f"{what} relative error {err:.3g} > {tol:.3g}"


# Normwise, against torch's model in the same dtype. float32: both round each norm once near
# 1e-7, far below this. bfloat16: a norm rounded differently (the kernel rounds once, torch may
# round twice) moves an output by an ulp, 2^-8, and the layers carry that on.
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def autonorm_ops(graph_module) -> list[str]:
    """Names of the operators the captured graph calls that are autonorm's or torch's norms."""
    found = []
    for node in graph_module.graph.nodes:
        name = str(node.target)
        if node.op == "call_function" and ("autonorm" in name or "rms_norm" in name):
            found.append(name)
    return found


# --------------------------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------------------------


def test_the_swap_replaces_every_norm_and_keeps_the_parameters():
    ref = reference()
    model = swapped(ref)
    norms = [m for m in model.modules() if isinstance(m, nn.RMSNorm)]
    assert len(norms) == NORMS and all(type(m) is at.RMSNorm for m in norms)
    assert all(m.eps == EPS for m in norms)
    assert list(model.state_dict()) == list(ref.state_dict())
    for (name, got), want in zip(model.state_dict().items(), ref.state_dict().values(),
                                 strict=True):
        assert torch.equal(got, want), name
    assert at.replace_rms_norms(model) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_swapped_and_fused_models_match_torch(dtype):
    ref = reference(dtype)
    ids = token_ids()
    with torch.no_grad():
        want = ref(ids)
        assert want.dtype == dtype and want.shape == (BATCH, SEQ, HIDDEN)
        assert_rel(swapped(ref)(ids), want, TOL[dtype], "swapped")
        assert_rel(fused(ref)(ids), want, TOL[dtype], "fused add")
    with torch.inference_mode():
        assert_rel(fused(ref, in_place=True)(ids), want, TOL[dtype], "fused add in place")


def test_cpu_compiled_swapped_model_has_no_graph_break_and_matches_torch():
    torch._dynamo.reset()
    ref = reference()
    model = swapped(ref)
    ids = token_ids()
    explanation = torch._dynamo.explain(model)(ids)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    # The graph calls autonorm's op for every norm, and torch's norm for none.
    ops = autonorm_ops(explanation.graphs[0])
    assert ops == ["autonorm.rms_norm.default"] * NORMS, ops
    # aot_eager traces forward and backward through the fake and autograd registrations
    # without needing a C++ compiler.
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert_rel(compiled(ids), ref(ids), TOL[torch.float32], "compiled forward")
    compiled(ids).square().mean().backward()
    ref(ids).square().mean().backward()
    for (name, got), want in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_rel(got.grad, want.grad, 1e-4, f"compiled gradient of {name}")


@pytest.mark.parametrize("in_place", [False, True])
def test_cpu_compiled_fused_model_has_no_graph_break_and_matches_torch(in_place):
    torch._dynamo.reset()
    ref = reference()
    model = fused(ref, in_place)
    ids = token_ids(seed=1)
    with torch.inference_mode():
        explanation = torch._dynamo.explain(model)(ids)
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1
        op = "fused_add_rms_norm_" if in_place else "add_rms_norm"
        ops = autonorm_ops(explanation.graphs[0])
        assert ops.count(f"autonorm.{op}.default") == NORMS - 1, ops
        assert ops.count("autonorm.rms_norm.default") == 1, ops  # the first layer's input
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        assert_rel(compiled(ids), ref(ids), TOL[torch.float32], "compiled fused forward")


@pytest.mark.parametrize("form", ["swapped", "fused"])
def test_cpu_gradients_match_torch(form):
    ref = reference().train()
    model = swapped(ref) if form == "swapped" else fused(ref).train()
    ids = token_ids(seed=2)
    gen = torch.Generator().manual_seed(3)
    probe = torch.randn(BATCH, SEQ, HIDDEN, generator=gen)
    got = model(ids)
    # The output comes from autonorm's op, so the gradient runs its registered backward.
    assert "autonorm" in got.grad_fn.name().lower()
    (got * probe).sum().backward()
    (ref(ids) * probe).sum().backward()
    grads = dict(model.named_parameters())
    for name, want in ref.named_parameters():
        assert grads[name].grad is not None, name
        assert_rel(grads[name].grad, want.grad, 1e-5, f"gradient of {name}")


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------


def launched(cache: dict, dtype) -> bool:
    """Whether ``cache`` (one of autonorm.torch's kernel caches) holds this model's kernel."""
    return any(key[1:3] == (dtype, HIDDEN) for key in cache)


def exact_error(got, ref: Decoder, ids) -> float:
    """Normwise error of ``got`` against ``ref``'s weights run in float64."""
    exact = copy.deepcopy(ref).double()
    with torch.no_grad():
        return rel_error(got, exact(ids))


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_swapped_model_matches_torch_eager_and_compiled(dtype):
    torch._dynamo.reset()
    ref = reference(dtype, "cuda")
    model = swapped(ref)
    ids = token_ids("cuda")
    at.clear_kernel_cache()  # the dispatcher keeps its own: this costs a lookup, no compile
    with torch.no_grad():
        want = ref(ids)
        eager = model(ids)
        assert launched(forward._RMS_KERNELS, dtype), "the swapped norms never ran the kernel"
        assert_rel(eager, want, TOL[dtype], "eager")
        explanation = torch._dynamo.explain(model)(ids)
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1
        compiled = torch.compile(model, fullgraph=True)
        got = compiled(ids)
    assert_rel(got, want, TOL[dtype], "compiled")
    # Within the dtype's own error: no worse than torch's model against float64, with room
    # for a differently rounded norm.
    budget = 2 * exact_error(want, ref, ids) + (1e-5 if dtype == torch.float32 else 4e-3)
    for what, out in (("eager", eager), ("compiled", got)):
        err = exact_error(out, ref, ids)
        assert err <= budget, f"{what} error {err:.3g} against float64 > {budget:.3g}"


@gpu
def test_gpu_compiled_gradients_match_torch():
    torch._dynamo.reset()
    ref = reference(torch.float32, "cuda").train()
    model = swapped(ref)
    ids = token_ids("cuda", seed=2)
    probe = torch.randn(BATCH, SEQ, HIDDEN, device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    (compiled(ids) * probe).sum().backward()
    (ref(ids) * probe).sum().backward()
    for (name, got), want in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_rel(got.grad, want.grad, 1e-3, f"compiled gradient of {name}")


def capture(fn, static_ids):
    """Warm ``fn`` up on a side stream (kernels compiled before capture), capture one call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(static_ids)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_ids)
    return graph, static_out


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_cuda_graph_replay_of_the_swapped_model_gives_the_eager_outputs(dtype):
    ref = reference(dtype, "cuda")
    model = swapped(ref)
    static_ids = token_ids("cuda")
    with torch.inference_mode():
        graph, static_out = capture(model, static_ids)
        for seed in (5, 6):
            ids = token_ids("cuda", seed)
            static_ids.copy_(ids)
            static_out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            eager = model(ids)
            # The same kernels on the same inputs: the eager outputs, up to an ulp.
            assert_rel(static_out, eager, 1e-6 if dtype == torch.float32 else 8e-3, "replay")
            assert_rel(static_out, ref(ids), TOL[dtype], "replay against torch")


@gpu
def test_gpu_fused_add_model_in_bfloat16_matches_torch():
    torch._dynamo.reset()
    dtype = torch.bfloat16
    ref = reference(dtype, "cuda")
    ids = token_ids("cuda", seed=1)
    at.clear_kernel_cache()
    with torch.inference_mode():
        want = ref(ids)
        functional = fused(ref)(ids)
        in_place_model = fused(ref, in_place=True)
        in_place = in_place_model(ids)
        assert_rel(functional, want, TOL[dtype], "fused add")
        # The same kernels, the same sums: the two forms give the same bits.
        assert torch.equal(in_place, functional)
        assert launched(forward._ADD_RMS_KERNELS, dtype)
        compiled = torch.compile(in_place_model, fullgraph=True)
        assert_rel(compiled(ids), want, TOL[dtype], "compiled fused add in place")
    budget = 2 * exact_error(want, ref, ids) + 4e-3
    err = exact_error(functional, ref, ids)
    assert err <= budget, f"fused add error {err:.3g} against float64 > {budget:.3g}"


@gpu
def test_gpu_cuda_graph_replay_of_the_in_place_model():
    dtype = torch.bfloat16
    ref = reference(dtype, "cuda")
    model = fused(ref, in_place=True)
    static_ids = token_ids("cuda")
    with torch.inference_mode():
        graph, static_out = capture(model, static_ids)
        for seed in (7, 8):
            ids = token_ids("cuda", seed)
            static_ids.copy_(ids)
            static_out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert_rel(static_out, model(ids), 8e-3, "replay")
            assert_rel(static_out, ref(ids), TOL[dtype], "replay against torch")


@gpu
def test_gpu_in_place_op_inside_a_captured_graph_updates_its_arguments_on_each_replay():
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, r = (torch.randn(BATCH * SEQ, HIDDEN, device="cuda", generator=gen).to(dtype)
            for _ in range(2))
    w = (1 + 0.5 * torch.randn(HIDDEN, device="cuda", generator=gen)).to(dtype)
    op = torch.ops.autonorm.fused_add_rms_norm_
    with torch.inference_mode():
        static_x, static_r = x.clone(), r.clone()
        op(static_x.clone(), static_r.clone(), w, EPS, False)  # warm-up: compile the kernel
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            op(static_x, static_r, w, EPS, False)
        # Capture records the launch without running it.
        assert torch.equal(static_x, x) and torch.equal(static_r, r)
        want_x, want_r = x, r
        for _ in range(2):  # each replay applies the step again to what the last one wrote
            graph.replay()
            torch.cuda.synchronize()
            want_x, want_r = at.add_rms_norm(want_x, want_r, w, EPS)
            assert torch.equal(static_x, want_x) and torch.equal(static_r, want_r)
        assert_rel(static_x, F.rms_norm(static_r, (HIDDEN,), w, EPS), TOL[dtype], "norm of h")
