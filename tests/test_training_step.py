"""Training a small GPT with autonorm's norms gives torch's losses, gradients and parameters.

A GPT-style model (token and position embeddings, two pre-norm blocks of causal attention and a
GELU MLP, a final norm, an LM head) is built with ``torch.nn.LayerNorm`` (with bias) or
``torch.nn.RMSNorm``; a deep copy has its norms swapped by
:func:`autonorm.torch.replace_layer_norms` (:func:`~autonorm.torch.replace_rms_norms`). Both
train for a few AdamW steps on the same next-token batches, and the test compares the loss at
every step, every parameter's gradient after the first backward and every parameter after the
last step. Each test then perturbs one norm weight of the swapped model and checks that the same
gradient comparison fails, so a passing comparison means something.

CPU tests run everywhere torch is installed: there autonorm's op computes torch's forward and its
own registered backward formula, so they check the swap, the autograd wiring and the gradients.
Tests marked ``gpu`` need a CUDA GPU, torch with CUDA and CuPy, and skip themselves otherwise;
they run autonorm's forward and backward kernels, eagerly and under ``torch.compile``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from test_torch import gpu  # noqa: E402  (the torch tests' shared helpers)
from torch import nn  # noqa: E402

import autonorm.torch as at  # noqa: E402
from autonorm.torch import forward  # noqa: E402

# Hidden sizes are multiples of 8, the shapes the GPU kernels are tuned and measured on, and
# every norm sees BATCH * SEQ rows, so each (dtype, norm, direction) needs one kernel.
HIDDEN, HEADS, LAYERS, VOCAB = 256, 4, 2, 512
BATCH, SEQ = 4, 64
STEPS, LR = 3, 1e-3
EPS = 1e-5
NORMS = 2 * LAYERS + 1  # two per block and the final one

# norm -> (torch's class, autonorm's class, the swap)
KINDS = {
    "layer": (nn.LayerNorm, at.LayerNorm, at.replace_layer_norms),
    "rms": (nn.RMSNorm, at.RMSNorm, at.replace_rms_norms),
}


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-norm GPT block: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, norm: type) -> None:
        super().__init__()
        self.ln1 = norm(HIDDEN, eps=EPS)
        # No qkv bias: its key part shifts every score of a row alike, which softmax ignores, so
        # its gradient is rounding noise that AdamW scales up to full lr-sized steps of random
        # sign, and the two models' parameters would differ there by design.
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.ln2 = norm(HIDDEN, eps=EPS)
        self.fc = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.out = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class GPT(nn.Module):
    """Embeddings, the blocks, a final norm and an (untied) LM head."""

    def __init__(self, norm: str) -> None:
        super().__init__()
        cls = KINDS[norm][0]
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(SEQ, HIDDEN)
        self.blocks = nn.ModuleList(Block(cls) for _ in range(LAYERS))
        self.ln_f = cls(HIDDEN, eps=EPS)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@dataclass
class Pair:
    """torch's model, its swapped copy and an AdamW optimizer for each."""

    ref: GPT
    model: GPT
    ref_opt: torch.optim.Optimizer
    model_opt: torch.optim.Optimizer


