"""GPU: autograd of autonorm.torch's norms runs the backward kernels, compiled and captured.

The registered backwards of ``layer_norm`` and ``rms_norm`` launch the tuned backward kernel
through ``torch.ops.autonorm.norm_backward``: their gradients match torch's float64 ones, a
compiled training step has no graph break, and a CUDA graph replays the backward bit for bit.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _leaves(torch, dtype: str, *, residual: bool, bias: bool) -> tuple:  # noqa: ANN001
    """Random CUDA inputs (2048 x 4096): dy, then x (residual) w (b) as autonorm's leaves and
    as float64 leaves."""
    tdtype = getattr(torch, dtype)
    x = torch.randn(2048, 4096, device="cuda", dtype=tdtype)
    w = (1 + 0.1 * torch.randn(4096, device="cuda")).to(tdtype)
    b = (0.1 * torch.randn(4096, device="cuda")).to(tdtype)
    params = [x, *([torch.randn_like(x)] if residual else []), w, *([b] if bias else [])]
    ours = [t.clone().requires_grad_() for t in params]
    ref = [t.double().requires_grad_() for t in params]
    return torch.randn_like(x), ours, ref


def _assert_grads_match(ours: list, ref: list, dtype: str, what: tuple) -> None:
    """Each leaf's gradient within dtype tolerance of the float64 one (max error over max)."""
    tol = 1e-5 if dtype == "float32" else 2e-2
    for i, (mine, theirs) in enumerate(zip(ours, ref, strict=True)):
        err = (mine.grad.double() - theirs.grad).abs().max() / theirs.grad.abs().max()
        assert err < tol, (*what, i, float(err))


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_autograd_runs_the_backward_kernel(op: str, dtype: str) -> None:
    torch = pytest.importorskip("torch")
    import autonorm.torch as at
    from autonorm.torch.forward import BACKWARD_KERNELS

    BACKWARD_KERNELS.clear()
    hidden = 4096
    dy, ours, ref = _leaves(torch, dtype, residual=False, bias=op == "layer_norm")
    if op == "layer_norm":
        at.layer_norm(*ours).backward(dy)
        torch.nn.functional.layer_norm(ref[0], (hidden,), ref[1], ref[2], 1e-5).backward(
            dy.double())
    else:
        at.rms_norm(*ours).backward(dy)
        torch.nn.functional.rms_norm(ref[0], (hidden,), ref[1], 1e-6).backward(dy.double())
    assert BACKWARD_KERNELS, "the backward did not launch an autonorm kernel"
    _assert_grads_match(ours, ref, dtype, (op, dtype))


def test_compiled_training_step_has_no_graph_break() -> None:
    torch = pytest.importorskip("torch")
    import autonorm.torch as at

    x = torch.randn(512, 1024, device="cuda", requires_grad=True)
    w = torch.ones(1024, device="cuda", requires_grad=True)

    def step(x, w):  # noqa: ANN001, ANN202
        return (at.rms_norm(x, w) * at.layer_norm(x, w)).square().sum()

    compiled = torch.compile(step, fullgraph=True)
    loss = compiled(x, w)
    loss.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    step(x, w).backward()
    assert torch.allclose(gx, x.grad, rtol=1e-4, atol=1e-4)
    assert torch.allclose(gw, w.grad, rtol=1e-4, atol=1e-2)


def test_backward_is_captured_by_a_cuda_graph() -> None:
    torch = pytest.importorskip("torch")
    import autonorm.torch as at

    x = torch.randn(1000, 2048, device="cuda", requires_grad=True)
    w = torch.randn(2048, device="cuda", requires_grad=True)
    dy = torch.randn(1000, 2048, device="cuda")
    at.layer_norm(x, w).backward(dy)  # compile and warm up outside the capture
    eager = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        at.layer_norm(x, w).backward(dy)
        x.grad = w.grad = None
        with torch.cuda.graph(graph, stream=stream):
            at.layer_norm(x, w).backward(dy)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.grad, eager[0]) and torch.equal(w.grad, eager[1])


@pytest.mark.parametrize("op", ["add_layer_norm", "add_rms_norm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_add_autograd_runs_the_backward_kernel(op: str, dtype: str) -> None:
    # y, h = add_norm(x, residual): both outputs feed the loss, so h's gradient joins the
    # norm's in the kernel and x and residual get the same gradient.
    torch = pytest.importorskip("torch")
    import autonorm.torch as at
    from autonorm.torch.forward import BACKWARD_KERNELS

    BACKWARD_KERNELS.clear()
    tdtype, hidden = getattr(torch, dtype), 4096
    dy, ours, ref = _leaves(torch, dtype, residual=True, bias=op == "add_layer_norm")
    dh = torch.randn_like(dy)
    y, h = getattr(at, op)(*ours, 1e-5 if op == "add_layer_norm" else 1e-6)
    torch.autograd.backward([y, h], [dy, dh])
    # The reference normalizes the sum as rounded to the dtype, as the kernel does.
    # (The rounded value carries no gradient: h's gradient reaches x and residual once.)
    h64 = ((ref[0] + ref[1]).detach().to(tdtype).double() + (ref[0] + ref[1])
           - (ref[0] + ref[1]).detach())
    if op == "add_layer_norm":
        y64 = torch.nn.functional.layer_norm(h64, (hidden,), ref[2], ref[3], 1e-5)
    else:
        y64 = torch.nn.functional.rms_norm(h64, (hidden,), ref[2], 1e-6)
    torch.autograd.backward([y64, h64], [dy.double(), dh.double()])
    assert any(key[6] for key in BACKWARD_KERNELS), "no residual backward kernel launched"
    _assert_grads_match(ours, ref, dtype, (op, dtype))
