"""Tests of autonorm.torch's residual add and RMSNorm: add_rms_norm, its two custom ops (the
functional one and vLLM's in-place one) and the FusedAddRMSNorm module.

CPU tests run everywhere torch is installed; the CUDA launch path is tested on CPU too, through a
fake dispatcher whose kernel computes on the host memory behind the pointers it is given. Tests
marked ``gpu`` need a CUDA GPU, torch with CUDA and CuPy, and skip themselves otherwise.
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import types

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from test_torch import (  # noqa: E402  (the torch tests' shared helpers)
    DTYPES,
    GRAD_TOL,
    TOL,
    assert_rel,
    gpu,
)
from torch import nn  # noqa: E402

import autonorm.torch as at  # noqa: E402
from autonorm.errors import (  # noqa: E402
    DeviceMismatchError,
    InputError,
    ShapeError,
    UnsupportedDtypeError,
)
from autonorm.numerics import measure_error  # noqa: E402
from autonorm.torch import forward, residual_forward  # noqa: E402
from autonorm.torch.checks import DTYPE_NAMES  # noqa: E402


def rounded_sum(x, r):
    """The sum rounded once to the dtype: float64 holds it exactly enough for all three."""
    return (x.double() + r.double()).to(x.dtype)


def formula(h, weight, eps, offset=False):
    """RMSNorm of h in float64 from its definition."""
    hd = h.double()
    y = hd * torch.rsqrt(hd.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (1 + weight.double() if offset else weight.double())
    return y


def operands(shape, dtype, seed=0):
    """x and residual over many binades, so that many sums round."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-6, 7, shape, generator=gen).float())
    x = (torch.randn(shape, generator=gen) * scale).to(dtype)
    r = (torch.randn(shape, generator=gen) * scale.flip(-1)).to(dtype)
    return x, r


def same_bits(a, b) -> bool:
    """Bitwise equality (torch.equal would call -0 and +0 equal)."""
    view = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    return a.dtype == b.dtype and torch.equal(a.view(view[a.dtype]), b.view(view[b.dtype]))


