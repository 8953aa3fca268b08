"""Tests of autonorm.torch's residual add and LayerNorm: add_layer_norm and its two custom ops
(the functional one and the in-place one with vLLM's semantics).

CPU tests run everywhere torch is installed; the CUDA launch path is tested on CPU too, through a
fake dispatcher whose kernel computes on the host memory behind the pointers it is given. Tests
marked ``gpu`` need a CUDA GPU, torch with CUDA and CuPy, and skip themselves otherwise.
"""

from __future__ import annotations

import inspect

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
from test_torch_add_rms import (  # noqa: E402  (the residual-add tests' helpers)
    Block,
    HostKernel,
    host_dispatch,
    operands,
    randomize,
    rounded_sum,
    same_bits,
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

FORMS = ["both", "weight", "bias", "none"]


def formula(h, weight, bias, eps):
    """LayerNorm of h in float64 from its definition (two-pass variance)."""
    hd = h.double()
    hc = hd - hd.mean(-1, keepdim=True)
    y = hc / torch.sqrt(hc.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def affine(hidden, dtype, form, seed=0, device="cpu"):
    """Weight and bias of the form, far from the identity (so a dropped one shows)."""
    gen = torch.Generator().manual_seed(seed)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(dtype).to(device)
    b = (0.5 * torch.randn(hidden, generator=gen)).to(dtype).to(device)
    return (w if form in ("both", "weight") else None), (b if form in ("both", "bias") else None)


class AddLayerNorm(nn.Module):
    """autonorm's fused add + LayerNorm as a module: ``(x, residual) -> (y, h)``."""

    def __init__(self, hidden: int, eps: float = 1e-5, in_place: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.in_place = in_place
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x, residual):
        return at.add_layer_norm(
            x, residual, self.weight, self.bias, self.eps, in_place=self.in_place
        )


class TorchAddLayerNorm(nn.Module):
    """The unfused reference: h = x + residual, then torch's layer_norm of h."""

    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x, residual):
        h = x + residual
        return F.layer_norm(h, (h.shape[-1],), self.weight, self.bias, self.eps), h


# --------------------------------------------------------------------------------------------
# The ops' registration
# --------------------------------------------------------------------------------------------


def test_the_ops_are_registered_with_their_schemas():
    assert str(torch.ops.autonorm.add_layer_norm.default._schema) == (
        "autonorm::add_layer_norm(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, "
        "float eps) -> (Tensor, Tensor)"
    )
    assert str(torch.ops.autonorm.fused_add_layer_norm_.default._schema) == (
        "autonorm::fused_add_layer_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor? weight, "
        "Tensor? bias, float eps) -> ()"
    )


def test_the_public_signature():
    params = inspect.signature(at.add_layer_norm).parameters
    assert list(params) == ["x", "residual", "weight", "bias", "eps", "in_place",
                            "residual_dtype"]
    assert params["eps"].default == 1e-5 and params["weight"].default is None
    assert params["in_place"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["residual_dtype"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "add_layer_norm" in at.__all__


@pytest.mark.parametrize("form", FORMS)
def test_opcheck(form):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32, requires_grad=True)
    r = torch.randn(3, 5, 32, requires_grad=True)
    w, b = affine(32, torch.float32, form)
    w = None if w is None else w.requires_grad_()
    b = None if b is None else b.requires_grad_()
    torch.library.opcheck(torch.ops.autonorm.add_layer_norm.default, (x, r, w, b, 1e-5))
    wd = None if w is None else w.detach()
    bd = None if b is None else b.detach()
    torch.library.opcheck(
        torch.ops.autonorm.fused_add_layer_norm_.default,
        (x.detach().clone(), r.detach().clone(), wd, bd, 1e-5),
    )


def test_fake_tensors_get_shapes_and_trace_time_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 3, 64, dtype=torch.bfloat16).transpose(0, 1)
        r = torch.empty(3, 4, 64, dtype=torch.bfloat16)
        w = torch.empty(64, dtype=torch.bfloat16)
        y, h = torch.ops.autonorm.add_layer_norm(x, r, w, w, 1e-5)
        for t in (y, h):
            assert t.shape == (3, 4, 64) and t.dtype == torch.bfloat16 and t.is_contiguous()
        y, h = at.add_layer_norm(x, r, w, None)  # a FakeTensor goes through the op
        assert y.shape == h.shape == (3, 4, 64)
        assert torch.ops.autonorm.fused_add_layer_norm_(x, r, w, w, 1e-5) is None
        with pytest.raises(ShapeError, match="^residual must have x's shape"):
            torch.ops.autonorm.add_layer_norm(x, r[:1], w, None, 1e-5)
        with pytest.raises(ShapeError, match="^bias must be 1-D"):
            torch.ops.autonorm.add_layer_norm(x, r, w, w[:3], 1e-5)
        with pytest.raises(UnsupportedDtypeError, match="^residual has dtype"):
            torch.ops.autonorm.fused_add_layer_norm_(x, r.half(), w, None, 1e-5)


# --------------------------------------------------------------------------------------------
# CPU forward, the in-place form and validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", [(40,), (3, 17), (2, 3, 1001)])
def test_cpu_sum_is_exact_and_the_norm_is_torchs(dtype, form, shape):
    x, r = operands(shape, dtype)
    hidden = shape[-1]
    w, b = affine(hidden, dtype, form)
    before = (x.clone(), r.clone())
    y, h = at.add_layer_norm(x, r, w, b, 1e-5)
    assert y.dtype == h.dtype == dtype and y.shape == h.shape == x.shape
    assert y.is_contiguous() and h.is_contiguous()
    assert same_bits(h, rounded_sum(x, r))
    assert same_bits(x, before[0]) and same_bits(r, before[1])
    assert same_bits(y, F.layer_norm(h, (hidden,), w, b, 1e-5))  # the norm of exactly this h
    assert same_bits(y, at.layer_norm(h, w, b, 1e-5))
    err = measure_error(y.double().numpy(), formula(h, w, b, 1e-5).numpy())
    assert err.within(DTYPE_NAMES[dtype]), err


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["both", "none"])
def test_cpu_in_place_is_bit_identical_to_the_functional_form(dtype, form):
    x, r = operands((5, 48), dtype, seed=1)
    w, b = affine(48, dtype, form, seed=1)
    y, h = at.add_layer_norm(x, r, w, b)
    out = at.add_layer_norm(x, r, w, b, in_place=True)
    assert out[0] is x and out[1] is r
    assert same_bits(x, y) and same_bits(r, h)


