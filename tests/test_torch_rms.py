"""Tests of autonorm.torch's RMSNorm: rms_norm, the custom op, the RMSNorm module and the swap.

CPU tests run everywhere torch is installed; the CUDA launch path is tested on CPU too, through a
fake dispatcher. Tests marked ``gpu`` need a CUDA GPU, torch with CUDA and CuPy, and skip
themselves otherwise.
"""

from __future__ import annotations

import copy
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
from autonorm.torch import forward  # noqa: E402
from autonorm.torch.checks import DTYPE_NAMES  # noqa: E402
from autonorm.torch.rms_op import DEFAULT_EPS  # noqa: E402


def formula(x, weight, eps, offset=False):
    """RMSNorm in float64 from its definition."""
    xd = x.double()
    y = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (1 + weight.double() if offset else weight.double())
    return y


def randomize_weights(module: nn.Module, seed: int = 0) -> None:
    """Give every norm's weight non-trivial values (init is ones, or zeros for offsets)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            w = getattr(m, "weight", None)
            if "RMSNorm" in type(m).__name__ and w is not None:
                w.copy_(0.5 * torch.randn(w.shape, generator=gen) + (0 if m_offset(m) else 1))


def m_offset(m: nn.Module) -> bool:
    return getattr(m, "weight_offset", False) or type(m).__name__ == "GemmaRMSNorm"


class LlamaRMSNorm(nn.Module):
    """The shape of Hugging Face's Llama RMSNorm: weight and variance_epsilon."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, h):
        dtype = h.dtype
        h = h.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class GemmaRMSNorm(nn.Module):
    """The shape of Hugging Face's Gemma RMSNorm: a zero-initialized weight used as 1 + weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class LlamaBlock(nn.Module):
    """A Llama-style decoder block: RMSNorm, causal attention, RMSNorm, SwiGLU MLP."""

    def __init__(self, d: int, heads: int, norm: type = nn.RMSNorm) -> None:
        super().__init__()
        self.heads = heads
        self.input_layernorm = norm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = norm(d, eps=1e-6)
        self.gate_up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.input_layernorm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.o_proj(a.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.post_attention_layernorm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


# --------------------------------------------------------------------------------------------
# Module construction, state_dict, from_torch, replace_rms_norms
# --------------------------------------------------------------------------------------------


def test_constructor_signature_matches_torch():
    ours = inspect.signature(at.RMSNorm.__init__).parameters
    theirs = inspect.signature(nn.RMSNorm.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    assert [p.default for p in ours.values()][: len(theirs)] == [
        p.default for p in theirs.values()
    ]
    # The one addition is keyword-only, so every torch call means the same here.
    assert list(ours)[len(theirs) :] == ["weight_offset"]
    assert ours["weight_offset"].kind is inspect.Parameter.KEYWORD_ONLY


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((8,), {}),
        ((8,), {"eps": 1e-6}),
        (([2, 3],), {}),
        (((2, 3),), {"elementwise_affine": False}),
        ((8,), {"device": "cpu", "dtype": torch.bfloat16}),
        ((), {"normalized_shape": 8, "eps": 1e-3, "elementwise_affine": True}),
        ((8, 1e-5, True, None, torch.float16), {}),
    ],
)
def test_construction_matches_torch(args, kwargs):
    ours = at.RMSNorm(*args, **kwargs)
    ref = nn.RMSNorm(*args, **kwargs)
    assert isinstance(ours, nn.RMSNorm)
    assert ours.normalized_shape == ref.normalized_shape
    assert ours.eps == ref.eps and ours.elementwise_affine == ref.elementwise_affine
    assert repr(ours) == repr(ref)
    assert (ours.weight is None) == (ref.weight is None)
    if ref.weight is not None:
        assert isinstance(ours.weight, nn.Parameter)
        assert ours.weight.shape == ref.weight.shape and ours.weight.dtype == ref.weight.dtype
        assert torch.equal(ours.weight, ref.weight)  # ones
    assert list(ours.state_dict()) == list(ref.state_dict())


@pytest.mark.parametrize("affine", [True, False])
def test_state_dict_round_trip_both_directions(affine):
    ref = nn.RMSNorm((4, 6), elementwise_affine=affine)
    randomize_weights(ref, seed=1)
    ours = at.RMSNorm((4, 6), elementwise_affine=affine)
    ours.load_state_dict(ref.state_dict(), strict=True)
    back = nn.RMSNorm((4, 6), elementwise_affine=affine)
    back.load_state_dict(ours.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(ref.state_dict()) == list(back.state_dict())
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value)
        assert torch.equal(back.state_dict()[key], value)


def test_offset_form_starts_at_zero_and_resets_there():
    ours = at.RMSNorm(8, weight_offset=True)
    assert torch.equal(ours.weight, torch.zeros(8))
    assert repr(ours) == "RMSNorm((8,), eps=None, elementwise_affine=True, weight_offset=True)"
    randomize_weights(ours)
    ours.reset_parameters()
    assert torch.equal(ours.weight, torch.zeros(8))
    x = torch.randn(3, 8)
    with torch.no_grad():  # 1 + 0: the identity scale
        torch.testing.assert_close(ours(x), F.rms_norm(x, (8,)))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"eps": 0.0}, "eps must be None or > 0"),
        ({"eps": -1e-5}, "eps must be None or > 0"),
        ({"eps": float("nan")}, "eps must be None or > 0"),
        ({"eps": True}, "eps must be None or > 0"),
        ({"weight_offset": 1}, "weight_offset must be True or False"),
        ({"weight_offset": True, "elementwise_affine": False}, "needs elementwise_affine"),
    ],
)
def test_constructor_rejects_bad_arguments_in_one_line(kwargs, match):
    with pytest.raises(InputError, match=match) as info:
        at.RMSNorm(8, **kwargs)
    assert "\n" not in str(info.value)


def test_from_torch_shares_parameters_by_default():
    ref = nn.RMSNorm(8, eps=1e-6).eval()
    ours = at.RMSNorm.from_torch(ref)
    assert type(ours) is at.RMSNorm
    assert ours.weight is ref.weight
    assert ours.eps == 1e-6 and ours.normalized_shape == (8,) and not ours.weight_offset
    assert not ours.training


def test_from_torch_can_copy_parameters():
    ref = nn.RMSNorm((2, 4))
    randomize_weights(ref)
    ref.weight.requires_grad_(False)
    ours = at.RMSNorm.from_torch(ref, share_parameters=False)
    assert ours.weight is not ref.weight
    assert ours.weight.data_ptr() != ref.weight.data_ptr()
    assert torch.equal(ours.weight, ref.weight) and not ours.weight.requires_grad
    assert ours.normalized_shape == (2, 4) and ours.eps is None


def test_from_torch_without_affine():
    ours = at.RMSNorm.from_torch(nn.RMSNorm(8, elementwise_affine=False))
    assert ours.weight is None and not ours.elementwise_affine and ours.normalized_shape == (8,)


def test_from_torch_reads_a_models_own_class():
    llama = LlamaRMSNorm(16, eps=1e-5)
    ours = at.RMSNorm.from_torch(llama, eps="variance_epsilon")
    assert ours.weight is llama.weight and ours.eps == 1e-5 and ours.normalized_shape == (16,)
    gemma = at.RMSNorm.from_torch(GemmaRMSNorm(16), weight_offset=True)
    assert gemma.weight_offset and gemma.eps == 1e-6


@pytest.mark.parametrize(
    "module, kwargs, match",
    [
        (nn.Linear(2, 2), {}, "has no attribute 'eps'"),
        (LlamaRMSNorm(8), {}, "LlamaRMSNorm has no attribute 'eps'"),
        (LlamaRMSNorm(8), {"eps": "variance_epsilon", "weight": "scale"}, "no attribute 'scale'"),
        ("norm", {}, "from_torch expects an RMSNorm module"),
    ],
)
def test_from_torch_names_what_it_cannot_read(module, kwargs, match):
    with pytest.raises(InputError, match=match):
        at.RMSNorm.from_torch(module, **kwargs)


class MyNorm(nn.RMSNorm):
    """A user subclass: its forward may differ, so it must not be replaced."""


class Shared(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.again = norm  # the same module under two names
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.again(self.lin(self.norm(x)))


def test_replace_rms_norms_counts_and_swaps():
    model = nn.Sequential(
        nn.Linear(8, 8),
        nn.RMSNorm(8),
        nn.ModuleList([nn.RMSNorm(8, eps=1e-5), nn.Linear(8, 8)]),
        nn.ModuleDict({"a": nn.RMSNorm(8, elementwise_affine=False), "b": MyNorm(8)}),
        Shared(nn.RMSNorm(8)),
        nn.LayerNorm(8),
    )
    randomize_weights(model)
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        before = model[4](model[1](model[0](x)))
    params_before = {id(p) for p in model.parameters()}

    assert at.replace_rms_norms(model) == 4  # 1 + 1 + non-affine + shared
    assert type(model[1]) is at.RMSNorm
    assert type(model[2][0]) is at.RMSNorm and model[2][0].eps == 1e-5
    assert type(model[3]["a"]) is at.RMSNorm and model[3]["a"].weight is None
    assert type(model[3]["b"]) is MyNorm
    assert type(model[4].norm) is at.RMSNorm and model[4].norm is model[4].again
    assert type(model[5]) is nn.LayerNorm
    # Same Parameter objects: an optimizer built before the swap still trains them.
    assert {id(p) for p in model.parameters()} == params_before
    with torch.no_grad():
        after = model[4](model[1](model[0](x)))
    assert torch.equal(after, before)  # CPU: both are F.rms_norm
    assert at.replace_rms_norms(model) == 0


def test_replace_rms_norms_skips_zero_eps_with_a_warning():
    model = nn.Sequential(nn.RMSNorm(8, eps=0.0), nn.RMSNorm(8))
    with pytest.warns(UserWarning, match="eps"):
        assert at.replace_rms_norms(model) == 1
    assert type(model[0]) is nn.RMSNorm and type(model[1]) is at.RMSNorm


def test_replace_rms_norms_rejects_a_bare_norm():
    with pytest.raises(InputError, match="from_torch"):
        at.replace_rms_norms(nn.RMSNorm(8))
    with pytest.raises(InputError, match="from_torch"):
        at.replace_rms_norms(LlamaRMSNorm(8), {LlamaRMSNorm: {"eps": "variance_epsilon"}})


@pytest.mark.parametrize(
    "classes, match",
    [
        ([LlamaRMSNorm], "^classes must map module classes"),
        ({"LlamaRMSNorm": {}}, "^classes keys must be nn.Module classes"),
        ({LlamaRMSNorm: "variance_epsilon"}, r"^classes\[LlamaRMSNorm\] must be a dict"),
        ({LlamaRMSNorm: {"epsilon": "variance_epsilon"}}, r"unknown keys \['epsilon'\]"),
    ],
)
def test_replace_rms_norms_names_a_malformed_classes_argument(classes, match):
    with pytest.raises(InputError, match=match):
        at.replace_rms_norms(nn.Sequential(LlamaRMSNorm(8)), classes)


def test_replace_rms_norms_swaps_a_models_own_classes():
    torch.manual_seed(0)
    llama = LlamaBlock(32, 4, norm=LlamaRMSNorm).eval()
    gemma = LlamaBlock(32, 4, norm=GemmaRMSNorm).eval()
    randomize_weights(llama)
    randomize_weights(gemma)
    x = torch.randn(2, 7, 32)
    for block, layout in ((llama, {"eps": "variance_epsilon"}), (gemma, {"weight_offset": True})):
        with torch.no_grad():
            want = block(x)
            swapped = copy.deepcopy(block)
            assert at.replace_rms_norms(swapped) == 0  # torch's class only, by default
            assert at.replace_rms_norms(swapped, {type(block.input_layernorm): layout}) == 2
            assert type(swapped.input_layernorm) is at.RMSNorm
            assert swapped.post_attention_layernorm.weight_offset == ("weight_offset" in layout)
            torch.testing.assert_close(swapped(x), want, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# CPU forward and validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["weight", "none"])
@pytest.mark.parametrize("shape", [(16,), (3, 17), (2, 3, 40)])
def test_cpu_forward_equals_functional(dtype, form, shape):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype)
    hidden = shape[-1]
    w = torch.randn(hidden).to(dtype) if form == "weight" else None
    y = at.rms_norm(x, w, eps=1e-4)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    assert torch.equal(y, F.rms_norm(x, (hidden,), w, 1e-4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_offset_form_matches_the_formula(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 24).to(dtype)
    w = (0.3 * torch.randn(24)).to(dtype)
    y = at.rms_norm(x, w, 1e-5, weight_offset=True)
    assert y.dtype == dtype
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert_rel(y, formula(x, w, 1e-5, offset=True), tol, "offset form")


def test_default_eps_is_torchs():
    assert DEFAULT_EPS == torch.finfo(torch.float32).eps
    x = (1e-4 * torch.randn(4, 32)).to(torch.bfloat16)  # mean square ~1e-8: eps shows
    assert torch.equal(at.rms_norm(x), F.rms_norm(x, (32,)))
    assert not torch.equal(at.rms_norm(x), F.rms_norm(x, (32,), eps=torch.finfo(x.dtype).eps))


def test_cpu_module_matches_torch_module_and_several_dims():
    for shape, x in (((8,), torch.randn(3, 8)), ((3, 4), torch.randn(2, 5, 3, 4))):
        ref = nn.RMSNorm(shape, eps=1e-5)
        randomize_weights(ref)
        ours = at.RMSNorm.from_torch(ref)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), rtol=1e-6, atol=1e-6)


def test_cpu_module_rejects_wrong_trailing_shape():
    with pytest.raises(ShapeError, match="trailing"):
        at.RMSNorm(8)(torch.randn(3, 9))
    with pytest.raises(ShapeError):
        at.RMSNorm((2, 4))(torch.randn(4))


def test_empty_rows_return_empty():
    assert at.rms_norm(torch.empty(0, 16)).shape == (0, 16)
    assert at.RMSNorm(16)(torch.empty(2, 0, 16)).shape == (2, 0, 16)


BAD = [
    ((torch.randn(2, 8, dtype=torch.float64), None, 1e-5, False), UnsupportedDtypeError, "x"),
    ((torch.randn(2, 8), torch.ones(7), 1e-5, False), ShapeError, "weight"),
    ((torch.randn(2, 8), torch.ones(2, 8), 1e-5, False), ShapeError, "weight"),
    ((torch.randn(2, 8), torch.ones(8, dtype=torch.float16), 1e-5, False),
     UnsupportedDtypeError, "weight"),
    ((torch.randn(2, 8), torch.ones(8, device="meta"), 1e-5, False), DeviceMismatchError,
     "weight"),
    ((torch.tensor(1.0), None, 1e-5, False), ShapeError, "x"),
    ((torch.randn(2, 8), None, 0.0, False), InputError, "eps"),
    ((torch.randn(2, 8), None, float("nan"), False), InputError, "eps"),
    ((torch.randn(2, 8), None, "1e-5", False), InputError, "eps"),
    ((torch.randn(2, 8), torch.ones(8), 1e-5, 1), InputError, "weight_offset"),
    ((torch.randn(2, 8), torch.ones(8), 1e-5, None), InputError, "weight_offset"),
    ((torch.randn(2, 8), None, 1e-5, True), InputError, "weight_offset"),
    (([[1.0, 2.0]], None, 1e-5, False), InputError, "x"),
]
BAD_IDS = ["float64", "weight-size", "weight-2d", "weight-dtype", "weight-device", "0-d",
           "eps-zero", "eps-nan", "eps-str", "offset-int", "offset-none", "offset-no-weight",
           "not-a-tensor"]


@pytest.mark.parametrize("args, error, name", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "autograd"])
def test_bad_arguments_are_named_in_one_line(args, error, name, grad):
    x, weight, eps, offset = args
    if grad and isinstance(x, torch.Tensor):
        x = x.detach().requires_grad_()
    with pytest.raises(error) as info:
        at.rms_norm(x, weight, eps, offset)
    message = str(info.value)
    assert message.startswith(name) and "\n" not in message, message


def test_integer_eps_is_accepted():
    x = torch.randn(2, 8)
    torch.testing.assert_close(at.rms_norm(x, eps=1), F.rms_norm(x, (8,), eps=1.0))
    xg = x.clone().requires_grad_()
    torch.testing.assert_close(at.rms_norm(xg, eps=1), F.rms_norm(x, (8,), eps=1.0))


# --------------------------------------------------------------------------------------------
# Autograd, the custom op, torch.compile and autocast on CPU
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(40,), (3, 40), (2, 5, 40)])
@pytest.mark.parametrize("form", ["weight", "none"])
def test_cpu_gradients_match_torch(shape, form):
    torch.manual_seed(0)
    x = 1 + 2 * torch.randn(shape)
    w = 1 + 0.5 * torch.randn(shape[-1]) if form == "weight" else None
    grad = torch.randn(shape)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    wa = wb = None
    if w is not None:
        wa, wb = w.clone().requires_grad_(), w.clone().requires_grad_()
    ya, yb = F.rms_norm(xa, (shape[-1],), wa, 1e-5), at.rms_norm(xb, wb, 1e-5)
    assert "autonorm" in yb.grad_fn.name().lower()
    ya.backward(grad)
    yb.backward(grad)
    assert_rel(xb.grad, xa.grad, 1e-5, "grad x")
    if w is not None:
        assert_rel(wb.grad, wa.grad, 1e-5, "grad weight")


def test_cpu_gradients_of_the_offset_form():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 24, dtype=torch.float64)
    w = 0.3 * torch.randn(24, dtype=torch.float64)
    grad = torch.randn(3, 5, 24, dtype=torch.float64)
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    formula(xa, wa, 1e-5, offset=True).backward(grad)
    xb, wb = x.float().requires_grad_(), w.float().requires_grad_()
    at.rms_norm(xb, wb, 1e-5, weight_offset=True).backward(grad.float())
    assert_rel(xb.grad, xa.grad, 1e-5, "grad x")
    assert_rel(wb.grad, wa.grad, 1e-5, "grad weight")


def test_cpu_gradients_with_a_frozen_weight_and_bfloat16():
    torch.manual_seed(0)
    x = torch.randn(8, 64).to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(64)).to(torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    F.rms_norm(xa, (64,), w, 1e-6).float().square().sum().backward()
    at.rms_norm(xb, w, 1e-6).float().square().sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and w.grad is None
    assert_rel(xb.grad, xa.grad, 3e-2, "grad x")


def test_the_op_is_registered_with_its_schema():
    op = torch.ops.autonorm.rms_norm.default
    assert str(op._schema) == (
        "autonorm::rms_norm(Tensor x, Tensor? weight, float eps, bool weight_offset) -> Tensor"
    )


@pytest.mark.parametrize("form", ["weight", "offset", "none"])
def test_opcheck(form):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32, requires_grad=True)
    w = None if form == "none" else torch.randn(32, requires_grad=True)
    op = torch.ops.autonorm.rms_norm.default
    torch.library.opcheck(op, (x, w, 1e-5, form == "offset"))
    torch.library.opcheck(op, (x.detach()[0, 0], w, 1e-3, form == "offset"))


def test_fake_tensors_get_shape_dtype_and_trace_time_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 3, 64, dtype=torch.bfloat16).transpose(0, 1)
        w = torch.empty(64, dtype=torch.bfloat16)
        y = torch.ops.autonorm.rms_norm(x, w, 1e-6, True)
        assert y.shape == (3, 4, 64) and y.dtype == torch.bfloat16 and y.is_contiguous()
        y = at.rms_norm(x, w)  # a FakeTensor goes through the op, not the launch path
        assert y.shape == (3, 4, 64) and y.dtype == torch.bfloat16
        with pytest.raises(ShapeError, match="^weight"):
            torch.ops.autonorm.rms_norm(x, torch.empty(63, dtype=torch.bfloat16), 1e-6, False)
        with pytest.raises(InputError, match="^weight_offset=True"):
            torch.ops.autonorm.rms_norm(x, None, 1e-6, True)


def test_compile_forward_and_backward_cpu_without_graph_breaks():
    # aot_eager traces forward and backward through the fake and autograd registrations
    # without needing a C++ compiler.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), at.RMSNorm(32), nn.GELU(),
                          at.RMSNorm(32, eps=1e-5, weight_offset=True))
    randomize_weights(model)
    x = torch.randn(4, 32)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    model.zero_grad()
    model(x).square().sum().backward()
    eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled(x).square().sum().backward()
    for got, want in zip([p.grad for p in model.parameters()], eager, strict=True):
        torch.testing.assert_close(got, want)


def test_cpu_autocast_keeps_torch_dtypes():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(32, 32), nn.RMSNorm(32))
    randomize_weights(ref)
    ours = copy.deepcopy(ref)
    assert at.replace_rms_norms(ours) == 1
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        want, got = ref(x), ours(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------------------------
# The CUDA launch path, with a fake dispatcher (runs on CPU)
# --------------------------------------------------------------------------------------------


class FakeKernel:
    def __init__(self, problem, rows, device_id) -> None:
        self.problem, self.rows, self.device_id = problem, rows, device_id
        self.launches: list[tuple] = []

    def launch(self, args, stream_ptr) -> None:
        self.launches.append((*args, stream_ptr))  # x, weight, bias, y, rows, eps; stream


@pytest.fixture
def fake_dispatch(monkeypatch):
    """Route the forwards' lookups to a fake dispatcher; CPU tensors stand in for CUDA ones."""
    made: list[FakeKernel] = []

    def get_kernel(problem, rows, device_id):
        kernel = FakeKernel(problem, rows, device_id)
        made.append(kernel)
        return kernel

    module = types.ModuleType("autonorm.dispatch")
    module.get_kernel = get_kernel
    monkeypatch.setitem(sys.modules, "autonorm.dispatch", module)
    monkeypatch.setattr(forward, "_KERNELS", {})
    monkeypatch.setattr(forward, "_RMS_KERNELS", {})
    monkeypatch.setattr(forward, "_current_device", lambda: -1)  # a CPU tensor's get_device()
    monkeypatch.setattr(forward, "_raw_stream", lambda device_id: 0xABC0)
    return made


