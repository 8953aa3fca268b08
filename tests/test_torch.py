"""Tests of autonorm.torch: the functional API, the LayerNorm module, torch.compile, autograd.

CPU tests run everywhere torch is installed; the CUDA path is tested on CPU too, through a fake
dispatcher (launch arguments, caching, alignment). Tests marked ``gpu`` need a CUDA GPU, torch
with CUDA and CuPy, and skip themselves otherwise.
"""

from __future__ import annotations

import copy
import inspect
import math
import os
import subprocess
import sys
import textwrap
import time
import types
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from torch import nn  # noqa: E402

import autonorm.torch as at  # noqa: E402
from autonorm.errors import (  # noqa: E402
    AutonormError,
    DeviceMismatchError,
    InputError,
    ShapeError,
    UnsupportedDtypeError,
)
from autonorm.torch import forward  # noqa: E402

REPO_ROOT = Path(at.__file__).resolve().parents[2]  # autonorm/torch/__init__.py
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _gpu_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, or a CuPy that cannot see the GPU
        return False


HAS_GPU = _gpu_ready()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU, CUDA torch and CuPy")


def gpu(fn):
    """Mark a test as a GPU test that skips itself without one."""
    return pytest.mark.gpu(needs_gpu(fn))


def assert_rel(actual, expected, tol: float, what: str = "") -> None:
    """Assert max|actual - expected| / max|expected| <= tol (normwise: robust near zeros)."""
    a, e = actual.double(), expected.double()
    err = (a - e).abs().max().item() / max(e.abs().max().item(), 1e-30)
    assert err <= tol, f"{what} relative error {err:.3g} > {tol:.3g}"


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP, two LayerNorms."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def randomize_affine(module: nn.Module, seed: int = 0) -> None:
    """Give every LayerNorm non-trivial weights and biases (init is ones/zeros)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=gen))
                if m.bias is not None:
                    m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=gen))


# --------------------------------------------------------------------------------------------
# Import without torch
# --------------------------------------------------------------------------------------------

NO_TORCH = textwrap.dedent(
    """
    import importlib.abc, sys
    attempts = []

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                attempts.append(name)
                raise ImportError(f"torch is blocked by this test ({name})")
            return None

    sys.meta_path.insert(0, NoTorch())
    import autonorm, autonorm.errors, autonorm.ops.layer_norm, autonorm.settings
    import autonorm.runtime.device, autonorm.api, autonorm.dispatch
    assert "torch" not in sys.modules, "torch was imported"
    assert not attempts, f"import autonorm tried to import {attempts}"
    try:
        import autonorm.torch
    except ImportError as exc:
        assert "autonorm[torch]" in str(exc), f"unhelpful message: {exc}"
    else:
        raise AssertionError("autonorm.torch imported without torch")
    print("ok")
    """
)


def test_import_autonorm_without_torch():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


# --------------------------------------------------------------------------------------------
# Module construction, state_dict, from_torch, replace_layer_norms
# --------------------------------------------------------------------------------------------


def test_constructor_signature_matches_torch():
    ours = inspect.signature(at.LayerNorm.__init__).parameters
    theirs = inspect.signature(nn.LayerNorm.__init__).parameters
    assert list(ours) == list(theirs)
    assert [p.default for p in ours.values()] == [p.default for p in theirs.values()]


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((8,), {}),
        ((8,), {"eps": 1e-6}),
        (([2, 3],), {}),
        (((2, 3),), {"elementwise_affine": False}),
        ((8,), {"bias": False}),
        ((8,), {"elementwise_affine": False, "bias": False}),
        ((8,), {"device": "cpu", "dtype": torch.bfloat16}),
        ((), {"normalized_shape": 8, "eps": 1e-3, "elementwise_affine": True, "bias": True}),
        ((8, 1e-5, True, True, None, torch.float16), {}),
    ],
)
def test_construction_matches_torch(args, kwargs):
    ours = at.LayerNorm(*args, **kwargs)
    ref = nn.LayerNorm(*args, **kwargs)
    assert isinstance(ours, nn.LayerNorm)
    assert ours.normalized_shape == ref.normalized_shape
    assert ours.eps == ref.eps
    assert ours.elementwise_affine == ref.elementwise_affine
    assert ours.extra_repr() == ref.extra_repr()
    assert repr(ours) == repr(ref)
    for name in ("weight", "bias"):
        a, b = getattr(ours, name), getattr(ref, name)
        assert (a is None) == (b is None)
        if a is not None:
            assert isinstance(a, nn.Parameter)
            assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
            assert torch.equal(a, b)  # ones / zeros
    assert list(ours.state_dict()) == list(ref.state_dict())


def test_construction_on_meta_device():
    ours = at.LayerNorm(16, device="meta")
    assert ours.weight.device.type == "meta"


def test_reset_parameters_restores_ones_and_zeros():
    ours = at.LayerNorm(8)
    randomize_affine(ours)
    ours.reset_parameters()
    assert torch.equal(ours.weight, torch.ones(8))
    assert torch.equal(ours.bias, torch.zeros(8))


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan")])
def test_constructor_rejects_non_positive_eps(eps):
    with pytest.raises(InputError, match="eps"):
        at.LayerNorm(8, eps=eps)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"bias": False}, {"elementwise_affine": False}],
    ids=["affine", "no-bias", "none"],
)
def test_state_dict_round_trip_both_directions(kwargs):
    ref = nn.LayerNorm((4, 6), **kwargs)
    randomize_affine(ref, seed=1)
    ours = at.LayerNorm((4, 6), **kwargs)
    ours.load_state_dict(ref.state_dict(), strict=True)
    back = nn.LayerNorm((4, 6), **kwargs)
    back.load_state_dict(ours.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(ref.state_dict()) == list(back.state_dict())
    for key, value in ref.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value)
        assert torch.equal(back.state_dict()[key], value)


def test_from_torch_shares_parameters_by_default():
    ref = nn.LayerNorm(8, eps=1e-6).eval()
    ours = at.LayerNorm.from_torch(ref)
    assert type(ours) is at.LayerNorm
    assert ours.weight is ref.weight and ours.bias is ref.bias
    assert ours.eps == 1e-6 and ours.normalized_shape == (8,)
    assert not ours.training


def test_from_torch_can_copy_parameters():
    ref = nn.LayerNorm((2, 4), bias=False)
    randomize_affine(ref)
    ref.weight.requires_grad_(False)
    ours = at.LayerNorm.from_torch(ref, share_parameters=False)
    assert ours.weight is not ref.weight
    assert ours.weight.data_ptr() != ref.weight.data_ptr()
    assert torch.equal(ours.weight, ref.weight)
    assert not ours.weight.requires_grad
    assert ours.bias is None
    assert ours.weight.device == ref.weight.device


def test_from_torch_without_affine():
    ours = at.LayerNorm.from_torch(nn.LayerNorm(8, elementwise_affine=False))
    assert ours.weight is None and ours.bias is None and not ours.elementwise_affine


def test_from_torch_rejects_other_modules():
    with pytest.raises(InputError):
        at.LayerNorm.from_torch(nn.Linear(2, 2))


class WithAttribute(nn.Module):
    def __init__(self, shared: nn.LayerNorm) -> None:
        super().__init__()
        self.norm = shared
        self.again = shared  # the same module under two names
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.again(self.lin(self.norm(x)))


class MyNorm(nn.LayerNorm):
    """A user subclass: its forward may differ, so it must not be replaced."""


def test_replace_layer_norms_counts_and_swaps():
    shared = nn.LayerNorm(8)
    model = nn.Sequential(
        nn.Linear(8, 8),
        nn.LayerNorm(8),
        nn.ModuleList([nn.LayerNorm(8), nn.Linear(8, 8)]),
        nn.ModuleDict({"a": nn.LayerNorm(8, bias=False), "b": MyNorm(8)}),
        WithAttribute(shared),
        nn.LayerNorm(8, elementwise_affine=False),
    )
    randomize_affine(model)
    x = torch.randn(3, 5, 8)
    before = model[4](model[1](model[0](x)))
    params_before = {id(p) for p in model.parameters()}

    assert at.replace_layer_norms(model) == 5  # 1 + 1 + 1 + shared + non-affine
    assert type(model[1]) is at.LayerNorm
    assert type(model[2][0]) is at.LayerNorm
    assert type(model[3]["a"]) is at.LayerNorm and model[3]["a"].bias is None
    assert type(model[3]["b"]) is MyNorm
    assert type(model[4].norm) is at.LayerNorm and model[4].norm is model[4].again
    assert type(model[5]) is at.LayerNorm and model[5].weight is None
    assert not any(type(m) is nn.LayerNorm for m in model.modules())
    # Same Parameter objects: an optimizer built before the swap still trains them.
    assert {id(p) for p in model.parameters()} == params_before
    after = model[4](model[1](model[0](x)))
    assert torch.equal(after, before)  # CPU: both are F.layer_norm
    assert at.replace_layer_norms(model) == 0


def test_replace_layer_norms_skips_zero_eps_with_a_warning():
    model = nn.Sequential(nn.LayerNorm(8, eps=0.0), nn.LayerNorm(8))
    with pytest.warns(UserWarning, match="eps"):
        assert at.replace_layer_norms(model) == 1
    assert type(model[0]) is nn.LayerNorm and type(model[1]) is at.LayerNorm


def test_replace_layer_norms_rejects_a_bare_layer_norm():
    with pytest.raises(InputError, match="from_torch"):
        at.replace_layer_norms(nn.LayerNorm(8))


def test_replace_layer_norms_in_a_transformer_block_cpu():
    torch.manual_seed(0)
    block = Block(32, 4).eval()
    randomize_affine(block)
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        expected = block(x)
        swapped = copy.deepcopy(block)
        assert at.replace_layer_norms(swapped) == 2
        assert torch.equal(swapped(x), expected)


# --------------------------------------------------------------------------------------------
# CPU forward and validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("shape", [(16,), (3, 16), (2, 3, 40)])
def test_cpu_forward_equals_functional(dtype, affine, shape):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype)
    hidden = shape[-1]
    w = torch.randn(hidden).to(dtype) if affine in ("both", "weight") else None
    b = torch.randn(hidden).to(dtype) if affine in ("both", "bias") else None
    y = at.layer_norm(x, w, b, eps=1e-4)
    assert y.shape == x.shape and y.dtype == dtype
    assert torch.equal(y, F.layer_norm(x, (hidden,), w, b, 1e-4))


def test_cpu_forward_non_contiguous_input():
    x = torch.randn(16, 6).t()  # (6, 16), not contiguous
    y = at.layer_norm(x)
    assert y.is_contiguous()
    assert torch.equal(y, F.layer_norm(x.contiguous(), (16,)))


def test_cpu_module_with_several_normalized_dims():
    ref = nn.LayerNorm((3, 4))
    randomize_affine(ref)
    ours = at.LayerNorm.from_torch(ref)
    x = torch.randn(2, 5, 3, 4)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-6, atol=1e-6)


def test_cpu_module_rejects_wrong_trailing_shape():
    with pytest.raises(ShapeError, match="trailing"):
        at.LayerNorm(8)(torch.randn(3, 9))
    with pytest.raises(ShapeError):
        at.LayerNorm((2, 4))(torch.randn(4))


def test_empty_rows_return_empty():
    y = at.layer_norm(torch.empty(0, 16))
    assert y.shape == (0, 16)
    y = at.LayerNorm(16)(torch.empty(2, 0, 16))
    assert y.shape == (2, 0, 16)


@pytest.mark.parametrize(
    "x, weight, bias, eps, error",
    [
        (torch.randn(2, 8, dtype=torch.float64), None, None, 1e-5, UnsupportedDtypeError),
        (torch.ones(2, 8, dtype=torch.int32), None, None, 1e-5, UnsupportedDtypeError),
        (torch.randn(2, 8), torch.ones(7), None, 1e-5, ShapeError),
        (torch.randn(2, 8), None, torch.ones(9), 1e-5, ShapeError),
        (torch.randn(2, 8), torch.ones(2, 8), None, 1e-5, ShapeError),
        (torch.randn(2, 8), torch.ones(8, dtype=torch.float16), None, 1e-5, UnsupportedDtypeError),
        (torch.randn(2, 8), torch.ones(8, device="meta"), None, 1e-5, DeviceMismatchError),
        (torch.tensor(1.0), None, None, 1e-5, ShapeError),
        (torch.randn(2, 8), None, None, 0.0, InputError),
        (torch.randn(2, 8), None, None, -1.0, InputError),
        (torch.randn(2, 8), None, None, float("nan"), InputError),
        (torch.randn(2, 8), None, None, "1e-5", InputError),
        ([[1.0, 2.0]], None, None, 1e-5, InputError),
    ],
    ids=[
        "float64",
        "int32",
        "weight-size",
        "bias-size",
        "weight-2d",
        "weight-dtype",
        "weight-device",
        "0-d",
        "eps-zero",
        "eps-negative",
        "eps-nan",
        "eps-str",
        "not-a-tensor",
    ],
)
def test_validation_errors(x, weight, bias, eps, error):
    with pytest.raises(error) as info:
        at.layer_norm(x, weight, bias, eps)
    assert isinstance(info.value, AutonormError) and isinstance(info.value, ValueError)
    assert str(info.value)  # names the problem


def test_validation_errors_on_the_autograd_path():
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(InputError, match="eps"):
        at.layer_norm(x, eps=0.0)
    with pytest.raises(ShapeError, match="weight"):
        at.layer_norm(x, torch.ones(7, requires_grad=True))
    with pytest.raises(InputError, match="eps"):
        at.layer_norm(x, eps="1e-5")
    y = at.layer_norm(x, eps=1)  # an int eps is fine here too
    torch.testing.assert_close(y, F.layer_norm(x, (8,), eps=1.0))


def test_integer_eps_is_accepted():
    x = torch.randn(2, 8)
    torch.testing.assert_close(at.layer_norm(x, eps=1), F.layer_norm(x, (8,), eps=1.0))


# --------------------------------------------------------------------------------------------
# Autograd, the custom op, torch.compile and autocast on CPU
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(40,), (3, 40), (2, 5, 40)])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_cpu_gradients_match_torch(shape, affine):
    torch.manual_seed(0)
    kwargs = {"elementwise_affine": affine != "none", "bias": affine == "both"}
    ref = nn.LayerNorm(shape[-1], **kwargs)
    randomize_affine(ref)
    ours = at.LayerNorm.from_torch(ref, share_parameters=False)
    x = 3 + 2 * torch.randn(shape)
    grad = torch.randn(shape)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ref(xa), ours(xb)
    assert yb.grad_fn is not None and "autonorm" in yb.grad_fn.name().lower()
    ya.backward(grad)
    yb.backward(grad)
    assert_rel(xb.grad, xa.grad, 1e-5, "grad x")
    for name in ("weight", "bias"):
        if getattr(ref, name) is not None:
            assert_rel(getattr(ours, name).grad, getattr(ref, name).grad, 1e-5, f"grad {name}")


def test_cpu_gradients_with_frozen_parameters():
    ref = nn.LayerNorm(16)
    ours = at.LayerNorm.from_torch(ref, share_parameters=False)
    for p in (*ref.parameters(), *ours.parameters()):
        p.requires_grad_(False)
    x = torch.randn(4, 16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref(xa).sum().backward()
    ours(xb).sum().backward()
    assert_rel(xb.grad + 1, xa.grad + 1, 1e-6, "grad x")  # the true gradient is ~0 here


def test_cpu_gradients_bfloat16():
    torch.manual_seed(0)
    ref = nn.LayerNorm(64, dtype=torch.bfloat16)
    randomize_affine(ref)
    ours = at.LayerNorm.from_torch(ref, share_parameters=False)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    grad = torch.randn(8, 64, dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref(xa).backward(grad)
    ours(xb).backward(grad)
    assert xb.grad.dtype == torch.bfloat16 and ours.weight.grad.dtype == torch.bfloat16
    assert_rel(xb.grad, xa.grad, 3e-2, "grad x")
    assert_rel(ours.weight.grad, ref.weight.grad, 3e-2, "grad weight")
    assert_rel(ours.bias.grad, ref.bias.grad, 3e-2, "grad bias")


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_opcheck(affine):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True) if affine in ("both", "weight") else None
    b = torch.randn(32, requires_grad=True) if affine in ("both", "bias") else None
    torch.library.opcheck(torch.ops.autonorm.layer_norm.default, (x, w, b, 1e-5))
    torch.library.opcheck(torch.ops.autonorm.layer_norm.default, (x.detach()[0, 0], w, b, 1e-3))


def test_compile_has_no_graph_break_cpu():
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(32, 32), at.LayerNorm(32), nn.GELU(), at.LayerNorm(32))
    x = torch.randn(4, 32)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_forward_and_backward_cpu(dynamic):
    # aot_eager traces forward and backward through the fake and autograd registrations
    # without needing a C++ compiler.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), at.LayerNorm(32), nn.GELU())
    randomize_affine(model)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    for rows in (4, 9):
        x = torch.randn(rows, 32)
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
    ref = nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32))
    randomize_affine(ref)
    ours = copy.deepcopy(ref)
    at.replace_layer_norms(ours)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        want, got = ref(x), ours(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------------------------
# The CUDA launch path, with a fake dispatcher (runs on CPU)
# --------------------------------------------------------------------------------------------


class FakeKernel:
    def __init__(self, problem, rows, device_id) -> None:
        self.problem, self.rows, self.device_id = problem, rows, device_id
        self.launches: list[tuple] = []

    def launch(self, args, stream_ptr) -> None:
        x_ptr, w_ptr, b_ptr, y_ptr, rows, eps = args  # LayerNorm's parameter list, in order
        self.launches.append((x_ptr, w_ptr, b_ptr, y_ptr, rows, eps, stream_ptr))


@pytest.fixture
def fake_dispatch(monkeypatch):
    """Route forward_cuda's lookups to a fake dispatcher; CPU tensors stand in for CUDA ones."""
    made: list[FakeKernel] = []

    def get_kernel(problem, rows, device_id):
        kernel = FakeKernel(problem, rows, device_id)
        made.append(kernel)
        return kernel

    module = types.ModuleType("autonorm.dispatch")
    module.get_kernel = get_kernel
    monkeypatch.setitem(sys.modules, "autonorm.dispatch", module)
    monkeypatch.setattr(forward, "_KERNELS", {})
    monkeypatch.setattr(forward, "_current_device", lambda: -1)  # a CPU tensor's get_device()
    monkeypatch.setattr(forward, "_raw_stream", lambda device_id: 0xABC0)
    return made