def test_cpu_in_place_op_is_bit_identical_to_the_functional_op():
    x, r = operands((3, 2, 40), torch.bfloat16, seed=7)
    w, b = affine(40, torch.bfloat16, "both", seed=7)
    y, h = torch.ops.autonorm.add_layer_norm(x, r, w, b, 1e-5)
    assert torch.ops.autonorm.fused_add_layer_norm_(x, r, w, b, 1e-5) is None
    assert same_bits(x, y) and same_bits(r, h)


def test_cpu_in_place_into_strided_tensors():
    base_x, base_r = operands((48, 5), torch.float16, seed=2)
    x, r = base_x.t(), base_r.t()
    w, b = affine(48, torch.float16, "both", seed=2)
    y, h = at.add_layer_norm(x, r, w, b)
    at.add_layer_norm(x, r, w, b, in_place=True)
    assert same_bits(x.contiguous(), y) and same_bits(r.contiguous(), h)


def test_in_place_refuses_shared_memory():
    x = torch.randn(3, 16)
    before = x.clone()
    with pytest.raises(InputError) as info:
        at.add_layer_norm(x, x, in_place=True)
    message = str(info.value)
    assert message.startswith("residual shares memory with x") and "\n" not in message
    assert torch.equal(x, before)  # refused before anything was written
    both = torch.randn(3, 16)
    with pytest.raises(InputError, match="^residual shares memory with x"):
        at.add_layer_norm(both[:2], both[1:], in_place=True)
    # Interleaved columns of one buffer: disjoint elements, but their ranges overlap.
    cols = torch.randn(16, 4)
    with pytest.raises(InputError, match="^residual shares memory with x"):
        at.add_layer_norm(cols[:, 0::2], cols[:, 1::2], in_place=True)
    y, h = at.add_layer_norm(x, x)  # the functional form reads both and writes neither
    assert torch.equal(h, x + x)