def test_launch_arguments(fake_dispatch):
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    y = forward.forward_rms_cuda(x, w, 1e-6, True)
    (kernel,) = fake_dispatch
    assert kernel.problem.op == "rms_norm"
    assert kernel.problem.hidden == 64 and kernel.problem.dtype == "bfloat16"
    assert kernel.problem.has_weight and kernel.problem.weight_offset
    assert kernel.rows == 15 and kernel.device_id == -1
    ((x_ptr, w_ptr, b_ptr, y_ptr, rows, eps, stream),) = kernel.launches
    assert (x_ptr, w_ptr, b_ptr, y_ptr) == (x.data_ptr(), w.data_ptr(), 0, y.data_ptr())
    assert rows == 15 and eps == 1e-6 and type(eps) is float and stream == 0xABC0
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()


def test_kernel_cache_per_weight_form_and_rows_bucket(fake_dispatch):
    w = torch.ones(32)
    for rows in (3, 4, 4, 3):  # one bucket (4)
        forward.forward_rms_cuda(torch.randn(rows, 32), w, 1e-5, False)
    assert len(fake_dispatch) == 1 and len(fake_dispatch[0].launches) == 4
    forward.forward_rms_cuda(torch.randn(5, 32), w, 1e-5, False)  # bucket 8
    forward.forward_rms_cuda(torch.randn(5, 32), w, 1e-5, True)  # the offset form
    forward.forward_rms_cuda(torch.randn(5, 32), None, 1e-5, False)  # no weight
    assert [(k.problem.has_weight, k.problem.weight_offset) for k in fake_dispatch] == [
        (True, False), (True, False), (True, True), (False, False)
    ]
    # LayerNorm's kernels are another family's: same shape, its own cache entry.
    forward.forward_cuda(torch.randn(5, 32), w, None, 1e-5)
    assert fake_dispatch[-1].problem.op == "layer_norm"
    assert len(forward._RMS_KERNELS) == 4 and len(forward._KERNELS) == 1
    at.clear_kernel_cache()
    assert not forward._RMS_KERNELS and not forward._KERNELS


