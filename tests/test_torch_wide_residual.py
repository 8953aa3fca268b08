"""A float32 residual stream beside 16-bit x in autonorm.torch's fused adds (``residual_dtype``).

``add_rms_norm`` and ``add_layer_norm`` with a float32 residual (or ``residual_dtype`` float32)
return h as the float32 sum ``x.float() + residual``, unrounded to 16 bits, and y as the norm of
that h in x's dtype. CPU tensors take the reference path; the CUDA launch path is tested on the
CPU through a fake dispatcher whose kernel computes on the host memory behind its pointers. Tests
marked ``gpu`` need a CUDA GPU, torch with CUDA and CuPy, and skip themselves otherwise.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_torch import GRAD_TOL, assert_rel, gpu  # noqa: E402  (the torch tests' helpers)
from test_torch_add_rms import HostKernel, host_dispatch, same_bits  # noqa: E402

import autonorm  # noqa: E402
import autonorm.torch as at  # noqa: E402
from autonorm.errors import InputError, UnsupportedDtypeError  # noqa: E402
from autonorm.numerics import measure_error  # noqa: E402
from autonorm.torch import forward, residual_forward  # noqa: E402
from autonorm.torch.checks import DTYPE_NAMES  # noqa: E402

NORMS = ["rms", "layer"]
NARROW = [torch.bfloat16, torch.float16]


def operands(shape, dtype=torch.bfloat16, seed=0, device="cpu"):
    """16-bit x and a float32 residual over many binades: their float32 sums rarely fit 16 bits.

    The binades stay within 2^-6..2^6 of each other, so every float64 sum is exact and its one
    rounding to float32 is the correctly rounded sum.
    """
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-6, 7, shape, generator=gen).float())
    x = (torch.randn(shape, generator=gen) * scale).to(dtype)
    r = torch.randn(shape, generator=gen) * scale.flip(-1)
    return x.to(device), r.to(device)


def params(norm, hidden, dtype=torch.bfloat16, seed=1, device="cpu"):
    """The norm's weight (and LayerNorm's bias), far from the identity so a dropped one shows."""
    gen = torch.Generator().manual_seed(seed)
    w = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(dtype).to(device)
    if norm == "rms":
        return {"weight": w}
    return {"weight": w, "bias": (0.5 * torch.randn(hidden, generator=gen)).to(dtype).to(device)}


def eps_of(norm):
    return 1e-6 if norm == "rms" else 1e-5


def call(norm, x, r, **kwargs):
    fn = at.add_rms_norm if norm == "rms" else at.add_layer_norm
    return fn(x, r, **kwargs)


def in_place_op(norm):
    return (torch.ops.autonorm.fused_add_rms_norm_ if norm == "rms"
            else torch.ops.autonorm.fused_add_layer_norm_)


def op_args(norm, x, r, p, eps):
    """The ops' positional arguments after (x, residual)."""
    if norm == "rms":
        return (p.get("weight"), eps, False)
    return (p.get("weight"), p.get("bias"), eps)


def float32_sum(x, r):
    """The float64 sum rounded once to float32 (exact before the rounding, see operands)."""
    return (x.double() + r.double()).float()