def test_launch_arguments(fake_dispatch):
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    y = forward.forward_cuda(x, w, None, 1e-6)
    (kernel,) = fake_dispatch
    assert kernel.problem.hidden == 64 and kernel.problem.dtype == "bfloat16"
    assert kernel.problem.has_weight and not kernel.problem.has_bias
    assert kernel.rows == 15 and kernel.device_id == -1
    ((x_ptr, w_ptr, b_ptr, y_ptr, rows, eps, stream),) = kernel.launches
    assert (x_ptr, w_ptr, b_ptr, y_ptr) == (x.data_ptr(), w.data_ptr(), 0, y.data_ptr())
    assert rows == 15 and eps == 1e-6 and type(eps) is float and stream == 0xABC0
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    assert y.data_ptr() != x.data_ptr()


def test_kernel_cache_per_rows_bucket(fake_dispatch):
    w = torch.ones(32)
    for rows in (3, 4, 4, 3):  # one bucket (4)
        forward.forward_cuda(torch.randn(rows, 32), w, w, 1e-5)
    assert len(fake_dispatch) == 1 and len(fake_dispatch[0].launches) == 4
    forward.forward_cuda(torch.randn(5, 32), w, w, 1e-5)  # bucket 8
    forward.forward_cuda(torch.randn(5, 32), None, None, 1e-5)  # other affine flags
    forward.forward_cuda(torch.randn(5, 32, dtype=torch.float16), None, None, 1e-5)  # other dtype
    assert len(fake_dispatch) == 4
    assert [k[-1] for k in forward._KERNELS] == [4, 8, 8, 8]