def test_in_place_refuses_tensors_that_need_a_gradient():
    x, r = torch.randn(2, 8, requires_grad=True), torch.randn(2, 8)
    w = nn.Parameter(torch.ones(8))
    b = nn.Parameter(torch.zeros(8))
    cases = ((x, r, None, None), (r.clone(), x, None, None), (r.clone(), r.clone(), w, None),
             (r.clone(), r.clone(), None, b))
    for args in cases:
        with pytest.raises(InputError, match="^in_place=True has no gradient") as info:
            at.add_layer_norm(*args, in_place=True)
        assert "weight and bias" in str(info.value)
    with torch.no_grad():  # an engine's inference: allowed, and the leaf is written
        xl = torch.randn(2, 8, requires_grad=True)
        rl = torch.randn(2, 8)
        want = at.add_layer_norm(xl.detach().clone(), rl.clone(), w, b)
        at.add_layer_norm(xl, rl, w, b, in_place=True)
    assert torch.equal(xl.detach(), want[0]) and torch.equal(rl, want[1])


def test_in_place_bumps_versions_so_saved_tensors_refuse_backward():
    a = torch.randn(2, 8, requires_grad=True)
    x = a * 1
    s = x.sin()  # saves x for its backward
    r = torch.randn(2, 8)
    versions = (x._version, r._version)
    with torch.no_grad():
        at.add_layer_norm(x, r, in_place=True)
    assert x._version > versions[0] and r._version > versions[1]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s.sum().backward()


def test_default_eps_is_torchs():
    x = (1e-3 * torch.randn(4, 32)).to(torch.bfloat16)  # variance ~1e-6: eps shows
    y, h = at.add_layer_norm(x, x)
    assert torch.equal(y, F.layer_norm(h, (32,)))
    assert not torch.equal(y, F.layer_norm(h, (32,), eps=1e-6))


def test_empty_rows_return_empty():
    x = torch.empty(0, 16)
    y, h = at.add_layer_norm(x, x.clone())
    assert y.shape == h.shape == (0, 16)
    out = at.add_layer_norm(x, torch.empty(0, 16), in_place=True)
    assert out[0] is x


X8 = torch.randn(2, 8)
BAD = [
    ((X8, X8[:1], None, None, 1e-5), ShapeError, "residual"),
    ((X8, X8.reshape(1, 2, 8), None, None, 1e-5), ShapeError, "residual"),
    ((X8, X8.half(), None, None, 1e-5), UnsupportedDtypeError, "residual"),
    ((X8, X8.to("meta"), None, None, 1e-5), DeviceMismatchError, "residual"),
    ((X8, X8.tolist(), None, None, 1e-5), InputError, "residual"),
    ((X8, None, None, None, 1e-5), InputError, "residual"),
    ((X8.double(), X8.double(), None, None, 1e-5), UnsupportedDtypeError, "x"),
    ((X8[0, 0], X8[0, 0], None, None, 1e-5), ShapeError, "x"),
    ((X8, X8, torch.ones(7), None, 1e-5), ShapeError, "weight"),
    ((X8, X8, torch.ones(8, dtype=torch.float16), None, 1e-5), UnsupportedDtypeError,
     "weight"),
    ((X8, X8, torch.ones(8).tolist(), None, 1e-5), InputError, "weight"),
    ((X8, X8, None, torch.zeros(8, 1), 1e-5), ShapeError, "bias"),
    ((X8, X8, None, torch.zeros(8, dtype=torch.bfloat16), 1e-5), UnsupportedDtypeError,
     "bias"),
    ((X8, X8, None, torch.zeros(8, device="meta"), 1e-5), DeviceMismatchError, "bias"),
    ((X8, X8, None, None, 0.0), InputError, "eps"),
    ((X8, X8, None, None, float("nan")), InputError, "eps"),
    ((X8, X8, None, None, "1e-5"), InputError, "eps"),
    ((X8.tolist(), X8, None, None, 1e-5), InputError, "x"),
]
BAD_IDS = ["residual-rows", "residual-3d", "residual-dtype", "residual-device",
           "residual-list", "residual-none", "float64", "x-0d", "weight-size", "weight-dtype",
           "weight-list", "bias-2d", "bias-dtype", "bias-device", "eps-zero", "eps-nan",
           "eps-str", "x-list"]