class TorchFusedAddRMSNorm(nn.Module):
    """The unfused reference: h = x + residual, then torch's rms_norm of h (state_dict 'weight')."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x, residual):
        h = x + residual
        return F.rms_norm(h, (h.shape[-1],), self.weight, self.eps), h


class Block(nn.Module):
    """A decoder block written against a fused add + norm: (x, residual) in and out."""

    def __init__(self, d: int, heads: int, norm: type) -> None:
        super().__init__()
        self.heads = heads
        self.input_norm = norm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_norm = norm(d)
        self.gate_up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x, residual):
        b, t, d = x.shape
        x, residual = self.input_norm(x, residual)
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x, residual = self.post_norm(self.o_proj(a.transpose(1, 2).reshape(b, t, d)), residual)
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up), residual


def randomize(module: nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:  # the norms' weights
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen))


# --------------------------------------------------------------------------------------------
# The ops' registration
# --------------------------------------------------------------------------------------------


def test_the_ops_are_registered_with_their_schemas():
    assert str(torch.ops.autonorm.add_rms_norm.default._schema) == (
        "autonorm::add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps, "
        "bool weight_offset) -> (Tensor, Tensor)"
    )
    assert str(torch.ops.autonorm.fused_add_rms_norm_.default._schema) == (
        "autonorm::fused_add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, "
        "float eps, bool weight_offset) -> ()"
    )


@pytest.mark.parametrize("form", ["weight", "offset", "none"])
def test_opcheck(form):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32, requires_grad=True)
    r = torch.randn(3, 5, 32, requires_grad=True)
    w = None if form == "none" else torch.randn(32, requires_grad=True)
    offset = form == "offset"
    torch.library.opcheck(torch.ops.autonorm.add_rms_norm.default, (x, r, w, 1e-5, offset))
    wd = None if w is None else w.detach()
    torch.library.opcheck(
        torch.ops.autonorm.fused_add_rms_norm_.default,
        (x.detach().clone(), r.detach().clone(), wd, 1e-5, offset),
    )


def test_fake_tensors_get_shapes_and_trace_time_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 3, 64, dtype=torch.bfloat16).transpose(0, 1)
        r = torch.empty(3, 4, 64, dtype=torch.bfloat16)
        w = torch.empty(64, dtype=torch.bfloat16)
        y, h = torch.ops.autonorm.add_rms_norm(x, r, w, 1e-6, True)
        for t in (y, h):
            assert t.shape == (3, 4, 64) and t.dtype == torch.bfloat16 and t.is_contiguous()
        y, h = at.add_rms_norm(x, r, w)  # a FakeTensor goes through the op
        assert y.shape == h.shape == (3, 4, 64)
        assert torch.ops.autonorm.fused_add_rms_norm_(x, r, w, 1e-6, False) is None
        with pytest.raises(ShapeError, match="^residual must have x's shape"):
            torch.ops.autonorm.add_rms_norm(x, r[:1], w, 1e-6, False)
        with pytest.raises(UnsupportedDtypeError, match="^residual has dtype"):
            torch.ops.autonorm.fused_add_rms_norm_(x, r.half(), w, 1e-6, False)


# --------------------------------------------------------------------------------------------
# CPU forward, the in-place form and validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["weight", "offset", "none"])
@pytest.mark.parametrize("shape", [(40,), (3, 17), (2, 3, 1001)])
def test_cpu_sum_is_exact_and_the_norm_is_torchs(dtype, form, shape):
    x, r = operands(shape, dtype)
    hidden = shape[-1]
    offset = form == "offset"
    w = None if form == "none" else (0.5 * torch.randn(hidden)).to(dtype)
    before = (x.clone(), r.clone())
    y, h = at.add_rms_norm(x, r, w, 1e-5, offset)
    assert y.dtype == h.dtype == dtype and y.shape == h.shape == x.shape
    assert y.is_contiguous() and h.is_contiguous()
    assert same_bits(h, rounded_sum(x, r))
    assert same_bits(x, before[0]) and same_bits(r, before[1])
    assert same_bits(y, at.rms_norm(h, w, 1e-5, offset))  # the norm of exactly this h
    if not offset:
        assert same_bits(y, F.rms_norm(h, (hidden,), w, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_in_place_is_bit_identical_to_the_functional_form(dtype):
    x, r = operands((5, 48), dtype, seed=1)
    w = (1 + 0.5 * torch.randn(48)).to(dtype)
    y, h = at.add_rms_norm(x, r, w)
    out = at.add_rms_norm(x, r, w, in_place=True)
    assert out[0] is x and out[1] is r
    assert same_bits(x, y) and same_bits(r, h)


def test_cpu_in_place_into_strided_tensors():
    base_x, base_r = operands((48, 5), torch.float16, seed=2)
    x, r = base_x.t(), base_r.t()
    y, h = at.add_rms_norm(x, r)
    at.add_rms_norm(x, r, in_place=True)
    assert same_bits(x.contiguous(), y) and same_bits(r.contiguous(), h)


def test_in_place_refuses_shared_memory():
    x = torch.randn(3, 16)
    with pytest.raises(InputError) as info:
        at.add_rms_norm(x, x, in_place=True)
    assert str(info.value).startswith("residual shares memory with x") and "\n" not in str(
        info.value
    )
    both = torch.randn(3, 16)
    with pytest.raises(InputError, match="^residual shares memory with x"):
        at.add_rms_norm(both[:2], both[1:], in_place=True)
    # Interleaved columns of one buffer: disjoint elements, but their ranges overlap.
    cols = torch.randn(16, 4)
    with pytest.raises(InputError, match="^residual shares memory with x"):
        at.add_rms_norm(cols[:, 0::2], cols[:, 1::2], in_place=True)
    y, h = at.add_rms_norm(x, x)  # the functional form reads both and writes neither
    assert torch.equal(h, x + x)


def test_in_place_refuses_tensors_that_need_a_gradient():
    x, r = torch.randn(2, 8, requires_grad=True), torch.randn(2, 8)
    w = nn.Parameter(torch.ones(8))
    for args in ((x, r, None), (r.clone(), x, None), (r.clone(), r.clone(), w)):
        with pytest.raises(InputError, match="^in_place=True has no gradient"):
            at.add_rms_norm(*args, in_place=True)
    with torch.no_grad():  # an engine's inference: allowed, and the leaf is written
        xl = torch.randn(2, 8, requires_grad=True)
        rl = torch.randn(2, 8)
        want = at.add_rms_norm(xl.detach().clone(), rl.clone(), w)
        at.add_rms_norm(xl, rl, w, in_place=True)
    assert torch.equal(xl.detach(), want[0]) and torch.equal(rl, want[1])


def test_default_eps_is_torchs():
    x = (1e-4 * torch.randn(4, 32)).to(torch.bfloat16)  # mean square ~1e-8: eps shows
    y, h = at.add_rms_norm(x, x)
    assert torch.equal(y, F.rms_norm(h, (32,)))


def test_empty_rows_return_empty():
    x = torch.empty(0, 16)
    y, h = at.add_rms_norm(x, x.clone())
    assert y.shape == h.shape == (0, 16)
    out = at.add_rms_norm(x, torch.empty(0, 16), in_place=True)
    assert out[0] is x


X8 = torch.randn(2, 8)
BAD = [
    ((X8, X8[:1], None, 1e-5, False), ShapeError, "residual"),
    ((X8, X8.reshape(1, 2, 8), None, 1e-5, False), ShapeError, "residual"),
    ((X8, X8.half(), None, 1e-5, False), UnsupportedDtypeError, "residual"),
    ((X8, X8.to("meta"), None, 1e-5, False), DeviceMismatchError, "residual"),
    ((X8, X8.tolist(), None, 1e-5, False), InputError, "residual"),
    ((X8, None, None, 1e-5, False), InputError, "residual"),
    ((X8.double(), X8.double(), None, 1e-5, False), UnsupportedDtypeError, "x"),
    ((X8, X8, torch.ones(7), 1e-5, False), ShapeError, "weight"),
    ((X8, X8, torch.ones(8, dtype=torch.float16), 1e-5, False), UnsupportedDtypeError,
     "weight"),
    ((X8, X8, None, 0.0, False), InputError, "eps"),
    ((X8, X8, None, "1e-5", False), InputError, "eps"),
    ((X8, X8, torch.ones(8), 1e-5, 1), InputError, "weight_offset"),
    ((X8, X8, None, 1e-5, True), InputError, "weight_offset"),
    ((X8.tolist(), X8, None, 1e-5, False), InputError, "x"),
]
BAD_IDS = ["residual-rows", "residual-3d", "residual-dtype", "residual-device",
           "residual-list", "residual-none", "float64", "weight-size", "weight-dtype",
           "eps-zero", "eps-str", "offset-int", "offset-no-weight", "x-list"]


@pytest.mark.parametrize("args, error, name", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("mode", ["inference", "autograd", "in-place"])
def test_bad_arguments_are_named_in_one_line(args, error, name, mode):
    x, residual, weight, eps, offset = args
    if isinstance(x, torch.Tensor):
        x = x.clone()
        if mode == "autograd":
            x.requires_grad_()
    if isinstance(residual, torch.Tensor) and mode == "in-place":
        residual = residual.clone()
    with pytest.raises(error) as info:
        at.add_rms_norm(x, residual, weight, eps, offset, in_place=mode == "in-place")
    message = str(info.value)
    assert message.startswith(name) and "\n" not in message, message


@pytest.mark.parametrize("value", [1, None, "yes"])
def test_in_place_must_be_a_bool(value):
    with pytest.raises(InputError, match="^in_place must be True or False"):
        at.add_rms_norm(X8, X8, in_place=value)


# --------------------------------------------------------------------------------------------
# Autograd and torch.compile on CPU
# --------------------------------------------------------------------------------------------


def reference_grads(x, r, w, grad_y, grad_h, eps, offset=False):
    """Gradients of (y, h) by torch's autograd through h = x + r and the float64 formula."""
    leaves = [t.double().requires_grad_() for t in (x, r)]
    wd = None if w is None else w.double().requires_grad_()
    h = leaves[0] + leaves[1]
    y = formula(h, wd, eps, offset)
    torch.autograd.backward((y, h), (grad_y.double(), grad_h.double()))
    return leaves[0].grad, leaves[1].grad, None if wd is None else wd.grad