def test_misaligned_and_strided_inputs_are_copied(fake_dispatch):
    buf = torch.randn(4 * 64 + 1)
    x = buf[1:].view(4, 64)  # 4-byte offset: not 16-byte aligned
    assert x.data_ptr() % 16
    wbuf = torch.randn(2 * 64)
    w = wbuf[::2]  # strided weight
    forward.forward_cuda(x, w, None, 1e-5)
    x_ptr, w_ptr = fake_dispatch[0].launches[0][:2]
    assert x_ptr % 16 == 0 and x_ptr != x.data_ptr()
    assert w_ptr % 16 == 0 and w_ptr != w.data_ptr()
    xt = torch.randn(64, 4).t()
    forward.forward_cuda(xt, None, None, 1e-5)
    assert fake_dispatch[1].launches[0][0] != xt.data_ptr()


def test_zero_rows_do_not_launch(fake_dispatch):
    y = forward.forward_cuda(torch.empty(0, 64), None, None, 1e-5)
    assert y.shape == (0, 64) and not fake_dispatch


def test_launch_path_validates(fake_dispatch):
    with pytest.raises(ShapeError):
        forward.forward_cuda(torch.randn(2, 8), torch.ones(9), None, 1e-5)
    with pytest.raises(InputError):
        forward.forward_cuda(torch.randn(2, 8), None, None, 0.0)
    with pytest.raises(UnsupportedDtypeError):
        forward.forward_cuda(torch.randn(2, 8), torch.ones(8, dtype=torch.float16), None, 1e-5)
    forward.forward_cuda(torch.randn(2, 8), None, None, 1)  # an int eps is fine
    assert fake_dispatch[0].launches[0][5] == 1.0


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------

TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}
# Normwise gradient tolerance: both sides compute in float32 and round once to the dtype.
GRAD_TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def make_affine(hidden, dtype, affine, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = b = None
    if affine in ("both", "weight"):
        w = (1 + 0.5 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype)
    if affine in ("both", "bias"):
        b = (0.5 * torch.randn(hidden, device="cuda", generator=gen)).to(dtype)
    return w, b


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 768), (3, 5, 1001), (64, 4096), (2, 16384)])
def test_gpu_matches_torch_shapes(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda").to(dtype)
    w, b = make_affine(shape[-1], dtype, "both")
    with torch.no_grad():
        y = at.layer_norm(x, w, b)
    torch.testing.assert_close(y, F.layer_norm(x, (shape[-1],), w, b), **TOL[dtype])


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["weight", "bias", "none"])
def test_gpu_matches_torch_affine_variants(dtype, affine):
    torch.manual_seed(0)
    x = torch.randn(37, 2048, device="cuda").to(dtype)
    w, b = make_affine(2048, dtype, affine)
    with torch.no_grad():
        y = at.layer_norm(x, w, b, eps=1e-6)
    torch.testing.assert_close(y, F.layer_norm(x, (2048,), w, b, 1e-6), **TOL[dtype])


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_module_matches_torch_module(dtype):
    torch.manual_seed(0)
    ref = nn.LayerNorm(1024, device="cuda", dtype=dtype)
    randomize_affine(ref)
    ours = at.LayerNorm.from_torch(ref)
    x = torch.randn(8, 33, 1024, device="cuda").to(dtype)
    with torch.inference_mode():
        torch.testing.assert_close(ours(x), ref(x), **TOL[dtype])