@pytest.mark.parametrize("args, error, name", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("mode", ["inference", "autograd", "in-place"])
def test_bad_arguments_are_named_in_one_line(args, error, name, mode):
    x, residual, weight, bias, eps = args
    if isinstance(x, torch.Tensor):
        x = x.clone()
        if mode == "autograd":
            x.requires_grad_()
    if isinstance(residual, torch.Tensor) and mode == "in-place":
        residual = residual.clone()
    with pytest.raises(error) as info:
        at.add_layer_norm(x, residual, weight, bias, eps, in_place=mode == "in-place")
    message = str(info.value)
    assert message.startswith(name) and "\n" not in message, message


@pytest.mark.parametrize("value", [1, None, "yes"])
def test_in_place_must_be_a_bool(value):
    with pytest.raises(InputError, match="^in_place must be True or False"):
        at.add_layer_norm(X8, X8, in_place=value)


def test_in_place_is_keyword_only():
    with pytest.raises(TypeError):
        at.add_layer_norm(X8, X8, None, None, 1e-5, True)


# --------------------------------------------------------------------------------------------
# Autograd and torch.compile on CPU
# --------------------------------------------------------------------------------------------


def reference_grads(x, r, w, b, grad_y, grad_h, eps):
    """Gradients of (y, h) by torch's autograd of F.layer_norm(x + r) in float64."""
    leaves = [t.double().requires_grad_() for t in (x, r)]
    wd = None if w is None else w.double().requires_grad_()
    bd = None if b is None else b.double().requires_grad_()
    h = leaves[0] + leaves[1]
    y = F.layer_norm(h, (h.shape[-1],), wd, bd, eps)
    torch.autograd.backward((y, h), (grad_y.double(), grad_h.double()))
    return (leaves[0].grad, leaves[1].grad, None if wd is None else wd.grad,
            None if bd is None else bd.grad)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", [(40,), (2, 5, 40)])
def test_cpu_gradients_of_both_outputs(form, shape):
    torch.manual_seed(0)
    x, r = 1 + 2 * torch.randn(shape), torch.randn(shape)
    w, b = affine(shape[-1], torch.float32, form)
    grad_y, grad_h = torch.randn(shape), torch.randn(shape)
    xg, rg = x.clone().requires_grad_(), r.clone().requires_grad_()
    wg = None if w is None else w.clone().requires_grad_()
    bg = None if b is None else b.clone().requires_grad_()
    y, h = at.add_layer_norm(xg, rg, wg, bg, 1e-5)
    assert "autonorm" in y.grad_fn.name().lower()
    torch.autograd.backward((y, h), (grad_y, grad_h))
    want = reference_grads(x, r, w, b, grad_y, grad_h, 1e-5)
    assert_rel(xg.grad, want[0], 1e-5, "grad x")
    assert_rel(rg.grad, want[1], 1e-5, "grad residual")
    assert xg.grad.data_ptr() != rg.grad.data_ptr()  # each leaf owns its gradient
    if w is not None:
        assert_rel(wg.grad, want[2], 1e-5, "grad weight")
    if b is not None:
        assert_rel(bg.grad, want[3], 1e-5, "grad bias")


def test_cpu_gradients_of_a_subset_of_inputs():
    torch.manual_seed(1)
    x, r = torch.randn(3, 24), torch.randn(3, 24)
    w, b = affine(24, torch.float32, "both")
    grad_y, grad_h = torch.randn(3, 24), torch.randn(3, 24)
    rg, bg = r.clone().requires_grad_(), b.clone().requires_grad_()
    y, h = at.add_layer_norm(x, rg, w, bg)  # x and weight need none
    torch.autograd.backward((y, h), (grad_y, grad_h))
    want = reference_grads(x, r, w, b, grad_y, grad_h, 1e-5)
    assert_rel(rg.grad, want[1], 1e-5, "grad residual")
    assert_rel(bg.grad, want[3], 1e-5, "grad bias")


def test_cpu_gradients_through_y_only_and_bfloat16():
    torch.manual_seed(0)
    x, r = operands((8, 64), torch.bfloat16, seed=3)
    w, b = affine(64, torch.bfloat16, "both", seed=3)
    xa, ra = x.clone().requires_grad_(), r.clone().requires_grad_()
    F.layer_norm(xa + ra, (64,), w, b, 1e-5).float().square().sum().backward()
    xb, rb = x.clone().requires_grad_(), r.clone().requires_grad_()
    y, _ = at.add_layer_norm(xb, rb, w, b, 1e-5)  # h unused: its gradient is zero
    y.float().square().sum().backward()
    assert xb.grad.dtype == rb.grad.dtype == torch.bfloat16 and w.grad is None
    assert_rel(xb.grad, xa.grad, 3e-2, "grad x")
    assert torch.equal(xb.grad, rb.grad)


def test_compile_functional_block_cpu_without_graph_breaks():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block(32, 4, AddLayerNorm)
    randomize(model)
    ref = Block(32, 4, TorchAddLayerNorm)
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
    norm = AddLayerNorm(32, in_place=True)
    randomize(norm)

    def step(x, residual):
        x, residual = norm(x * 2, residual)
        return x + 1, residual

    x, r = torch.randn(4, 32), torch.randn(4, 32)
    with torch.no_grad():
        want_y, want_h = at.add_layer_norm(x * 2, r, norm.weight, norm.bias)
        assert torch._dynamo.explain(step)(x, r.clone()).graph_break_count == 0
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        rc = r.clone()
        got_y, got_h = compiled(x, rc)
    assert same_bits(rc, want_h)  # the caller's residual was updated in place
    assert same_bits(got_h, want_h) and same_bits(got_y, want_y + 1)


def test_cpu_autocast_casts_weight_and_bias_to_x_dtype():
    x, r = operands((4, 32), torch.bfloat16, seed=6)
    w, b = affine(32, torch.float32, "both", seed=6)  # float32, as a model's parameters
    want = at.add_layer_norm(x, r, w.bfloat16(), b.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        got = at.add_layer_norm(x, r, w, b)
    for g, e in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16 and same_bits(g, e)


# --------------------------------------------------------------------------------------------
# The CUDA launch path, with a fake dispatcher (runs on CPU)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_dispatch(monkeypatch):
    """Route the forwards' lookups to :class:`HostKernel`s; yields the kernels made."""
    yield from host_dispatch(monkeypatch, HostKernel)


def test_launch_arguments_and_results(fake_dispatch):
    x, r = operands((3, 5, 64), torch.bfloat16)
    w, b = affine(64, torch.bfloat16, "both")
    y, h = residual_forward.forward_add_ln_cuda(x, r, w, b, 1e-5)
    (kernel,) = fake_dispatch
    p = kernel.problem
    assert (p.op, p.hidden, p.dtype, p.has_weight, p.has_bias, p.residual) == (
        "layer_norm", 64, "bfloat16", True, True, True
    )
    assert kernel.rows == 15 and kernel.device_id == -1
    ((xp, rp, wp, bp, yp, hp, rows, eps, stream),) = kernel.launches
    assert (xp, rp, wp, bp) == (x.data_ptr(), r.data_ptr(), w.data_ptr(), b.data_ptr())
    assert (yp, hp) == (y.data_ptr(), h.data_ptr()) and len({xp, rp, yp, hp}) == 4
    assert rows == 15 and eps == 1e-5 and type(eps) is float and stream == 0xABC0
    assert same_bits(h, rounded_sum(x, r))
    assert same_bits(y, F.layer_norm(h, (64,), w, b, 1e-5))


def test_in_place_launch_writes_over_x_and_residual(fake_dispatch):
    x, r = operands((4, 32), torch.float16, seed=4)
    _, b = affine(32, torch.float16, "bias", seed=4)
    want = residual_forward.forward_add_ln_cuda(x, r, None, b, 1e-5)
    xp, rp = x.data_ptr(), r.data_ptr()
    out = residual_forward.forward_add_ln_cuda(x, r, None, b, 1e-5, True)
    assert out[0] is x and out[1] is r
    launch = fake_dispatch[0].launches[-1]
    assert launch[:6] == (xp, rp, 0, b.data_ptr(), xp, rp)
    assert same_bits(x, want[0]) and same_bits(r, want[1])  # bit-identical to the functional


def test_in_place_on_strided_and_misaligned_tensors_copies_back(fake_dispatch):
    base_x, base_r = operands((32, 4), torch.float32, seed=5)
    x = base_x.t()  # strided
    r = torch.empty(4 * 32 + 1)[1:].view(4, 32)  # 4-byte offset: misaligned
    r.copy_(base_r.t())
    w = torch.empty(33)[1:]  # a misaligned weight is copied to an aligned one
    w.copy_(affine(32, torch.float32, "weight")[0])
    want = at.add_layer_norm(x.contiguous(), r.clone(), w)
    residual_forward.forward_add_ln_cuda(x, r, w, None, 1e-5, True)
    xp, rp, wp, _, yp, hp = fake_dispatch[0].launches[-1][:6]
    assert xp % 16 == 0 and rp % 16 == 0 and wp % 16 == 0 and wp != w.data_ptr()
    assert rp != r.data_ptr() and yp != x.data_ptr()
    assert same_bits(x.contiguous(), want[0]) and same_bits(r, want[1])


def test_kernel_cache_per_affine_form_and_rows_bucket(fake_dispatch):
    w = torch.ones(32)
    for rows in (3, 4, 4, 3):  # one bucket (4)
        residual_forward.forward_add_ln_cuda(torch.randn(rows, 32), torch.randn(rows, 32), w,
                                             w, 1e-5)
    assert len(fake_dispatch) == 1 and len(fake_dispatch[0].launches) == 4
    x, r = torch.randn(5, 32), torch.randn(5, 32)
    residual_forward.forward_add_ln_cuda(x, r, w, None, 1e-5)  # bucket 8, no bias
    residual_forward.forward_add_ln_cuda(x, r, None, None, 1e-5, True)  # in place, bare
    assert [(k.problem.has_weight, k.problem.has_bias) for k in fake_dispatch] == [
        (True, True), (True, False), (False, False)
    ]
    # Its own cache: the plain LayerNorm and the RMSNorm residual kernels are other kernels.
    assert len(forward._ADD_LN_KERNELS) == 3
    assert not forward._KERNELS and not forward._ADD_RMS_KERNELS
    at.clear_kernel_cache()
    assert not forward._ADD_LN_KERNELS


def test_launch_path_validates_and_skips_empty_rows(fake_dispatch):
    e = torch.empty(0, 64)
    y, h = residual_forward.forward_add_ln_cuda(e, e.clone(), None, None, 1e-5)
    assert y.shape == h.shape == (0, 64)
    with pytest.raises(ShapeError, match="^residual"):
        residual_forward.forward_add_ln_cuda(torch.randn(2, 8), torch.randn(2, 9), None, None,
                                             1e-5)
    with pytest.raises(ShapeError, match="^bias"):
        residual_forward.forward_add_ln_cuda(torch.randn(2, 8), torch.randn(2, 8), None,
                                             torch.ones(9), 1e-5)
    with pytest.raises(InputError, match="^residual shares memory"):
        x = torch.randn(2, 8)
        residual_forward.forward_add_ln_cuda(x, x, None, None, 1e-5, True)
    assert not fake_dispatch


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------

# Each distinct (dtype, hidden, affine form) compiles a kernel: the tests share (4, 1001).
HIDDEN = 1001


def cuda_operands(dtype, form="both", seed=0):
    x, r = operands((4, HIDDEN), dtype, seed)
    w, b = affine(HIDDEN, dtype, form, seed + 1, device="cuda")
    return x.cuda(), r.cuda(), w, b


@gpu
@pytest.mark.parametrize(
    "dtype, form",
    [(torch.float32, "both"), (torch.float16, "both"), (torch.bfloat16, "both"),
     (torch.bfloat16, "none"), (torch.float32, "weight"), (torch.bfloat16, "bias")],
)
def test_gpu_matches_the_reference_and_in_place_is_bit_identical(dtype, form):
    x, r, w, b = cuda_operands(dtype, form)
    before = (x.clone(), r.clone())
    with torch.no_grad():
        y, h = at.add_layer_norm(x, r, w, b, 1e-5)
    assert same_bits(x, before[0]) and same_bits(r, before[1])
    assert same_bits(h, rounded_sum(x, r))
    err = measure_error(y.double().cpu().numpy(), formula(h, w, b, 1e-5).cpu().numpy())
    assert err.within(DTYPE_NAMES[dtype]), err
    torch.testing.assert_close(y, F.layer_norm(h, (HIDDEN,), w, b, 1e-5), **TOL[dtype])
    with torch.inference_mode():
        xi, ri = x.clone(), r.clone()
        out = at.add_layer_norm(xi, ri, w, b, 1e-5, in_place=True)
        torch.cuda.synchronize()
    assert out[0] is xi and out[1] is ri
    assert same_bits(xi, y) and same_bits(ri, h)
    # The strided in-place form (computed aside, copied back) gives the same bits too.
    xs = torch.empty(HIDDEN, 4, device="cuda", dtype=dtype).t()
    rs = torch.empty(HIDDEN, 4, device="cuda", dtype=dtype).t()
    xs.copy_(x)
    rs.copy_(r)
    with torch.no_grad():
        torch.ops.autonorm.fused_add_layer_norm_(xs, rs, w, b, 1e-5)
    assert same_bits(xs.contiguous(), y) and same_bits(rs.contiguous(), h)


@gpu
@pytest.mark.parametrize("form", ["both", "none"])
def test_gpu_offset_rows_are_exact_in_float32(form):
    # h with mean 1000 and spread 0.1: E[h^2] - E[h]^2 in float32 loses everything here.
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (64, 4096)
    x = 990 + 0.07 * torch.randn(shape, device="cuda", dtype=torch.float64, generator=gen)
    r = 10 + 0.07 * torch.randn(shape, device="cuda", dtype=torch.float64, generator=gen)
    x, r = x.float(), r.float()
    w, b = affine(4096, torch.float32, form, device="cuda")
    with torch.no_grad():
        y, h = at.add_layer_norm(x, r, w, b, 1e-5)
        xi, ri = x.clone(), r.clone()
        at.add_layer_norm(xi, ri, w, b, 1e-5, in_place=True)
    assert same_bits(h, rounded_sum(x, r))
    assert_rel(y, formula(h, w, b, 1e-5), 1e-6, "offset rows")
    assert same_bits(xi, y) and same_bits(ri, h)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_gradients_match_torch_autograd(dtype):
    x, r, w, b = cuda_operands(dtype)
    grad_y, grad_h = (torch.randn_like(x, dtype=torch.float32).to(dtype) for _ in range(2))
    xa, ra, wa, ba = (t.clone().requires_grad_() for t in (x, r, w, b))
    ha = xa + ra
    ya = F.layer_norm(ha, (HIDDEN,), wa, ba, 1e-5)
    torch.autograd.backward((ya, ha), (grad_y, grad_h))
    xb, rb, wb, bb = (t.clone().requires_grad_() for t in (x, r, w, b))
    yb, hb = at.add_layer_norm(xb, rb, wb, bb, 1e-5)
    torch.testing.assert_close(yb, ya, **TOL[dtype])
    assert same_bits(hb, ha.detach())
    torch.autograd.backward((yb, hb), (grad_y, grad_h))
    for got, want, what in ((xb, xa, "x"), (rb, ra, "residual"), (wb, wa, "weight"),
                            (bb, ba, "bias")):
        assert got.grad.dtype == dtype
        assert_rel(got.grad, want.grad, GRAD_TOL[dtype], f"grad {what}")


@gpu
def test_gpu_compiled_block_has_no_graph_break_and_matches_torch():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Block(256, 8, AddLayerNorm).cuda()
    randomize(model)
    ref = Block(256, 8, TorchAddLayerNorm).cuda()
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
def test_gpu_compiled_in_place_op_is_bit_identical_to_eager():
    torch._dynamo.reset()
    x, r, w, b = cuda_operands(torch.bfloat16, seed=2)

    def step(x, residual):
        return at.add_layer_norm(x, residual, w, b, 1e-5, in_place=True)

    with torch.inference_mode():
        want_y, want_h = at.add_layer_norm(x, r, w, b, 1e-5)
    compiled = torch.compile(step, fullgraph=True)
    with torch.no_grad():
        xc, rc = x.clone(), r.clone()
        compiled(xc, rc)
    assert same_bits(xc, want_y) and same_bits(rc, want_h)


@gpu
def test_gpu_cuda_graph_capture_and_replay_of_the_in_place_op():
    torch.manual_seed(0)
    dtype = torch.bfloat16
    model = Block(256, 8, lambda d: AddLayerNorm(d, in_place=True)).to("cuda", dtype)
    randomize(model)
    ref = Block(256, 8, TorchAddLayerNorm).to("cuda", dtype)
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
def test_gpu_cuda_graph_replay_of_the_functional_op_gives_the_eager_bits():
    x, r, w, b = cuda_operands(torch.float32, seed=3)
    static_x, static_r = x.clone(), r.clone()
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            at.add_layer_norm(static_x, static_r, w, b)  # warm-up: compiled and cached
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y, static_h = at.add_layer_norm(static_x, static_r, w, b)
        new_x, new_r, _, _ = cuda_operands(torch.float32, seed=4)
        static_x.copy_(new_x)
        static_r.copy_(new_r)
        graph.replay()
        torch.cuda.synchronize()
        want_y, want_h = at.add_layer_norm(new_x, new_r, w, b)
    assert same_bits(static_y, want_y) and same_bits(static_h, want_h)


@gpu
def test_gpu_in_place_bumps_versions_after_the_kernel_writes():
    a = torch.randn(4, HIDDEN, device="cuda", requires_grad=True)
    x = a * 1
    s = x.sin()  # saves x for its backward
    r = torch.randn(4, HIDDEN, device="cuda")
    versions = (x._version, r._version)
    with torch.no_grad():
        at.add_layer_norm(x, r, in_place=True)
    assert x._version > versions[0] and r._version > versions[1]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s.sum().backward()


@gpu
def test_gpu_autocast_runs_in_float32_like_torch():
    torch.manual_seed(0)
    proj = nn.Linear(256, 256).cuda()
    ours = AddLayerNorm(256).cuda()
    randomize(ours)
    ref = TorchAddLayerNorm(256).cuda()
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