@pytest.mark.parametrize("form", ["weight", "offset", "none"])
@pytest.mark.parametrize("shape", [(40,), (2, 5, 40)])
def test_cpu_gradients_of_both_outputs(form, shape):
    torch.manual_seed(0)
    x, r = 1 + 2 * torch.randn(shape), torch.randn(shape)
    w = None if form == "none" else 1 + 0.5 * torch.randn(shape[-1])
    grad_y, grad_h = torch.randn(shape), torch.randn(shape)
    xg, rg = x.clone().requires_grad_(), r.clone().requires_grad_()
    wg = None if w is None else w.clone().requires_grad_()
    y, h = at.add_rms_norm(xg, rg, wg, 1e-5, form == "offset")
    assert "autonorm" in y.grad_fn.name().lower()
    torch.autograd.backward((y, h), (grad_y, grad_h))
    want = reference_grads(x, r, w, grad_y, grad_h, 1e-5, form == "offset")
    assert_rel(xg.grad, want[0], 1e-5, "grad x")
    assert_rel(rg.grad, want[1], 1e-5, "grad residual")
    assert xg.grad.data_ptr() != rg.grad.data_ptr()  # each leaf owns its gradient
    if w is not None:
        assert_rel(wg.grad, want[2], 1e-5, "grad weight")