def test_misaligned_and_strided_inputs_are_copied(fake_dispatch):
    x = torch.randn(4 * 64 + 1)[1:].view(4, 64)  # 4-byte offset: not 16-byte aligned
    w = torch.randn(2 * 64)[::2]  # strided weight
    forward.forward_rms_cuda(x, w, 1e-5, False)
    x_ptr, w_ptr = fake_dispatch[0].launches[0][:2]
    assert x_ptr % 16 == 0 and x_ptr != x.data_ptr()
    assert w_ptr % 16 == 0 and w_ptr != w.data_ptr()


def test_launch_path_validates_and_skips_empty_rows(fake_dispatch):
    assert forward.forward_rms_cuda(torch.empty(0, 64), None, 1e-5, False).shape == (0, 64)
    with pytest.raises(ShapeError):
        forward.forward_rms_cuda(torch.randn(2, 8), torch.ones(9), 1e-5, False)
    with pytest.raises(InputError, match="^weight_offset=True"):
        forward.forward_rms_cuda(torch.randn(2, 8), None, 1e-5, True)
    with pytest.raises(InputError, match="^weight_offset must be"):
        forward.forward_rms_cuda(torch.randn(2, 8), torch.ones(8), 1e-5, 1)
    assert not fake_dispatch
    forward.forward_rms_cuda(torch.randn(2, 8), None, 1, False)  # an int eps is fine
    assert fake_dispatch[0].launches[0][5] == 1.0


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------