@gpu
@pytest.mark.parametrize("affine", ["both", "none"])
def test_gpu_offset_data_is_exact(affine):
    # Rows with mean 1000 and spread 0.1: E[x^2] - E[x]^2 in float32 loses everything here.
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = 1000 + 0.1 * torch.randn(64, 4096, device="cuda", dtype=torch.float64, generator=gen)
    x = x.float()
    w, b = make_affine(4096, torch.float32, affine)
    with torch.no_grad():
        y = at.layer_norm(x, w, b, eps=1e-5)
    xd = x.double()
    mean = xd.mean(-1, keepdim=True)
    ref = (xd - mean) / torch.sqrt(((xd - mean) ** 2).mean(-1, keepdim=True) + 1e-5)
    if w is not None:
        ref = ref * w.double() + b.double()
    assert_rel(y, ref, 1e-6, "offset rows")


@gpu
def test_gpu_misaligned_noncontiguous_and_multidim():
    torch.manual_seed(0)
    dtype = torch.float16
    w, b = make_affine(512, dtype, "both")
    buf = torch.randn(8 * 512 + 1, device="cuda").to(dtype)
    x = buf[1:].view(8, 512)
    assert x.data_ptr() % 16
    before = x.clone()
    with torch.no_grad():
        y = at.layer_norm(x, w, b)
        torch.testing.assert_close(y, F.layer_norm(x, (512,), w, b), **TOL[dtype])
        assert torch.equal(x, before)  # the input is never written
        xt = torch.randn(512, 8, device="cuda").to(dtype).t()
        torch.testing.assert_close(
            at.layer_norm(xt, w, b), F.layer_norm(xt, (512,), w, b), **TOL[dtype]
        )
        ref = nn.LayerNorm((4, 128), device="cuda", dtype=dtype)
        randomize_affine(ref)
        ours = at.LayerNorm.from_torch(ref)
        x4 = torch.randn(3, 4, 128, device="cuda").to(dtype)
        torch.testing.assert_close(ours(x4), ref(x4), **TOL[dtype])
        assert at.layer_norm(torch.empty(0, 512, device="cuda", dtype=dtype)).shape == (0, 512)