def test_cpu_gradients_through_y_only_and_bfloat16():
    torch.manual_seed(0)
    x, r = operands((8, 64), torch.bfloat16, seed=3)
    w = (1 + 0.5 * torch.randn(64)).to(torch.bfloat16)
    xa, ra = x.clone().requires_grad_(), r.clone().requires_grad_()
    F.rms_norm(xa + ra, (64,), w, 1e-6).float().square().sum().backward()
    xb, rb = x.clone().requires_grad_(), r.clone().requires_grad_()
    y, _ = at.add_rms_norm(xb, rb, w, 1e-6)  # h unused: its gradient is zero
    y.float().square().sum().backward()
    assert xb.grad.dtype == rb.grad.dtype == torch.bfloat16 and w.grad is None
    assert_rel(xb.grad, xa.grad, 3e-2, "grad x")
    assert torch.equal(xb.grad, rb.grad)


def test_compile_functional_block_cpu_without_graph_breaks():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block(32, 4, at.FusedAddRMSNorm)
    randomize(model)
    ref = Block(32, 4, TorchFusedAddRMSNorm)
    ref.load_state_dict(model.state_dict())
    x, r = torch.randn(2, 7, 32), torch.randn(2, 7, 32)
    explanation = torch._dynamo.explain(model)(x, r)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    # aot_eager traces forward and backward through the fake and autograd registrations
    # without needing a C++ compiler.
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        got, want = compiled(x, r), ref(x, r)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    for m in (compiled, ref):
        out, res = m(x, r)
        (out.square().sum() + res.sin().sum()).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_rel(p.grad, q.grad, 1e-4, name)


def test_compile_in_place_op_cpu_without_graph_breaks():
    torch._dynamo.reset()
    norm = at.FusedAddRMSNorm(32, in_place=True)
    randomize(norm)

    def step(x, residual):
        x, residual = norm(x * 2, residual)
        return x + 1, residual

    x, r = torch.randn(4, 32), torch.randn(4, 32)
    with torch.no_grad():
        want_y, want_h = at.add_rms_norm(x * 2, r, norm.weight, 1e-6)
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        rc = r.clone()
        got_y, got_h = compiled(x, rc)
    assert same_bits(rc, want_h)  # the caller's residual was updated in place
    assert same_bits(got_h, want_h) and same_bits(got_y, want_y + 1)