# Each distinct (dtype, hidden, weight form, rows bucket) compiles a kernel: the tests share a few
# shapes, (4, 1001) above all, so that they share kernels too.
HIDDEN = 1001


def cuda_weight(hidden, dtype, offset=False, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    base = 0.0 if offset else 1.0
    return (base + 0.5 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, HIDDEN), (64, 4096)])
def test_gpu_matches_torch(dtype, shape):
    torch.manual_seed(0)
    x = (0.5 + torch.randn(shape, device="cuda")).to(dtype)
    w = cuda_weight(shape[-1], dtype)
    before = x.clone()
    with torch.no_grad():
        y = at.rms_norm(x, w, 1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, F.rms_norm(x, (shape[-1],), w, 1e-6), **TOL[dtype])
    assert torch.equal(x, before)  # the input is never written


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["none", "offset"])
def test_gpu_weight_forms_match_the_float64_formula(dtype, form):
    torch.manual_seed(0)
    x = torch.randn(2, 2, HIDDEN, device="cuda").to(dtype)
    w = cuda_weight(HIDDEN, dtype, offset=True) if form == "offset" else None
    with torch.no_grad():
        y = at.rms_norm(x, w, 1e-5, weight_offset=form == "offset")
    ref = formula(x, w, 1e-5, offset=form == "offset")
    err = measure_error(y.double().cpu().numpy(), ref.cpu().numpy())
    assert err.within(DTYPE_NAMES[dtype]), err
    if form == "none":
        torch.testing.assert_close(y, F.rms_norm(x, (HIDDEN,), None, 1e-5), **TOL[dtype])