@gpu
def test_gpu_orders_with_the_current_stream():
    torch.manual_seed(0)
    src = torch.randn(256, 4096, device="cuda")
    expected = F.layer_norm(src, (4096,))
    x = torch.zeros_like(src)
    at.layer_norm(x)  # compile and cache the kernel outside the race
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), torch.no_grad():
        torch.cuda._sleep(50_000_000)  # the producer is late by tens of milliseconds
        x.copy_(src)  # producer kernel on the side stream
        y = at.layer_norm(x)  # no synchronization in between: stream order must do it
    torch.cuda.synchronize()
    torch.testing.assert_close(y, expected, **TOL[torch.float32])


@gpu
def test_gpu_cuda_graph_capture_and_replay():
    torch.manual_seed(0)
    dtype = torch.bfloat16
    model = at.LayerNorm(2048, device="cuda", dtype=dtype)
    randomize_affine(model)
    static_x = torch.randn(32, 2048, device="cuda").to(dtype)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up: the kernel is compiled and cached before capture
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = model(static_x)
        new = torch.randn(32, 2048, device="cuda").to(dtype)
        static_x.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        expected = F.layer_norm(new, (2048,), model.weight, model.bias, model.eps)
    torch.testing.assert_close(static_y, expected, **TOL[dtype])