def test_cpu_autocast_casts_the_weight_to_x_dtype():
    x, r = operands((4, 32), torch.bfloat16, seed=6)
    w = 1 + 0.5 * torch.randn(32)  # float32, as a model's parameter
    want = at.add_rms_norm(x, r, w.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        got = at.add_rms_norm(x, r, w)
    for g, e in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16 and same_bits(g, e)


# --------------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------------


def test_module_construction_state_dict_and_repr():
    m = at.FusedAddRMSNorm(8)
    assert list(m.state_dict()) == ["weight"] == list(TorchFusedAddRMSNorm(8).state_dict())
    assert torch.equal(m.weight, torch.ones(8)) and m.eps == 1e-6
    assert repr(m) == "FusedAddRMSNorm(8, eps=1e-06, elementwise_affine=True)"
    gemma = at.FusedAddRMSNorm(8, eps=None, weight_offset=True, dtype=torch.bfloat16)
    assert torch.equal(gemma.weight, torch.zeros(8, dtype=torch.bfloat16))
    assert repr(gemma).endswith("weight_offset=True)")
    bare = at.FusedAddRMSNorm(8, elementwise_affine=False, in_place=True)
    assert bare.weight is None and list(bare.state_dict()) == []
    params = inspect.signature(at.FusedAddRMSNorm.__init__).parameters
    assert [p.name for p in params.values() if p.kind is p.KEYWORD_ONLY] == [
        "weight_offset", "in_place"
    ]


def test_module_loads_a_reference_state_dict_and_matches_it():
    ref = TorchFusedAddRMSNorm(24, eps=1e-5)
    randomize(ref)
    ours = at.FusedAddRMSNorm(24, eps=1e-5)
    ours.load_state_dict(ref.state_dict(), strict=True)
    x, r = torch.randn(3, 24), torch.randn(3, 24)
    with torch.no_grad():
        for got, want in zip(ours(x, r), ref(x, r), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_module_in_place_writes_its_arguments():
    m = at.FusedAddRMSNorm(16, in_place=True)
    x, r = torch.randn(2, 16), torch.randn(2, 16)
    want = at.add_rms_norm(x, r, m.weight.detach(), 1e-6)
    with torch.no_grad():
        out = m(x, r)
    assert out[0] is x and out[1] is r and torch.equal(x, want[0]) and torch.equal(r, want[1])
    with pytest.raises(InputError, match="^in_place=True has no gradient"):
        m(torch.randn(2, 16), torch.randn(2, 16))  # its weight requires grad


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"hidden_size": 0}, "hidden_size must be a positive int"),
        ({"hidden_size": 8.0}, "hidden_size must be a positive int"),
        ({"eps": 0.0}, "eps must be None or > 0"),
        ({"eps": True}, "eps must be None or > 0"),
        ({"weight_offset": 1}, "weight_offset must be True or False"),
        ({"in_place": "yes"}, "in_place must be True or False"),
        ({"weight_offset": True, "elementwise_affine": False}, "needs elementwise_affine"),
    ],
)
def test_module_rejects_bad_arguments_in_one_line(kwargs, match):
    kwargs = {"hidden_size": 8, **kwargs}
    with pytest.raises(InputError, match=match) as info:
        at.FusedAddRMSNorm(**kwargs)
    assert "\n" not in str(info.value)


def test_module_rejects_a_wrong_hidden_size():
    with pytest.raises(ShapeError, match="last dimension must be 8"):
        at.FusedAddRMSNorm(8)(torch.randn(3, 9), torch.randn(3, 9))


# --------------------------------------------------------------------------------------------
# The CUDA launch path, with a fake dispatcher (runs on CPU)
# --------------------------------------------------------------------------------------------


