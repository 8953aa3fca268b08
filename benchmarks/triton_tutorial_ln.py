"""LayerNorm forward written the way the official Triton tutorial ("05-layer-norm") does it.

A peer for ``benchmarks/peers.py``, written for this project from the tutorial's description
rather than copied:

* one program per row (grid = number of rows);
* ``BLOCK_SIZE`` = next power of two of the hidden size, capped at 64 KB / element size;
* ``num_warps`` = ``min(max(BLOCK_SIZE // 256, 1), 8)``;
* a first loop over the row in ``BLOCK_SIZE`` chunks accumulates the mean, a second loop the
  variance around that mean, a third loop normalizes, scales, shifts and stores;
* statistics in float32, the per-row mean and 1/std are stored as the tutorial does (its
  backward pass needs them).

One deliberate difference: the tutorial refuses rows longer than the capped ``BLOCK_SIZE``
("doesn't support feature dim >= 64KB"). The three loops already handle any length, so this
version simply loops more (needed for hidden 65536 in bf16/fp16/fp32).

Runs under ``TRITON_INTERPRET=1`` on CPU tensors too. Run as a script, it checks itself
against a float64 LayerNorm::

    python benchmarks/triton_tutorial_ln.py --hidden 4096 --rows 64 --dtype bf16
    python benchmarks/triton_tutorial_ln.py --device cpu     # Triton's interpreter, no GPU
"""

from __future__ import annotations

import argparse
import os

TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}  # relative L2, as benchmarks/peers.py


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the self-check's command line (before torch and Triton are imported)."""
    parser = argparse.ArgumentParser(
        description="The Triton-tutorial-style LayerNorm forward that benchmarks/peers.py "
                    "measures as a peer. Run as a script, it normalizes random rows and "
                    "checks them against a float64 LayerNorm (relative L2 error).",
    )
    parser.add_argument("--hidden", type=int, default=4096, help="hidden size (default: 4096)")
    parser.add_argument("--rows", type=int, default=64, help="rows (default: 64)")
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="bf16",
                        help="element type (default: bf16)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu runs Triton's interpreter (TRITON_INTERPRET=1; default: cuda)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    # --help exits here, before the imports below; the interpreter must be chosen before
    # triton.jit decorates the kernel.
    ARGS = parse_args()
    if ARGS.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402 - after the command line, so --help needs neither
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["layer_norm", "launch_config"]


@triton.jit
def _ln_fwd_rowwise(
    x_ptr,
    y_ptr,
    w_ptr,
    b_ptr,
    mean_ptr,
    rstd_ptr,
    x_row_stride,
    y_row_stride,
    n_cols,
    eps,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride

    # Pass 1: mean. Each lane keeps its own float32 partial sum; one tree reduction at the end.
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        v = tl.load(x_row + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
        acc += v
    mean = tl.sum(acc, axis=0) / n_cols

    # Pass 2: variance around the mean (masked lanes would contribute mean**2: zero them).
    acc2 = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        in_row = offs < n_cols
        v = tl.load(x_row + offs, mask=in_row, other=0.0).to(tl.float32)
        d = tl.where(in_row, v - mean, 0.0)
        acc2 += d * d
    var = tl.sum(acc2, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)

    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)

    # Pass 3: normalize, scale and shift, store in the output's dtype.
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        in_row = offs < n_cols
        v = tl.load(x_row + offs, mask=in_row, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=in_row, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=in_row, other=0.0).to(tl.float32)
        out = (v - mean) * rstd * w + b
        tl.store(y_row + offs, out.to(y_ptr.dtype.element_ty), mask=in_row)


def launch_config(n_cols: int, itemsize: int) -> tuple[int, int]:
    """Return ``(BLOCK_SIZE, num_warps)`` chosen the tutorial's way for a row of ``n_cols``."""
    max_block = 65536 // itemsize
    block = min(max_block, triton.next_power_of_2(n_cols))
    num_warps = min(max(block // 256, 1), 8)
    return block, num_warps


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
):
    """LayerNorm over the last dimension of ``x``; output has ``x``'s dtype and shape.

    ``weight`` and ``bias`` have shape ``(hidden,)``. With ``return_stats`` also returns the
    float32 per-row mean and 1/std.
    """
    hidden = x.shape[-1]
    if weight.shape != (hidden,) or bias.shape != (hidden,):
        raise ValueError(
            f"weight/bias must have shape ({hidden},), got {tuple(weight.shape)} and "
            f"{tuple(bias.shape)}"
        )
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    weight = weight.contiguous()
    bias = bias.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    mean = torch.empty((rows,), dtype=torch.float32, device=x.device)
    rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
    if rows > 0:
        block, num_warps = launch_config(hidden, x.element_size())
        _ln_fwd_rowwise[(rows,)](
            x2,
            y,
            weight,
            bias,
            mean,
            rstd,
            x2.stride(0),
            y.stride(0),
            hidden,
            eps,
            BLOCK_SIZE=block,
            num_warps=num_warps,
        )
    y = y.reshape(x.shape)
    if return_stats:
        return y, mean, rstd
    return y


def check(args: argparse.Namespace) -> int:
    """Normalize random rows on ``args.device``, compare with float64; 0 if within tolerance."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.rows, args.hidden, generator=gen).to(args.device, dtype)
    w = (1 + 0.1 * torch.randn(args.hidden, generator=gen)).to(args.device, dtype)
    b = (0.1 * torch.randn(args.hidden, generator=gen)).to(args.device, dtype)
    y = layer_norm(x, w, b, 1e-5)
    ref = torch.nn.functional.layer_norm(
        x.double(), (args.hidden,), w.double(), b.double(), 1e-5)
    err = float((y.double() - ref).norm() / ref.norm())
    block, num_warps = launch_config(args.hidden, x.element_size())
    ok = err <= TOLERANCE[args.dtype]
    print(f"{args.dtype} hidden {args.hidden} rows {args.rows} on {args.device}: BLOCK_SIZE "
          f"{block}, num_warps {num_warps}, relative L2 error {err:.2e} "
          f"({'ok' if ok else 'over'} {TOLERANCE[args.dtype]:.0e})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(check(ARGS))