@gpu
def test_gpu_cuda_graph_of_bulk_kernels_takes_the_dynamic_schedule():
    from autonorm import dispatch
    from autonorm.ops.layer_norm.problem import Problem
    from autonorm.runtime import workspace

    torch.manual_seed(0)
    dtype, hidden, rows = torch.bfloat16, 32768, 2048
    kernel = dispatch.get_kernel(Problem(hidden, "bfloat16"), rows)
    # The shipped DB's pick here is a bulk kernel, with tiles enough for the dynamic schedule.
    assert kernel.plan.uses_counter(rows, kernel.grid(rows))
    model = at.LayerNorm(hidden, device="cuda", dtype=dtype)
    randomize_affine(model)
    static_x = torch.randn(rows, hidden, device="cuda").to(dtype)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        before = dict(workspace._OPEN_PAGE)  # noqa: SLF001
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = model(static_x)
        after = workspace._OPEN_PAGE[torch.cuda.current_device()]  # noqa: SLF001
        assert after != before.get(torch.cuda.current_device())  # a captured launch's counter
        for _ in range(3):
            new = torch.randn(rows, hidden, device="cuda").to(dtype)
            static_x.copy_(new)
            static_y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            expected = F.layer_norm(new, (hidden,), model.weight, model.bias, model.eps)
            torch.testing.assert_close(static_y, expected, **TOL[dtype])