HOST_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def host_tensor(ptr: int, numel: int, dtype) -> torch.Tensor:
    """The ``numel`` elements of ``dtype`` at host address ``ptr``, as a tensor sharing them."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=dtype)


class HostKernel:
    """Stands in for a residual kernel of either norm: computes on the host memory behind its
    pointers, the residual and h in the problem's h dtype (float32 beside 16-bit x where the
    residual is wide)."""

    def __init__(self, problem, rows, device_id) -> None:
        self.problem, self.rows, self.device_id = problem, rows, device_id
        self.launches: list[tuple] = []

    def launch(self, args, stream_ptr) -> None:
        self.launches.append((*args, stream_ptr))
        xp, rp, wp, bp, yp, hp, rows, eps = args
        p = self.problem
        rms = p.op == "rms_norm"
        assert (wp != 0) == p.has_weight
        assert (bp != 0) == (not rms and p.has_bias)  # RMSNorm takes no bias
        dtype, h_dtype = HOST_DTYPES[p.dtype], HOST_DTYPES[p.h_dtype]
        n = rows * p.hidden
        x = host_tensor(xp, n, dtype).view(rows, p.hidden)
        r = host_tensor(rp, n, h_dtype).view(rows, p.hidden)
        w = host_tensor(wp, p.hidden, dtype) if p.has_weight else None
        if rms:
            y, h = residual_forward.forward_add_rms_reference(x, r, w, eps, p.weight_offset)
        else:
            b = host_tensor(bp, p.hidden, dtype) if p.has_bias else None
            y, h = residual_forward.forward_add_ln_reference(x, r, w, b, eps)
        # Both results first, then the writes: y and h may be x's and residual's memory.
        host_tensor(hp, n, h_dtype).copy_(h.flatten())
        host_tensor(yp, n, dtype).copy_(y.flatten())


def host_dispatch(monkeypatch, kernel_type):
    """Route the forwards' lookups to a fake dispatcher that makes ``kernel_type`` kernels (CPU
    tensors stand in for CUDA ones); yields the kernels made, in order."""
    made = []

    def get_kernel(problem, rows, device_id):
        kernel = kernel_type(problem, rows, device_id)
        made.append(kernel)
        return kernel

    module = types.ModuleType("autonorm.dispatch")
    module.get_kernel = get_kernel
    monkeypatch.setitem(sys.modules, "autonorm.dispatch", module)
    monkeypatch.setattr(forward, "_current_device", lambda: -1)  # a CPU tensor's get_device()
    monkeypatch.setattr(residual_forward, "_current_device", lambda: -1)
    monkeypatch.setattr(residual_forward, "_raw_stream", lambda device_id: 0xABC0)
    forward.clear_kernel_cache()
    yield made
    forward.clear_kernel_cache()


@pytest.fixture
def fake_dispatch(monkeypatch):
    """Route the forwards' lookups to :class:`HostKernel`s; yields the kernels made."""
    yield from host_dispatch(monkeypatch, HostKernel)


def test_launch_arguments_and_results(fake_dispatch):
    x, r = operands((3, 5, 64), torch.bfloat16)
    w = (0.3 * torch.randn(64)).to(torch.bfloat16)
    y, h = residual_forward.forward_add_rms_cuda(x, r, w, 1e-6, True)
    (kernel,) = fake_dispatch
    p = kernel.problem
    assert (p.op, p.hidden, p.dtype, p.has_weight, p.weight_offset, p.residual) == (
        "rms_norm", 64, "bfloat16", True, True, True
    )
    assert kernel.rows == 15 and kernel.device_id == -1
    ((xp, rp, wp, bp, yp, hp, rows, eps, stream),) = kernel.launches
    assert (xp, rp, wp, bp) == (x.data_ptr(), r.data_ptr(), w.data_ptr(), 0)
    assert (yp, hp) == (y.data_ptr(), h.data_ptr()) and len({xp, rp, yp, hp}) == 4
    assert rows == 15 and eps == 1e-6 and type(eps) is float and stream == 0xABC0
    assert same_bits(h, rounded_sum(x, r))
    assert same_bits(y, at.rms_norm(h, w, 1e-6, True))


def test_in_place_launch_writes_over_x_and_residual(fake_dispatch):
    x, r = operands((4, 32), torch.float16, seed=4)
    want = residual_forward.forward_add_rms_cuda(x, r, None, 1e-5, False)
    xp, rp = x.data_ptr(), r.data_ptr()
    out = residual_forward.forward_add_rms_cuda(x, r, None, 1e-5, False, True)
    assert out[0] is x and out[1] is r
    launch = fake_dispatch[0].launches[-1]
    assert launch[:6] == (xp, rp, 0, 0, xp, rp)
    assert same_bits(x, want[0]) and same_bits(r, want[1])  # bit-identical to the functional


def test_in_place_on_strided_and_misaligned_tensors_copies_back(fake_dispatch):
    base_x, base_r = operands((32, 4), torch.float32, seed=5)
    x = base_x.t()  # strided
    r = torch.empty(4 * 32 + 1)[1:].view(4, 32)  # 4-byte offset: misaligned
    r.copy_(base_r.t())
    want = at.add_rms_norm(x.contiguous(), r.clone())
    residual_forward.forward_add_rms_cuda(x, r, None, 1e-6, False, True)
    xp, rp, _, _, yp, hp = fake_dispatch[0].launches[-1][:6]
    assert xp % 16 == 0 and rp % 16 == 0 and rp != r.data_ptr() and yp != x.data_ptr()
    assert same_bits(x.contiguous(), want[0]) and same_bits(r, want[1])