@gpu
def test_gpu_misaligned_noncontiguous_and_multidim():
    torch.manual_seed(0)
    dtype = torch.float16
    w = cuda_weight(HIDDEN, dtype)
    x = torch.randn(4 * HIDDEN + 1, device="cuda").to(dtype)[1:].view(4, HIDDEN)
    assert x.data_ptr() % 16
    before = x.clone()
    with torch.no_grad():
        y = at.rms_norm(x, w)
        torch.testing.assert_close(y, F.rms_norm(x, (HIDDEN,), w), **TOL[dtype])
        assert torch.equal(x, before)
        xt = torch.randn(HIDDEN, 4, device="cuda").to(dtype).t()
        y = at.rms_norm(xt, w)
        torch.testing.assert_close(y, F.rms_norm(xt, (HIDDEN,), w), **TOL[dtype])
        ref = nn.RMSNorm((7, 143), device="cuda", dtype=dtype)  # 7 * 143 = HIDDEN
        randomize_weights(ref)
        x4 = torch.randn(4, 7, 143, device="cuda").to(dtype)
        torch.testing.assert_close(at.RMSNorm.from_torch(ref)(x4), ref(x4), **TOL[dtype])


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["weight", "none"])
def test_gpu_gradients_match_torch(dtype, form):
    torch.manual_seed(0)
    x = (1 + torch.randn(2, 2, HIDDEN, device="cuda")).to(dtype)
    grad = torch.randn(2, 2, HIDDEN, device="cuda").to(dtype)
    w = cuda_weight(HIDDEN, dtype) if form == "weight" else None
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    wa = wb = None
    if w is not None:
        wa, wb = w.clone().requires_grad_(), w.clone().requires_grad_()
    ya, yb = F.rms_norm(xa, (HIDDEN,), wa, 1e-6), at.rms_norm(xb, wb, 1e-6)
    torch.testing.assert_close(yb, ya, **TOL[dtype])
    ya.backward(grad)
    yb.backward(grad)
    assert xb.grad.dtype == dtype
    assert_rel(xb.grad, xa.grad, GRAD_TOL[dtype], "grad x")
    if w is not None:
        assert wb.grad.dtype == dtype
        assert_rel(wb.grad, wa.grad, GRAD_TOL[dtype], "grad weight")