def make_pair(norm: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Pair:
    """Build the seeded reference model and a copy with autonorm's norms.

    Args:
        norm: ``"layer"`` (LayerNorm with bias) or ``"rms"`` (RMSNorm).
        dtype: the dtype of every parameter (and so of the activations).
        device: where the models live.

    Returns:
        The pair, with identical parameters and fresh optimizers.
    """
    torch.manual_seed(0)
    ref = GPT(norm)
    # Norms initialize to ones and zeros, which would hide a weight or bias applied wrongly
    # (or a gradient that ignores them): give them values of their own.
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in ref.modules():
            if isinstance(module, KINDS[norm][0]):
                module.weight.copy_(1 + 0.2 * torch.randn(HIDDEN, generator=gen))
                if getattr(module, "bias", None) is not None:
                    module.bias.copy_(0.1 * torch.randn(HIDDEN, generator=gen))
    ref = ref.to(device, dtype).train()
    model = copy.deepcopy(ref)
    # Built before the swap, as a training script might: the swap keeps the copy's Parameter
    # objects, so this optimizer must still train the swapped model.
    model_opt = torch.optim.AdamW(model.parameters(), lr=LR)
    torch_cls, autonorm_cls, replace = KINDS[norm]
    assert replace(model) == NORMS
    norms = [m for m in model.modules() if isinstance(m, torch_cls)]
    assert len(norms) == NORMS and all(type(m) is autonorm_cls for m in norms)
    assert all(m.eps == EPS for m in norms)
    assert replace(model) == 0  # nothing of torch's left to swap
    for (name, got), want in zip(model.state_dict().items(), ref.state_dict().values(),
                                 strict=True):
        assert torch.equal(got, want), name
    return Pair(ref, model, torch.optim.AdamW(ref.parameters(), lr=LR), model_opt)


def token_batches(device: str = "cpu") -> torch.Tensor:
    """STEPS seeded batches of BATCH sequences of SEQ + 1 tokens (inputs and next tokens)."""
    gen = torch.Generator().manual_seed(2)
    return torch.randint(0, VOCAB, (STEPS, BATCH, SEQ + 1), generator=gen).to(device)


def next_token_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``tokens[:, 1:]`` from ``tokens[:, :-1]``.

    The logits are cast to float32 first, so in bfloat16 the loss itself adds no rounding of
    its own to the comparison.
    """
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


# --------------------------------------------------------------------------------------------
# Comparisons
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tol:
    """Relative tolerances: loss at each step, first gradients (L2), final parameters (L2)."""

    loss: float
    grad: float
    param: float


# Each norm differs from torch's by the dtype's rounding alone: on the GPU autonorm's kernels
# reduce in other orders and round once; everywhere its backward recomputes the statistics in
# float32 (on the CPU its forward is torch's own). The rest of both models is the same code.
# float32: measured on the CPU, the first gradients differ by <= 5e-7 (relative L2), the
# parameters after three steps by <= 3e-6 and the losses by < 1e-7, so 1e-4, 1e-4 and 1e-5
# leave wide margins. The parameters need more room than their gradients: AdamW's first update
# is ~lr * sign(g) whatever |g|, so an element whose gradient is near zero can step either way.
CPU_TOL = Tol(loss=1e-5, grad=1e-4, param=1e-4)
GPU_TOL = {
    # The kernels' float32 reductions run in other orders than torch's: the same size of
    # difference as on the CPU. SDPA's and the embedding's backwards add atomic-order noise
    # of the same size to both models.
    torch.float32: CPU_TOL,
    # bfloat16, measured with this model on the CPU: every gradient of either model lies ~6e-3
    # (relative L2) from the float64 model's, the floor bfloat16 activations set, except torch's
    # own LayerNorm weight gradients, up to 1.8e-2 away, so the two models' differ by up to
    # 1.7e-2: gradients get 4e-2, room for the GPU's own roundings. A wrong backward term is
    # O(1). Losses (from float32 logits) differed by < 1e-4 and parameters by < 4e-3 (AdamW's
    # updates of bfloat16 parameters mostly round alike): 1e-2 and 2e-2.
    torch.bfloat16: Tol(loss=1e-2, grad=4e-2, param=2e-2),
}
# Under inductor the model's other elementwise work (GELU, the bias and residual adds) is fused
# and reordered too, so the compiled gradients get the 1e-3 the decoder test allows compiled
# float32 gradients.
COMPILED_TOL = Tol(loss=1e-5, grad=1e-3, param=1e-4)
# The negative check scales one norm weight by 1 + PERTURB * tol.grad: a difference ten times
# the tolerance, which the gradient comparison must report.
PERTURB = 10.0


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Return ||actual - expected|| / ||expected|| in float64 (L2 over the whole tensor)."""
    a, e = actual.double(), expected.double()
    return (a - e).norm().item() / max(e.norm().item(), 1e-30)


def assert_grads_match(pair: Pair, tol: float) -> None:
    """Assert every gradient of the swapped model is within ``tol`` of torch's (relative L2).

    Args:
        pair: the models, after a backward of each.
        tol: the relative L2 tolerance per parameter.
    """
    params = dict(pair.model.named_parameters())
    assert list(params) == [name for name, _ in pair.ref.named_parameters()]
    for name, want in pair.ref.named_parameters():
        got = params[name].grad
        assert got is not None and want.grad is not None, f"no gradient of {name}"
        assert want.grad.abs().max() > 0, f"torch's gradient of {name} is zero"
        err = rel_l2(got, want.grad)
        assert err <= tol, f"gradient of {name}: relative L2 error {err:.3g} > {tol:.3g}"


def assert_params_match(pair: Pair, tol: float) -> None:
    """Assert every parameter of the swapped model is within ``tol`` of torch's (relative L2)."""
    params = dict(pair.model.named_parameters())
    for name, want in pair.ref.named_parameters():
        err = rel_l2(params[name], want)
        assert err <= tol, f"parameter {name}: relative L2 error {err:.3g} > {tol:.3g}"


def assert_norms_run_autonorm(pair: Pair, tokens: torch.Tensor) -> None:
    """Assert each norm of the swapped model returns a tensor made by autonorm's op.

    The output's autograd node is the op's registered backward, so the gradients of the
    training steps run autonorm's backward, not torch's.
    """
    names: list[str] = []
    hooks = [
        m.register_forward_hook(lambda _m, _args, out: names.append(out.grad_fn.name()))
        for m in pair.model.modules()
        if isinstance(m, (at.LayerNorm, at.RMSNorm))
    ]
    try:
        pair.model(tokens[:, :-1])
    finally:
        for hook in hooks:
            hook.remove()
    assert len(names) == NORMS and all("autonorm" in n.lower() for n in names), names


def backward_both(pair: Pair, model_forward, tokens: torch.Tensor) -> tuple[float, float]:
    """Zero the gradients, run one forward and backward of each model; return both losses.

    Args:
        pair: the models.
        model_forward: what runs the swapped model (the module, or its compiled form).
        tokens: one batch of token sequences.

    Returns:
        The swapped model's loss and torch's.
    """
    pair.model_opt.zero_grad(set_to_none=True)
    pair.ref_opt.zero_grad(set_to_none=True)
    got = next_token_loss(model_forward, tokens)
    want = next_token_loss(pair.ref, tokens)
    got.backward()
    want.backward()
    return got.item(), want.item()


def train_and_compare(pair: Pair, model_forward, batches: torch.Tensor, tol: Tol) -> None:
    """Train both models on the same batches; compare losses, first gradients, parameters.

    Args:
        pair: the models and their optimizers, with identical parameters.
        model_forward: what runs the swapped model (the module, or its compiled form).
        batches: one batch of token sequences per step.
        tol: the tolerances.
    """
    for step, tokens in enumerate(batches):
        got, want = backward_both(pair, model_forward, tokens)
        err = abs(got - want) / abs(want)
        assert err <= tol.loss, f"step {step} loss {got} vs {want}: relative {err:.3g}"
        if step == 0:
            assert_grads_match(pair, tol.grad)
        pair.model_opt.step()
        pair.ref_opt.step()
    assert_params_match(pair, tol.param)


def assert_detects_perturbation(pair: Pair, model_forward, tokens: torch.Tensor,
                                tol: Tol) -> None:
    """Assert the gradient comparison fails once one norm weight of the swapped model differs.

    The swapped model is first given torch's parameters again (in place: the compiled form
    keeps reading them), then the first block's first norm weight is scaled by
    ``1 + PERTURB * tol.grad``.

    Args:
        pair: the models, after training.
        model_forward: what runs the swapped model (the module, or its compiled form).
        tokens: one batch of token sequences.
        tol: the tolerances the test compared with.
    """
    pair.model.load_state_dict(pair.ref.state_dict())
    with torch.no_grad():
        pair.model.blocks[0].ln1.weight.mul_(1 + PERTURB * tol.grad)
    backward_both(pair, model_forward, tokens)
    with pytest.raises(AssertionError, match="relative L2 error"):
        assert_grads_match(pair, tol.grad)


# --------------------------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_cpu_training_steps_match_torch(norm):
    pair = make_pair(norm)
    batches = token_batches()
    assert_norms_run_autonorm(pair, batches[0])
    train_and_compare(pair, pair.model, batches, CPU_TOL)
    assert_detects_perturbation(pair, pair.model, batches[0], CPU_TOL)


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------


def launched(cache: dict, dtype: torch.dtype) -> bool:
    """Whether ``cache`` (one of autonorm.torch's kernel caches) holds a kernel for this model."""
    return any(key[1:3] == (dtype, HIDDEN) for key in cache)


def assert_kernels_ran(norm: str, dtype: torch.dtype) -> None:
    """Assert autonorm's forward and backward kernels for ``norm`` ran since the cache was cleared.

    Only autonorm's ops fill these caches, so an entry shows the kernels served the norms.
    """
    forward_cache = forward._KERNELS if norm == "layer" else forward._RMS_KERNELS
    assert launched(forward_cache, dtype), "the norms never ran autonorm's forward kernel"
    backward = [key for key in forward.BACKWARD_KERNELS if key[1:3] == (dtype, HIDDEN)]
    # key[3] says which family the backward kernel is (RMSNorm or LayerNorm).
    assert any(key[3] == (norm == "rms") for key in backward), (
        "the norms never ran autonorm's backward kernel")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_gpu_training_steps_match_torch(norm, dtype):
    # The whole model in bfloat16, not autocast: CUDA autocast runs the norms in float32 (in
    # torch and so in autonorm), which would leave the bfloat16 kernels untested.
    pair = make_pair(norm, dtype, "cuda")
    batches = token_batches("cuda")
    at.clear_kernel_cache()  # the dispatcher keeps its own: this costs a lookup, no compile
    assert_norms_run_autonorm(pair, batches[0])
    train_and_compare(pair, pair.model, batches, GPU_TOL[dtype])
    assert_kernels_ran(norm, dtype)
    assert_detects_perturbation(pair, pair.model, batches[0], GPU_TOL[dtype])


@gpu
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_gpu_compiled_training_steps_match_torch(norm):
    torch._dynamo.reset()
    pair = make_pair(norm, torch.float32, "cuda")
    batches = token_batches("cuda")
    at.clear_kernel_cache()
    # fullgraph: a graph break (say, around autonorm's op) fails the compile. torch's model
    # stays eager, the reference the compiled one must match.
    compiled = torch.compile(pair.model, fullgraph=True)
    train_and_compare(pair, compiled, batches, COMPILED_TOL)
    assert_kernels_ran(norm, torch.float32)
    assert_detects_perturbation(pair, compiled, batches[0], COMPILED_TOL)