@gpu
def test_gpu_torch_compile_no_graph_break_and_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), at.LayerNorm(256), nn.GELU(), nn.Linear(256, 256))
    model = model.cuda()
    randomize_affine(model)
    x = torch.randn(16, 256, device="cuda")
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    # Training through the compiled graph: the registered backward runs under inductor.
    model.zero_grad()
    model(x).square().mean().backward()
    eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled(x).square().mean().backward()
    for got, want in zip([p.grad for p in model.parameters()], eager, strict=True):
        assert_rel(got, want, 1e-4, "compiled gradient")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_gpu_gradients_match_torch(dtype, affine):
    torch.manual_seed(0)
    kwargs = {"elementwise_affine": affine != "none", "bias": affine == "both"}
    ref = nn.LayerNorm(1024, device="cuda", dtype=dtype, **kwargs)
    randomize_affine(ref)
    ours = at.LayerNorm.from_torch(ref, share_parameters=False)
    x = (2 + torch.randn(4, 33, 1024, device="cuda")).to(dtype)
    grad = torch.randn(4, 33, 1024, device="cuda").to(dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ref(xa), ours(xb)
    torch.testing.assert_close(yb, ya, **TOL[dtype])
    ya.backward(grad)
    yb.backward(grad)
    assert_rel(xb.grad, xa.grad, GRAD_TOL[dtype], "grad x")
    for name in ("weight", "bias"):
        if getattr(ref, name) is not None:
            got, want = getattr(ours, name).grad, getattr(ref, name).grad
            assert got.dtype == dtype
            assert_rel(got, want, GRAD_TOL[dtype], f"grad {name}")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_transformer_block_with_replaced_layer_norms(dtype):
    torch.manual_seed(0)
    block = Block(256, 8).to("cuda", dtype).eval()
    randomize_affine(block)
    swapped = copy.deepcopy(block)
    assert at.replace_layer_norms(swapped) == 2
    x = torch.randn(4, 64, 256, device="cuda").to(dtype)
    with torch.no_grad():
        assert_rel(swapped(x), block(x), 1e-4 if dtype == torch.float32 else 3e-2, "block")


@gpu
def test_gpu_autocast_matches_torch():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(512, 512), nn.LayerNorm(512)).cuda()
    randomize_affine(ref)
    ours = copy.deepcopy(ref)
    at.replace_layer_norms(ours)
    x = torch.randn(16, 512, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
        want, got = ref(x), ours(x)
    assert want.dtype == got.dtype == torch.float32
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = ours(x)  # the autograd path: the op's registered autocast rule
    assert got.dtype == torch.float32


@gpu
@pytest.mark.skipif(HAS_GPU and torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_tensor_on_a_non_current_device():
    torch.cuda.set_device(0)
    x = torch.randn(8, 1024, device="cuda:1")
    with torch.no_grad():
        y = at.layer_norm(x)
    assert y.device == x.device and torch.cuda.current_device() == 0
    torch.testing.assert_close(y, F.layer_norm(x, (1024,)), **TOL[torch.float32])


class NoOpKernel:
    def launch(self, *args) -> None:
        pass


def per_call_seconds(fn, calls: int = 2000, repeats: int = 5) -> float:
    """Best-of-``repeats`` host time of one call (the GPU outruns a rows=1 loop)."""
    best = math.inf
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    torch.cuda.synchronize()
    return best


@gpu
def test_gpu_host_overhead(monkeypatch):
    # Bounds relative to eager F.layer_norm timed in the same run: the device host's speed
    # varies 5x from one machine to the next (eager's rows-1 do_bench 7 -> 35 us), and an
    # absolute 8 us bound on the wrapper failed on unchanged code.
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w, b = make_affine(4096, torch.bfloat16, "both")
    with torch.inference_mode():
        at.layer_norm(x, w, b)  # compile and cache
        F.layer_norm(x, (4096,), w, b)
        eager = per_call_seconds(lambda: F.layer_norm(x, (4096,), w, b))
        total = per_call_seconds(lambda: at.layer_norm(x, w, b))
        key = (x.get_device(), torch.bfloat16, 4096, True, True, 1)
        assert key in forward._KERNELS
        monkeypatch.setitem(forward._KERNELS, key, NoOpKernel())
        wrapper = per_call_seconds(lambda: at.layer_norm(x, w, b))
    message = (f"per call: {total * 1e6:.1f} µs in all, {wrapper * 1e6:.1f} µs in autonorm.torch;"
               f" eager F.layer_norm {eager * 1e6:.1f} µs")
    warnings.warn(message, stacklevel=1)  # shows in the -ra summary
    assert wrapper < eager, message  # our Python costs less than eager's whole call
    assert total < 1.5 * eager, message
