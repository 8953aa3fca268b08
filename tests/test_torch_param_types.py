"""A weight or bias that is no tensor gets autonorm's one-line error on every path of the ops.

A call in torch.nn.functional's order, ``layer_norm(x, (hidden,))``, passes a tuple as the
weight. Each path of the functional ops (eager, grad off, autograd, a tensor subclass, CPU
autocast, torch.compile) must name the argument, not fail on an attribute the tuple lacks or
in the custom op's schema. The model-wide replace helpers likewise name a model that is no
module.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import autonorm.torch as at  # noqa: E402
from autonorm.errors import InputError  # noqa: E402

HIDDEN = 8

# op name -> (call with x and the bad parameter, the argument it is passed as)
CALLS = {
    "layer_norm-weight": (lambda x, p: at.layer_norm(x, p), "weight"),
    "layer_norm-bias": (lambda x, p: at.layer_norm(x, None, p), "bias"),
    "rms_norm-weight": (lambda x, p: at.rms_norm(x, p), "weight"),
    "add_layer_norm-weight": (lambda x, p: at.add_layer_norm(x, torch.ones_like(x), p), "weight"),
    "add_layer_norm-bias": (
        lambda x, p: at.add_layer_norm(x, torch.ones_like(x), None, p), "bias"
    ),
    "add_rms_norm-weight": (lambda x, p: at.add_rms_norm(x, torch.ones_like(x), p), "weight"),
}

# What a caller may pass instead of a tensor.
NOT_TENSORS = {
    "tuple": (HIDDEN,),
    "list": [1.0] * HIDDEN,
    "ndarray": np.ones(HIDDEN, dtype=np.float32),
}


def _plain() -> torch.Tensor:
    return torch.randn(4, HIDDEN)


def _requires_grad() -> torch.Tensor:
    return torch.randn(4, HIDDEN, requires_grad=True)


def _parameter() -> torch.Tensor:
    return nn.Parameter(torch.randn(4, HIDDEN))


# path -> (x, the context the call runs in)
PATHS = {
    "eager": (_plain, contextlib.nullcontext),
    "no-grad": (_plain, torch.no_grad),
    "inference-mode": (_plain, torch.inference_mode),
    "x-requires-grad": (_requires_grad, contextlib.nullcontext),
    "tensor-subclass": (_parameter, contextlib.nullcontext),
    "cpu-autocast": (_plain, lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
}


@pytest.mark.parametrize("kind", NOT_TENSORS)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("call", CALLS)
def test_a_parameter_that_is_no_tensor_is_named(call, path, kind):
    run, name = CALLS[call]
    make_x, context = PATHS[path]
    value = NOT_TENSORS[kind]
    x = make_x()
    with context(), pytest.raises(InputError) as info:
        run(x, value)
    assert str(info.value) == (
        f"{name} must be a torch.Tensor or None, got {type(value).__name__}"
    )


@pytest.mark.parametrize("call", CALLS)
def test_a_parameter_that_is_no_tensor_is_named_under_torch_compile(call):
    run, name = CALLS[call]
    torch._dynamo.reset()
    # Dynamo traces the check and raises it as eager would (fullgraph=True would wrap it in its
    # own Unsupported error instead).
    compiled = torch.compile(lambda x: run(x, (HIDDEN,)), backend="eager")
    with pytest.raises(InputError, match=f"^{name} must be a torch.Tensor or None, got tuple$"):
        compiled(torch.randn(4, HIDDEN))


@pytest.mark.parametrize("call", CALLS)
def test_tensor_parameters_still_run_on_every_path(call):
    # The checks above sit on the paths that ordinary calls take: they must let tensors through.
    run, _ = CALLS[call]
    for make_x, context in PATHS.values():
        x = make_x()
        with context():
            out = run(x, torch.ones(HIDDEN))
        y = out[0] if isinstance(out, tuple) else out
        assert y.shape == x.shape and torch.isfinite(y).all()


@pytest.mark.parametrize("replace", [at.replace_layer_norms, at.replace_rms_norms])
@pytest.mark.parametrize("model", [torch.zeros(2), None, "model"])
def test_replace_names_a_model_that_is_no_module(replace, model):
    with pytest.raises(InputError) as info:
        replace(model)
    assert str(info.value) == f"model must be a torch.nn.Module, got {type(model).__name__}"
