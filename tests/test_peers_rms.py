"""CPU tests of ``benchmarks/peers.py --op rms_norm``: its self-test, its byte count, its calls.

The self-test runs the whole no-GPU path (parsing, shapes, shares, tables, JSON) for RMSNorm
and asserts on it itself; here its files are checked from outside, LayerNorm's JSON is checked
to carry no op (it is as it was before RMSNorm), and where torch is installed the op table's
calls and references are run on CPU tensors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "benchmarks" / "peers.py"
if str(PEERS.parent) not in sys.path:
    sys.path.insert(0, str(PEERS.parent))  # benchmarks/ is not a package: peerbench is in it

from peerbench import constants, ops, shapes  # noqa: E402
from peerbench.impls import Impls, Unavailable  # noqa: E402

ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}


def _selftest(tmp_path: Path, *args: str) -> tuple[str, dict]:
    run = subprocess.run([sys.executable, str(PEERS), "--selftest", "--plain", *args,
                          "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run.stdout, json.loads((tmp_path / "peers.json").read_text())


def test_the_rms_norm_selftest_compares_its_peers_by_the_bytes_rmsnorm_moves(tmp_path):
    stdout, data = _selftest(tmp_path, "--op", "rms_norm")
    assert "selftest ok" in stdout and "of rms_norm" in stdout
    assert "RMSNorm forward: GB/s and % of copy bandwidth" in stdout
    assert "RMSNorm forward latency, hidden 16384" in stdout
    measurements = data["measurements"]
    assert data["meta"]["op"] == "rms_norm"
    assert {m["op"] for m in measurements} == {"rms_norm"}
    assert {m["impl"] for m in measurements} == {"autonorm", "eager", "compile", "liger"}
    for m in measurements:  # x read and y written once, the weight read once: no bias
        item = ITEMSIZE[m["dtype"]]
        assert m["bytes"] == 2 * m["rows"] * m["hidden"] * item + m["hidden"] * item, m
    sweep = [m for m in measurements if m["suite"] == "sweep" and m["status"] == "ok"]
    assert sweep and all(m["share"] > 0 and m["share_zero"] > 0 for m in sweep)


def test_a_layer_norm_run_says_no_op_and_counts_weight_and_bias(tmp_path):
    stdout, data = _selftest(tmp_path, "--suites", "latency,llm")
    assert "LayerNorm forward: GB/s" in stdout and "RMSNorm" not in stdout
    assert "op" not in data["meta"]
    assert all("op" not in m for m in data["measurements"])
    assert {m["impl"] for m in data["measurements"]} >= {"triton"}
    for m in data["measurements"]:
        item = ITEMSIZE[m["dtype"]]
        assert m["bytes"] == 2 * m["rows"] * m["hidden"] * item + 2 * m["hidden"] * item, m


@pytest.mark.parametrize(("args", "expected"), [
    (["--op", "rms_norm", "--impls", "eager,triton"],
     "--impls: triton has no rms_norm implementation here (autonorm, eager, compile, liger)"),
    (["--op", "group_norm"], "invalid choice: 'group_norm'"),
])
def test_an_impl_or_op_the_benchmark_lacks_is_refused(args, expected):
    run = subprocess.run([sys.executable, str(PEERS), *args, "--selftest"],
                         capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert run.returncode == 2
    assert expected in run.stderr, run.stderr


def test_the_rmsnorm_calls_pass_the_weight_and_eps_and_no_bias():
    op = ops.OPS["rms_norm"]
    calls = []

    class Function:
        @staticmethod
        def apply(*args):
            calls.append(("liger", args))

    def autonorm(*args, **kwargs):
        calls.append(("autonorm", args, kwargs))

    op.liger_call(Function, "x", "w", None, 1e-6)()
    op.autonorm_call(autonorm, "x", "w", None, 1e-6)()
    assert calls == [("liger", ("x", "w", 1e-6)), ("autonorm", ("x", "w"), {"eps": 1e-6})]
    assert op.liger == ("liger_kernel.ops.rms_norm", "LigerRMSNormFunction")


def test_the_rmsnorm_peers_match_autonorms_float64_reference_on_the_cpu(monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    from autonorm.ops.rms_norm.reference import rms_norm_reference

    op = ops.OPS["rms_norm"]
    shape = shapes.Shape("sweep", "fp32", 384, 16, "rms_norm")
    gen = torch.Generator().manual_seed(0)
    x = 3.0 + torch.randn(16, 384, generator=gen)
    w = 1.0 + 0.1 * torch.randn(384, generator=gen)
    # Without CuPy the reference is the same formula in torch; it must equal autonorm's.
    monkeypatch.setitem(sys.modules, "cupy", None)
    ref = op.reference(F, shape, x, w, None, 1e-5)
    assert ref.dtype == torch.float64
    expected = rms_norm_reference(x.double().numpy(), w.double().numpy(), 1e-5)
    np.testing.assert_allclose(ref.numpy(), expected, rtol=1e-13, atol=0)
    eager = op.eager(F, shape, x, w, None, 1e-5)()
    compiled_form = op.compiled(F)(x, w, None, 1e-5)
    for y in (eager, compiled_form):
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < constants.TOL["fp32"], err
    # A wrong reference would be caught: LayerNorm's differs from it on rows of mean 3.
    ln = ops.OPS["layer_norm"].reference(F, shape, x, w, torch.zeros(384), 1e-5)
    assert float((ln - ref).norm() / ref.norm()) > 0.5


def test_impls_refuse_what_the_op_has_not():
    pytest.importorskip("torch")
    impls = Impls(["eager", "triton"], "none", "rms_norm")
    assert impls.unavailable == {"triton": "no rms_norm implementation"}
    shape = shapes.Shape("latency", "fp32", 64, 2, "rms_norm")
    with pytest.raises(Unavailable, match="no rms_norm implementation"):
        impls.make("triton", shape, None, None, None, 1e-5)


def test_the_latency_suite_takes_the_hidden_sizes_and_rows_given(tmp_path) -> None:
    stdout, data = _selftest(tmp_path, "--suites", "latency", "--latency-hidden", "2048,4096",
                             "--latency-rows", "1,64", "--latency-dtypes", "bf16,fp32")
    shapes = {(m["dtype"], m["hidden"], m["rows"]) for m in data["measurements"]
              if m["suite"] == "latency"}
    assert shapes == {(d, h, r) for d in ("bf16", "fp32") for h in (2048, 4096) for r in (1, 64)}
    assert "atency, hidden 2048, 4096: do_bench" in stdout