def test_kernel_cache_per_weight_form_and_rows_bucket(fake_dispatch):
    w = torch.ones(32)
    for rows in (3, 4, 4, 3):  # one bucket (4)
        residual_forward.forward_add_rms_cuda(torch.randn(rows, 32), torch.randn(rows, 32), w,
                                              1e-5, False)
    assert len(fake_dispatch) == 1 and len(fake_dispatch[0].launches) == 4
    x, r = torch.randn(5, 32), torch.randn(5, 32)
    residual_forward.forward_add_rms_cuda(x, r, w, 1e-5, True)  # bucket 8, offset
    residual_forward.forward_add_rms_cuda(x, r, None, 1e-5, False, True)  # in place, no weight
    assert [(k.problem.has_weight, k.problem.weight_offset) for k in fake_dispatch] == [
        (True, False), (True, True), (False, False)
    ]
    assert len(forward._ADD_RMS_KERNELS) == 3 and not forward._RMS_KERNELS
    at.clear_kernel_cache()
    assert not forward._ADD_RMS_KERNELS


def test_launch_path_validates_and_skips_empty_rows(fake_dispatch):
    e = torch.empty(0, 64)
    y, h = residual_forward.forward_add_rms_cuda(e, e.clone(), None, 1e-5, False)
    assert y.shape == h.shape == (0, 64)
    with pytest.raises(ShapeError, match="^residual"):
        residual_forward.forward_add_rms_cuda(torch.randn(2, 8), torch.randn(2, 9), None, 1e-5,
                                              False)
    with pytest.raises(InputError, match="^residual shares memory"):
        x = torch.randn(2, 8)
        residual_forward.forward_add_rms_cuda(x, x, None, 1e-5, False, True)
    assert not fake_dispatch


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------

# Each distinct (dtype, hidden, weight form) compiles a kernel: the tests share (4, 1001).
HIDDEN = 1001


def cuda_operands(dtype, form="weight", seed=0):
    x, r = operands((4, HIDDEN), dtype, seed)
    w = None
    if form != "none":
        gen = torch.Generator().manual_seed(seed + 1)
        w = ((0.0 if form == "offset" else 1.0) + 0.5 * torch.randn(HIDDEN, generator=gen))
        w = w.to(dtype).cuda()
    return x.cuda(), r.cuda(), w


@gpu
@pytest.mark.parametrize(
    "dtype, form",
    [(torch.float32, "weight"), (torch.float16, "weight"), (torch.bfloat16, "weight"),
     (torch.bfloat16, "none"), (torch.bfloat16, "offset")],
)
def test_gpu_matches_the_reference_and_in_place_is_bit_identical(dtype, form):
    x, r, w = cuda_operands(dtype, form)
    offset = form == "offset"
    before = (x.clone(), r.clone())
    with torch.no_grad():
        y, h = at.add_rms_norm(x, r, w, 1e-5, offset)
    assert same_bits(x, before[0]) and same_bits(r, before[1])
    assert same_bits(h, rounded_sum(x, r))
    err = measure_error(y.double().cpu().numpy(), formula(h, w, 1e-5, offset).cpu().numpy())
    assert err.within(DTYPE_NAMES[dtype]), err
    if not offset:
        torch.testing.assert_close(y, F.rms_norm(h, (HIDDEN,), w, 1e-5), **TOL[dtype])
    with torch.inference_mode():
        xi, ri = x.clone(), r.clone()
        out = at.add_rms_norm(xi, ri, w, 1e-5, offset, in_place=True)
        torch.cuda.synchronize()
    assert out[0] is xi and out[1] is ri
    assert same_bits(xi, y) and same_bits(ri, h)
    # The strided in-place form (computed aside, copied back) gives the same bits too.
    xs = torch.empty(HIDDEN, 4, device="cuda", dtype=dtype).t()
    rs = torch.empty(HIDDEN, 4, device="cuda", dtype=dtype).t()
    xs.copy_(x)
    rs.copy_(r)
    with torch.no_grad():
        torch.ops.autonorm.fused_add_rms_norm_(xs, rs, w, 1e-5, offset)
    assert same_bits(xs.contiguous(), y) and same_bits(rs.contiguous(), h)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_gradients_match_torch_autograd(dtype):
    x, r, w = cuda_operands(dtype)
    grad_y, grad_h = (torch.randn_like(x, dtype=torch.float32).to(dtype) for _ in range(2))
    xa, ra, wa = (t.clone().requires_grad_() for t in (x, r, w))
    ha = xa + ra
    ya = F.rms_norm(ha, (HIDDEN,), wa, 1e-6)
    torch.autograd.backward((ya, ha), (grad_y, grad_h))
    xb, rb, wb = (t.clone().requires_grad_() for t in (x, r, w))
    yb, hb = at.add_rms_norm(xb, rb, wb, 1e-6)
    torch.testing.assert_close(yb, ya, **TOL[dtype])
    assert same_bits(hb, ha.detach())
    torch.autograd.backward((yb, hb), (grad_y, grad_h))
    for got, want, what in ((xb, xa, "x"), (rb, ra, "residual"), (wb, wa, "weight")):
        assert got.grad.dtype == dtype
        assert_rel(got.grad, want.grad, GRAD_TOL[dtype], f"grad {what}")