def formula(norm, h, weight, bias, eps):
    """The norm of h in float64, from its definition (two-pass variance for LayerNorm)."""
    hd = h.double()
    if norm == "rms":
        y = hd * torch.rsqrt(hd.square().mean(-1, keepdim=True) + eps)
    else:
        hc = hd - hd.mean(-1, keepdim=True)
        y = hc / torch.sqrt(hc.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def assert_wide(norm, y, h, x, r, p, eps):
    """h is the float32 sum bit for bit; y the float64 norm of it within x's dtype's tolerance."""
    assert y.dtype == x.dtype and h.dtype == torch.float32
    assert y.shape == h.shape == x.shape and y.is_contiguous() and h.is_contiguous()
    want_h = float32_sum(x.cpu(), r.cpu())
    assert same_bits(h.cpu(), want_h)
    ref = formula(norm, want_h, p.get("weight"), p.get("bias"), eps)
    err = measure_error(y.cpu().double().numpy(), ref.cpu().numpy())
    assert err.within(DTYPE_NAMES[x.dtype]), err


# --------------------------------------------------------------------------------------------
# CPU values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("shape", [(40,), (3, 17), (2, 3, 1001)])
def test_cpu_h_is_the_float32_sum_and_y_the_norm_of_it(norm, dtype, shape):
    x, r = operands(shape, dtype)
    p = params(norm, shape[-1], dtype)
    eps = eps_of(norm)
    before = (x.clone(), r.clone())
    y, h = call(norm, x, r, eps=eps, **p)
    assert_wide(norm, y, h, x, r, p, eps)
    assert same_bits(x, before[0]) and same_bits(r, before[1])
    # y is the norm in float32 of exactly this h, rounded once to x's dtype.
    assert same_bits(y, float32_norm(norm, h, p, eps, dtype))


def float32_norm(norm, h, p, eps, dtype):
    """The norm of a float32 h in float32 (torch's functional), rounded once to ``dtype``."""
    w = p["weight"].float()
    if norm == "rms":
        y = torch.nn.functional.rms_norm(h, (h.shape[-1],), w, eps)
    else:
        y = torch.nn.functional.layer_norm(h, (h.shape[-1],), w, p["bias"].float(), eps)
    return y.to(dtype)


@pytest.mark.parametrize("norm", NORMS)
def test_cpu_a_wrong_h_would_fail_these_checks(norm):
    """The checks tell the float32 h from one rounded to bfloat16, and y from its norm."""
    x, r = operands((4, 256), torch.bfloat16, seed=2)
    p = params(norm, 256)
    eps = eps_of(norm)
    y, h = call(norm, x, r, eps=eps, **p)
    assert same_bits(h, float32_sum(x, r)) and same_bits(y, float32_norm(norm, h, p, eps, y.dtype))
    wrong_h = (x.double() + r.double()).to(torch.bfloat16).float()
    assert not same_bits(h, wrong_h)
    assert (h != wrong_h).float().mean() > 0.5  # most sums need more than 16 bits
    assert not same_bits(y, float32_norm(norm, wrong_h, p, eps, y.dtype))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("residual_dtype", [torch.float32, "float32", "fp32"])
def test_cpu_a_16_bit_residual_asked_for_float32_is_converted_first(norm, residual_dtype):
    x, r = operands((3, 64), torch.bfloat16, seed=3)
    r16 = r.to(torch.bfloat16)
    p = params(norm, 64)
    y, h = call(norm, x, r16, residual_dtype=residual_dtype, **p)
    want_y, want_h = call(norm, x, r16.float(), **p)
    assert r16.dtype == torch.bfloat16  # the caller's residual is not replaced
    assert same_bits(h, want_h) and same_bits(y, want_y)
    narrow_y, narrow_h = call(norm, x, r16, **p)
    assert narrow_h.dtype == torch.bfloat16 and not torch.equal(narrow_h.float(), h)


@pytest.mark.parametrize("norm", NORMS)
def test_cpu_x_dtype_as_residual_dtype_changes_nothing(norm):
    x, r = operands((3, 64), torch.float16, seed=4)
    r16 = r.half()
    p = params(norm, 64, torch.float16)
    want = call(norm, x, r16, **p)
    for rd in (torch.float16, "fp16", "half"):
        got = call(norm, x, r16, residual_dtype=rd, **p)
        assert all(same_bits(g, w) for g, w in zip(got, want, strict=True))
    x32, r32 = x.float(), r
    got = call(norm, x32, r32, residual_dtype=torch.float32, **params(norm, 64, torch.float32))
    assert got[0].dtype == got[1].dtype == torch.float32


@pytest.mark.parametrize("norm", NORMS)
def test_cpu_in_place_writes_y_into_x_and_the_float32_h_into_residual(norm):
    x, r = operands((5, 48), torch.bfloat16, seed=5)
    p = params(norm, 48)
    y, h = call(norm, x, r, **p)
    out = call(norm, x, r, in_place=True, residual_dtype=torch.float32, **p)
    assert out[0] is x and out[1] is r
    assert same_bits(x, y) and same_bits(r, h)
    xo, ro = operands((5, 48), torch.bfloat16, seed=5)
    assert in_place_op(norm)(xo, ro, *op_args(norm, xo, ro, p, eps_of(norm))) is None
    assert same_bits(xo, y) and same_bits(ro, h)
    base_x, base_r = operands((48, 5), torch.bfloat16, seed=5)  # strided views
    xs, rs = base_x.t(), base_r.t()
    ys, hs = call(norm, xs, rs, **p)
    call(norm, xs, rs, in_place=True, **p)
    assert same_bits(xs.contiguous(), ys) and same_bits(rs.contiguous(), hs)


def test_the_public_functions_route_torch_tensors_with_the_keyword():
    x, r = operands((2, 32), torch.bfloat16, seed=6)
    r16 = r.bfloat16()
    for fn, tfn in ((autonorm.add_rms_norm, at.add_rms_norm),
                    (autonorm.add_layer_norm, at.add_layer_norm)):
        y, h = fn(x, r16, residual_dtype=torch.float32)
        want = tfn(x, r16.float(), eps=1e-6 if fn is autonorm.add_rms_norm else 1e-5)
        assert h.dtype == torch.float32 and same_bits(h, want[1]) and same_bits(y, want[0])
        with pytest.raises(InputError, match="^residual_dtype must be None"):
            fn(x, r16, residual_dtype="float64")


def test_the_module_keeps_a_float32_residual_stream():
    norm = at.FusedAddRMSNorm(32, dtype=torch.bfloat16)
    x, r = operands((3, 32), torch.bfloat16, seed=18)
    with torch.no_grad():
        y, h = norm(x, r)
        want = at.add_rms_norm(x, r, norm.weight, 1e-6)
    assert (y.dtype, h.dtype) == (torch.bfloat16, torch.float32)
    assert same_bits(y, want[0]) and same_bits(h, want[1])


def test_cpu_empty_rows_keep_the_dtypes():
    x = torch.empty(0, 16, dtype=torch.bfloat16)
    for norm in NORMS:
        y, h = call(norm, x, torch.empty(0, 16))
        assert y.shape == h.shape == (0, 16)
        assert y.dtype == torch.bfloat16 and h.dtype == torch.float32


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


XB = torch.randn(2, 8).bfloat16()
RF = torch.randn(2, 8)
BAD = [
    ((XB, RF.double(), {}), UnsupportedDtypeError, "residual has dtype torch.float64"),
    ((XB, RF.half(), {}), UnsupportedDtypeError,
     "residual has dtype torch.float16 but x has dtype torch.bfloat16: it must be x's dtype, or "
     "float32 beside a 16-bit x"),
    ((XB.float(), RF.bfloat16(), {}), UnsupportedDtypeError, "residual has dtype"),
    ((XB, RF, {"residual_dtype": torch.float64}), InputError,
     "residual_dtype must be None, x's dtype (bfloat16) or float32, got torch.float64"),
    ((XB, RF, {"residual_dtype": torch.float16}), InputError,
     "residual_dtype must be None, x's dtype (bfloat16) or float32, got torch.float16"),
    ((XB, RF, {"residual_dtype": "int8"}), InputError, "residual_dtype must be None"),
    ((XB, RF, {"residual_dtype": 1}), InputError, "residual_dtype must be None"),
    ((XB, RF, {"residual_dtype": torch.bfloat16}), InputError,
     "residual_dtype bfloat16 is not supported with a float32 residual: h of a float32 "
     "residual is float32"),
    ((XB, RF.double(), {"residual_dtype": torch.float32}), UnsupportedDtypeError,
     "residual has dtype torch.float64"),
    ((XB, [1.0], {"residual_dtype": torch.float32}), InputError, "residual must be a torch"),
]
BAD_IDS = ["residual-float64", "residual-other-16-bit", "residual-wider-than-fp32-x",
           "rd-float64", "rd-other-16-bit", "rd-int8", "rd-int", "rd-narrow-for-wide-residual",
           "rd-with-residual-float64", "rd-with-residual-list"]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("args, error, start", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("mode", ["inference", "autograd", "in-place"])
def test_bad_combinations_are_named_in_one_line(norm, args, error, start, mode):
    x, residual, kwargs = args
    x = x.clone()
    if mode == "autograd":
        x.requires_grad_()
    if isinstance(residual, torch.Tensor):
        residual = residual.clone()
    with pytest.raises(error) as info:
        call(norm, x, residual, in_place=mode == "in-place", **kwargs)
    message = str(info.value)
    assert message.startswith(start) and "\n" not in message, message


@pytest.mark.parametrize("norm", NORMS)
def test_in_place_refuses_a_float32_h_for_a_16_bit_residual(norm):
    x, r = XB.clone(), RF.bfloat16()
    with pytest.raises(InputError) as info:
        call(norm, x, r, in_place=True, residual_dtype=torch.float32)
    message = str(info.value)
    assert message.startswith("residual_dtype float32 needs a float32 residual with "
                              "in_place=True") and "\n" not in message
    assert same_bits(x, XB)  # nothing was written


@pytest.mark.parametrize("norm", NORMS)
def test_the_keyword_is_keyword_only(norm):
    import inspect

    fn = at.add_rms_norm if norm == "rms" else at.add_layer_norm
    param = inspect.signature(fn).parameters["residual_dtype"]
    assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is None


# --------------------------------------------------------------------------------------------
# Tracing: the fakes, opcheck and torch.compile on CPU
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", NORMS)
def test_fake_tensors_give_h_the_residuals_dtype(norm):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 3, 64, dtype=torch.bfloat16).transpose(0, 1)
        r = torch.empty(3, 4, 64)
        p = {k: torch.empty(64, dtype=torch.bfloat16) for k in params(norm, 64)}
        op = torch.ops.autonorm.add_rms_norm if norm == "rms" else torch.ops.autonorm.add_layer_norm
        y, h = op(x, r, *op_args(norm, x, r, p, 1e-5))
        assert y.dtype == torch.bfloat16 and h.dtype == torch.float32
        for t in (y, h):
            assert t.shape == (3, 4, 64) and t.is_contiguous()
        y, h = call(norm, x, r.bfloat16(), residual_dtype=torch.float32, **p)
        assert (y.dtype, h.dtype) == (torch.bfloat16, torch.float32)
        assert in_place_op(norm)(x, r, *op_args(norm, x, r, p, 1e-5)) is None
        with pytest.raises(UnsupportedDtypeError, match="^residual has dtype torch.float16"):
            op(x, r.half(), *op_args(norm, x, r, p, 1e-5))


@pytest.mark.parametrize("norm", NORMS)
def test_opcheck_with_a_float32_residual(norm):
    x, r = operands((3, 5, 32), torch.bfloat16, seed=7)
    p = {k: v.requires_grad_() for k, v in params(norm, 32).items()}
    xg, rg = x.requires_grad_(), r.requires_grad_()
    op = (torch.ops.autonorm.add_rms_norm.default if norm == "rms"
          else torch.ops.autonorm.add_layer_norm.default)
    torch.library.opcheck(op, (xg, rg, *op_args(norm, xg, rg, p, 1e-5)))
    pd = {k: v.detach() for k, v in p.items()}
    xd, rd = x.detach().clone(), r.detach().clone()
    torch.library.opcheck(in_place_op(norm).default, (xd, rd, *op_args(norm, xd, rd, pd, 1e-5)))


def step(norm):
    """A pre-norm step on a float32 residual stream that starts as bfloat16: two fused adds."""

    def fn(x, residual, weight, bias):
        extra = {} if norm == "rms" else {"bias": bias}
        y, h = call(norm, x, residual, weight=weight, residual_dtype=torch.float32, **extra)
        y2, h2 = call(norm, y * 2, h, weight=weight, **extra)
        return y2, h2

    return fn


@pytest.mark.parametrize("norm", NORMS)
def test_compile_cpu_without_graph_breaks_gives_the_eager_values_and_gradients(norm):
    torch._dynamo.reset()
    fn = step(norm)
    x, r = operands((2, 7, 32), torch.bfloat16, seed=8)
    r = r.bfloat16()
    p = params(norm, 32)
    w, b = p["weight"], p.get("bias")
    explanation = torch._dynamo.explain(fn)(x, r, w, b)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    # aot_eager traces forward and backward through the fake and autograd registrations
    # without needing a C++ compiler.
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    grads = []
    for f in (compiled, fn):
        leaves = [t.clone().requires_grad_() for t in (x, r, w)] + (
            [b.clone().requires_grad_()] if b is not None else [None])
        y, h = f(*leaves)
        assert (y.dtype, h.dtype) == (torch.bfloat16, torch.float32)
        (y.float().square().sum() + h.sin().sum()).backward()
        grads.append(([y.detach(), h.detach()], [t.grad for t in leaves if t is not None]))
    (got_out, got_grads), (want_out, want_grads) = grads
    for g, e in zip(got_out + got_grads, want_out + want_grads, strict=True):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert [t.dtype for t in got_grads[:2]] == [torch.bfloat16, torch.bfloat16]


# --------------------------------------------------------------------------------------------
# Gradients on CPU against float64 autograd
# --------------------------------------------------------------------------------------------


def reference_grads(norm, x, r, p, grad_y, grad_h, eps):
    """Gradients of (y, h) by torch's autograd in float64 through h = x + r and the formula."""
    leaves = [t.double().requires_grad_() for t in (x, r)]
    pd = {k: v.double().requires_grad_() for k, v in p.items()}
    h = leaves[0] + leaves[1]
    y = formula(norm, h, pd.get("weight"), pd.get("bias"), eps)
    outs, grads = (y, h), (grad_y.double(), None if grad_h is None else grad_h.double())
    if grad_h is None:
        outs, grads = (y,), (grads[0],)
    torch.autograd.backward(outs, grads)
    return [leaves[0].grad, leaves[1].grad, *(pd[k].grad for k in p)]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("through_h", [True, False], ids=["y-and-h", "y-only"])
def test_cpu_gradients_of_the_wide_case_match_float64(norm, dtype, through_h):
    x, r = operands((2, 5, 64), dtype, seed=9)
    p = params(norm, 64, dtype)
    eps = eps_of(norm)
    gen = torch.Generator().manual_seed(10)
    grad_y = torch.randn(x.shape, generator=gen).to(dtype)
    grad_h = torch.randn(x.shape, generator=gen) if through_h else None
    leaves = [x.clone().requires_grad_(), r.clone().requires_grad_()]
    pl = {k: v.clone().requires_grad_() for k, v in p.items()}
    y, h = call(norm, *leaves, eps=eps, **pl)
    assert "autonorm" in y.grad_fn.name().lower()
    if through_h:
        torch.autograd.backward((y, h), (grad_y, grad_h))
    else:
        y.backward(grad_y)
    got = [leaves[0].grad, leaves[1].grad, *(pl[k].grad for k in p)]
    want = reference_grads(norm, x, r, p, grad_y, grad_h, eps)
    assert [g.dtype for g in got] == [dtype, torch.float32] + [dtype] * len(p)
    tol = GRAD_TOL[dtype]
    assert_rel(got[0], want[0], tol, "grad x")
    assert_rel(got[1], want[1], 1e-5, "grad residual")  # float32, not rounded to 16 bits
    for g, e, name in zip(got[2:], want[2:], p, strict=True):
        assert_rel(g, e, tol, f"grad {name}")
    assert got[0].data_ptr() != got[1].data_ptr()


@pytest.mark.parametrize("norm", NORMS)
def test_cpu_gradient_of_a_converted_residual_is_in_its_own_dtype(norm):
    x, r = operands((4, 64), torch.bfloat16, seed=11)
    r16 = r.bfloat16()
    p = params(norm, 64)
    xa, ra = x.clone().requires_grad_(), r16.clone().requires_grad_()
    y, h = call(norm, xa, ra, residual_dtype=torch.float32, **p)
    (y.float().square().sum() + h.square().sum()).backward()
    xb, rb = x.clone().requires_grad_(), r16.float().requires_grad_()
    y2, h2 = call(norm, xb, rb, **p)
    (y2.float().square().sum() + h2.square().sum()).backward()
    assert ra.grad.dtype == torch.bfloat16 and xa.grad.dtype == torch.bfloat16
    assert torch.equal(ra.grad, rb.grad.bfloat16()) and torch.equal(xa.grad, xb.grad)


# --------------------------------------------------------------------------------------------
# The CUDA launch path, with a fake dispatcher (runs on CPU)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fake_dispatch(monkeypatch):
    """Route the forwards' lookups to :class:`HostKernel`s; yields the kernels made."""
    yield from host_dispatch(monkeypatch, HostKernel)


def cuda_forward(norm, x, r, p, eps, in_place=False):
    if norm == "rms":
        return residual_forward.forward_add_rms_cuda(x, r, p["weight"], eps, False, in_place)
    return residual_forward.forward_add_ln_cuda(x, r, p["weight"], p["bias"], eps, in_place)


@pytest.mark.parametrize("norm", NORMS)
def test_launch_builds_the_wide_problem_and_a_float32_h(fake_dispatch, norm):
    x, r = operands((3, 5, 64), torch.bfloat16, seed=12)
    p = params(norm, 64)
    eps = eps_of(norm)
    y, h = cuda_forward(norm, x, r, p, eps)
    (kernel,) = fake_dispatch
    problem = kernel.problem
    assert problem.residual and problem.residual_dtype == "float32" and problem.wide_residual
    assert problem.dtype == "bfloat16" and problem.h_dtype == "float32"
    ((xp, rp, wp, bp, yp, hp, rows, eps_arg, stream),) = kernel.launches
    assert (xp, rp, yp, hp) == (x.data_ptr(), r.data_ptr(), y.data_ptr(), h.data_ptr())
    assert rows == 15 and eps_arg == eps and stream == 0xABC0
    assert_wide(norm, y, h, x, r, p, eps)
    # The same shape with a bfloat16 residual is another kernel, cached under its own key.
    cuda_forward(norm, x, r.bfloat16(), p, eps)
    assert [k.problem.residual_dtype for k in fake_dispatch] == ["float32", None]
    cache = forward._ADD_RMS_KERNELS if norm == "rms" else forward._ADD_LN_KERNELS
    assert sorted(str(key[-1]) for key in cache) == ["torch.bfloat16", "torch.float32"]


@pytest.mark.parametrize("norm", NORMS)
def test_in_place_launch_writes_the_float32_h_over_the_residual(fake_dispatch, norm):
    x, r = operands((4, 32), torch.float16, seed=13)
    p = params(norm, 32, torch.float16)
    want = cuda_forward(norm, x, r, p, 1e-5)
    xp, rp = x.data_ptr(), r.data_ptr()
    out = cuda_forward(norm, x, r, p, 1e-5, in_place=True)
    assert out[0] is x and out[1] is r
    launch = fake_dispatch[0].launches[-1]
    assert (launch[0], launch[1], launch[4], launch[5]) == (xp, rp, xp, rp)
    assert same_bits(x, want[0]) and same_bits(r, want[1])


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("hidden", [4096, 1000])
def test_gpu_wide_residual_matches_float64_functional_and_in_place(norm, hidden):
    x, r = operands((4, hidden), torch.bfloat16, seed=14, device="cuda")
    p = params(norm, hidden, device="cuda")
    eps = eps_of(norm)
    before = (x.clone(), r.clone())
    with torch.no_grad():
        y, h = call(norm, x, r, eps=eps, **p)
    assert same_bits(x, before[0]) and same_bits(r, before[1])
    assert_wide(norm, y, h, x, r, {k: v.cpu() for k, v in p.items()}, eps)
    with torch.inference_mode():
        xi, ri = x.clone(), r.clone()
        out = call(norm, xi, ri, eps=eps, in_place=True, **p)
        torch.cuda.synchronize()
    assert out[0] is xi and out[1] is ri
    assert same_bits(xi, y) and same_bits(ri, h)
    # A bfloat16 residual asked for float32 gives the bits of its float32 copy.
    r16 = r.bfloat16()
    with torch.no_grad():
        got = call(norm, x, r16, eps=eps, residual_dtype=torch.float32, **p)
        want = call(norm, x, r16.float(), eps=eps, **p)
    assert same_bits(got[0], want[0]) and same_bits(got[1], want[1])


@gpu
@pytest.mark.parametrize("norm", NORMS)
def test_gpu_gradients_of_the_wide_case_match_float64(norm):
    hidden = 1000
    x, r = operands((4, hidden), torch.bfloat16, seed=15)
    p = params(norm, hidden)
    eps = eps_of(norm)
    gen = torch.Generator().manual_seed(16)
    grad_y = torch.randn(x.shape, generator=gen).bfloat16()
    grad_h = torch.randn(x.shape, generator=gen)
    leaves = [x.cuda().requires_grad_(), r.cuda().requires_grad_()]
    pl = {k: v.cuda().requires_grad_() for k, v in p.items()}
    y, h = call(norm, *leaves, eps=eps, **pl)
    torch.autograd.backward((y, h), (grad_y.cuda(), grad_h.cuda()))
    got = [leaves[0].grad, leaves[1].grad, *(pl[k].grad for k in p)]
    want = reference_grads(norm, x, r, p, grad_y, grad_h, eps)
    assert [g.dtype for g in got] == [torch.bfloat16, torch.float32] + [torch.bfloat16] * len(p)
    assert_rel(got[0].cpu(), want[0], GRAD_TOL[torch.bfloat16], "grad x")
    assert_rel(got[1].cpu(), want[1], 1e-5, "grad residual")
    for g, e, name in zip(got[2:], want[2:], p, strict=True):
        assert_rel(g.cpu(), e, GRAD_TOL[torch.bfloat16], f"grad {name}")


@gpu
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("hidden", [4096, 1000])
def test_gpu_compiled_wide_residual_has_no_graph_break_and_matches_float64(norm, hidden):
    torch._dynamo.reset()

    def fn(x, residual, p):
        return call(norm, x, residual, eps=eps_of(norm), **p)

    x, r = operands((4, hidden), torch.bfloat16, seed=17, device="cuda")
    p = params(norm, hidden, device="cuda")
    assert torch._dynamo.explain(fn)(x, r, p).graph_break_count == 0
    compiled = torch.compile(fn, fullgraph=True)
    with torch.no_grad():
        y, h = compiled(x, r, p)
        in_place = torch.compile(
            lambda a, b, q: call(norm, a, b, eps=eps_of(norm), in_place=True, **q),
            fullgraph=True,
        )
        xi, ri = x.clone(), r.clone()
        in_place(xi, ri, p)
    assert_wide(norm, y, h, x, r, {k: v.cpu() for k, v in p.items()}, eps_of(norm))
    assert same_bits(xi, y) and same_bits(ri, h)
    leaves = [x.clone().requires_grad_(), r.clone().requires_grad_()]
    pl = {k: v.clone().requires_grad_() for k, v in p.items()}
    yg, hg = compiled(*leaves, pl)
    (yg.float().square().mean() + hg.square().mean()).backward()
    assert leaves[0].grad.dtype == torch.bfloat16 and leaves[1].grad.dtype == torch.float32