@gpu
def test_gpu_gradients_of_the_offset_form():
    torch.manual_seed(0)
    x = torch.randn(4, HIDDEN, device="cuda", dtype=torch.float64)
    w = 0.3 * torch.randn(HIDDEN, device="cuda", dtype=torch.float64)
    grad = torch.randn(4, HIDDEN, device="cuda", dtype=torch.float64)
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    formula(xa, wa, 1e-6, offset=True).backward(grad)
    xb, wb = x.float().requires_grad_(), w.float().requires_grad_()
    y = at.rms_norm(xb, wb, 1e-6, weight_offset=True)
    assert_rel(y, formula(x, w, 1e-6, offset=True), 1e-6, "forward")
    y.backward(grad.float())
    assert_rel(xb.grad, xa.grad, 1e-5, "grad x")
    assert_rel(wb.grad, wa.grad, 1e-5, "grad weight")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_llama_block_with_swapped_norms(dtype):
    torch.manual_seed(0)
    block = LlamaBlock(256, 8).to("cuda", dtype).eval()
    randomize_weights(block)
    swapped = copy.deepcopy(block)
    assert at.replace_rms_norms(swapped) == 2
    own = LlamaBlock(256, 8, norm=LlamaRMSNorm).to("cuda", dtype).eval()
    own.load_state_dict(block.state_dict())
    assert at.replace_rms_norms(own, {LlamaRMSNorm: {"eps": "variance_epsilon"}}) == 2
    x = torch.randn(2, 32, 256, device="cuda").to(dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    with torch.no_grad():
        want = block(x)
        assert_rel(swapped(x), want, tol, "block")
        assert_rel(own(x), want, tol, "block with a model's own class")


@gpu
def test_gpu_compiled_llama_block_has_no_graph_break_and_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = LlamaBlock(256, 8).cuda()
    randomize_weights(ref)
    model = copy.deepcopy(ref)
    at.replace_rms_norms(model)
    x = torch.randn(2, 32, 256, device="cuda")
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        assert_rel(compiled(x), ref(x), 1e-4, "compiled forward")
    # Training through the compiled graph: the registered backward runs under inductor.
    ref(x).square().mean().backward()
    compiled(x).square().mean().backward()
    for got, want in zip(model.parameters(), ref.parameters(), strict=True):
        assert_rel(got.grad, want.grad, 1e-3, "compiled gradient")


@gpu
def test_gpu_cuda_graph_capture_and_replay():
    torch.manual_seed(0)
    dtype = torch.bfloat16
    ref = LlamaBlock(256, 8).to("cuda", dtype).eval()
    randomize_weights(ref)
    model = copy.deepcopy(ref)
    at.replace_rms_norms(model)
    static_x = torch.randn(2, 32, 256, device="cuda").to(dtype)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up: the kernels are compiled and cached before capture
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = model(static_x)
        for _ in range(2):
            new = torch.randn(2, 32, 256, device="cuda").to(dtype)
            static_x.copy_(new)
            static_y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert_rel(static_y, ref(new), 3e-2, "replayed block")


@gpu
def test_gpu_autocast_matches_torch():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(256, 256), nn.RMSNorm(256)).cuda()
    randomize_weights(ref)
    ours = copy.deepcopy(ref)
    at.replace_rms_norms(ours)
    x = torch.randn(64, 256, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        want, got = ref(x), ours(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, **TOL[want.dtype])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert ours(x).dtype == want.dtype  # the autograd path: the op's registered rule