@gpu
def test_gpu_compiled_block_has_no_graph_break_and_matches_torch():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block(256, 8, at.FusedAddRMSNorm).cuda()
    randomize(model)
    ref = Block(256, 8, TorchFusedAddRMSNorm).cuda()
    ref.load_state_dict(model.state_dict())
    x, r = torch.randn(2, 32, 256, device="cuda"), torch.randn(2, 32, 256, device="cuda")
    assert torch._dynamo.explain(model)(x, r).graph_break_count == 0
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        for got, want in zip(compiled(x, r), ref(x, r), strict=True):
            assert_rel(got, want, 1e-4, "compiled forward")
    for m in (compiled, ref):
        out, res = m(x, r)
        (out.square().mean() + res.square().mean()).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_rel(p.grad, q.grad, 1e-3, f"compiled gradient of {name}")


@gpu
def test_gpu_cuda_graph_capture_and_replay_of_the_in_place_op():
    torch.manual_seed(0)
    dtype = torch.bfloat16
    model = Block(256, 8, lambda d: at.FusedAddRMSNorm(d, in_place=True)).to("cuda", dtype)
    randomize(model)
    ref = Block(256, 8, TorchFusedAddRMSNorm).to("cuda", dtype)
    ref.load_state_dict(model.state_dict())
    static_x = torch.randn(2, 32, 256, device="cuda").to(dtype)
    static_r = torch.randn(2, 32, 256, device="cuda").to(dtype)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up: the kernels are compiled and cached before capture
                model(static_x.clone(), static_r.clone())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out, static_res = model(static_x, static_r)
        assert static_res is static_r  # the residual stream is updated in place
        for _ in range(2):
            new_x = torch.randn(2, 32, 256, device="cuda").to(dtype)
            new_r = torch.randn(2, 32, 256, device="cuda").to(dtype)
            static_x.copy_(new_x)
            static_r.copy_(new_r)
            static_out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            want_out, want_res = ref(new_x, new_r)
            assert_rel(static_out, want_out, 3e-2, "replayed block")
            assert_rel(static_r, want_res, 1e-2, "replayed residual")


@gpu
def test_gpu_autocast_runs_in_float32_like_torch():
    torch.manual_seed(0)
    proj = nn.Linear(256, 256).cuda()
    ours = at.FusedAddRMSNorm(256).cuda()
    randomize(ours)
    ref = TorchFusedAddRMSNorm(256).cuda()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(64, 256, device="cuda")
    r = torch.randn(64, 256, device="cuda")  # the residual stream stays float32
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        want, got = ref(proj(x), r), ours(proj(x), r)
    for g, e in zip(got, want, strict=True):
        assert g.dtype == e.dtype == torch.float32
        torch.testing.assert_close(g, e, **TOL[torch.float32])
    with torch.autocast("cuda", dtype=torch.bfloat16):  # the autograd path: the op's rule
        assert [t.dtype for t in ours(proj(x), r)] == [torch.float32, torch.float32]
