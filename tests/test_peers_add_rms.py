"""CPU tests of ``benchmarks/peers.py --op add_rms_norm``: the fused residual add + RMSNorm.

The self-test runs the no-GPU path (parsing, shapes, shares, tables, JSON) for the fused add;
here its files are checked from outside. Where torch is installed, the reference's rounded sum
is compared bit for bit with autonorm's, the op table's calls are run on CPU tensors, and one
shape goes through the real measuring code on the CPU (timing replaced): both outputs checked,
h exact, the in-place form on copies of its own, checked on fresh ones.
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

from peerbench import checks, constants, measurement, ops, shapes, summary  # noqa: E402
from peerbench.impls import Impls, Unavailable, torch_dtype  # noqa: E402

ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
IMPLS = {"autonorm", "autonorm-inplace", "eager", "compile", "liger"}


def test_the_selftest_counts_both_inputs_and_both_outputs_and_checks_h(tmp_path):
    run = subprocess.run([sys.executable, str(PEERS), "--selftest", "--plain", "--op",
                          "add_rms_norm", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "selftest ok" in run.stdout and "of add_rms_norm" in run.stdout
    assert "Fused add + RMSNorm forward: GB/s and % of copy bandwidth" in run.stdout
    assert "h = x + residual: largest |h - the float64 sum rounded to the dtype|" in run.stdout
    assert "in place: inputs put back before each timed launch" in run.stdout
    data = json.loads((tmp_path / "peers.json").read_text())
    assert data["meta"]["op"] == "add_rms_norm"
    measurements = data["measurements"]
    assert {m["op"] for m in measurements} == {"add_rms_norm"}
    assert {m["impl"] for m in measurements} == IMPLS
    for m in measurements:
        item = ITEMSIZE[m["dtype"]]
        # x and the residual read, y and h written, the weight read: once each.
        assert m["bytes"] == 4 * m["rows"] * m["hidden"] * item + m["hidden"] * item, m
        assert "h_rel_err" in m and "h_max_abs_err" in m
        if m["suite"] != "latency":  # a copy of x's and the residual's bytes, to a MiB
            two_inputs = 2 * m["rows"] * m["hidden"] * item
            assert abs(m["copy_bytes"] - two_inputs) <= 2**19 and m["copy_bytes"] % 2**20 == 0
    in_place = [m for m in measurements if m["impl"] == "autonorm-inplace"
                and m["status"] == "ok" and m["suite"] == "latency"]
    assert in_place and all(m["finite_after_timing"] for m in in_place)
    sweep = [m for m in measurements if m["suite"] == "sweep" and m["status"] == "ok"]
    assert sweep and all(m["share"] > 0 and m["share_zero"] > 0 for m in sweep)


@pytest.mark.parametrize(("args", "expected"), [
    (["--op", "add_rms_norm", "--impls", "autonorm,triton"],
     "--impls: triton has no add_rms_norm implementation here (autonorm, autonorm-inplace, "
     "eager, compile, liger)"),
    (["--impls", "autonorm-inplace"], "--impls: autonorm-inplace has no layer_norm"),
    (["--op", "rms_norm", "--impls", "autonorm-inplace"], "autonorm-inplace has no rms_norm"),
])
def test_the_in_place_form_belongs_to_the_fused_add_only(args, expected):
    run = subprocess.run([sys.executable, str(PEERS), *args, "--selftest"],
                         capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert run.returncode == 2
    assert expected in run.stderr, run.stderr


def test_the_calls_pass_x_the_residual_the_weight_and_eps():
    op = ops.OPS["add_rms_norm"]
    calls = []

    class Function:
        @staticmethod
        def apply(*args):
            calls.append(("liger", args))

    def autonorm(*args, **kwargs):
        calls.append(("autonorm", args, kwargs))

    op.liger_call(Function, "x", "w", None, 1e-6, "r")()
    op.autonorm_call(autonorm, "x", "w", None, 1e-6, "r")()
    op.in_place_call(autonorm, "x", "w", None, 1e-6, "r")()
    assert calls == [
        ("liger", ("x", "r", "w", 1e-6)),
        ("autonorm", ("x", "r", "w"), {"eps": 1e-6}),
        ("autonorm", ("x", "r", "w"), {"eps": 1e-6, "in_place": True}),
    ]
    assert op.liger == ("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    assert op.entry == "add_rms_norm" and not op.has_bias and op.row_streams == 4


def _sum_cases(torch, dtype):
    """Random pairs over a wide range, and pairs whose sum is or nearly is a half-way point."""
    gen = torch.Generator().manual_seed(1)
    decades = 3 if dtype == torch.float16 else 8  # magnitudes 10^-d to 10^d, all finite

    def values():
        scale = 10.0 ** torch.randint(-decades, decades + 1, (4096,), generator=gen)
        return torch.randn(4096, generator=gen, dtype=torch.float64) * scale

    x, r = values(), values()
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}[dtype]
    # 1 + half an ulp (a tie, to even: 1), (1 + ulp) + half an ulp (a tie, to even: 1 + 2 ulp),
    # 1 + a hair over half an ulp (up), and a tiny addend (no change).
    x_ties = torch.tensor([1.0, 1.0 + ulp, 1.0, 1.0, -1.0], dtype=torch.float64)
    r_ties = torch.tensor([ulp / 2, ulp / 2, ulp / 2 + ulp / 64, 2.0**-40, -ulp / 2],
                          dtype=torch.float64)
    return torch.cat([x, x_ties]).to(dtype), torch.cat([r, r_ties]).to(dtype)


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32"])
def test_the_reference_sum_is_autonorms_correctly_rounded_sum(name):
    torch = pytest.importorskip("torch")
    from autonorm.numerics import from_float64

    dtype = torch_dtype(name)
    x, r = _sum_cases(torch, dtype)
    h = ops.rounded_sum(x, r)
    assert h.dtype == dtype
    exact = x.double().numpy() + r.double().numpy()
    if name == "bf16":
        expected = from_float64(exact, "bfloat16")
        np.testing.assert_array_equal(h.view(torch.int16).numpy().view(np.uint16), expected)
    else:
        from autonorm.api_add import rounded_sum

        expected = rounded_sum(x.numpy(), r.numpy())
        np.testing.assert_array_equal(h.numpy(), expected)
        np.testing.assert_array_equal(h.numpy(), from_float64(exact, str(x.numpy().dtype)))
    ulp = {"bf16": 2.0**-7, "fp16": 2.0**-10, "fp32": 2.0**-23}[name]
    tail = h[-5:].double().tolist()
    assert tail == [1.0, 1.0 + 2 * ulp, 1.0 + ulp, 1.0, -1.0], tail


def test_the_reference_is_autonorms_add_rms_norm_in_float64(monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    import autonorm

    # Without CuPy the reference is the same formula in torch (CPU tensors have no CuPy view).
    monkeypatch.setitem(sys.modules, "cupy", None)

    op = ops.OPS["add_rms_norm"]
    shape = shapes.Shape("sweep", "fp16", 256, 8, "add_rms_norm")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 256, generator=gen).half()
    r = (4.0 * torch.randn(8, 256, generator=gen)).half()
    w = (1.0 + 0.1 * torch.randn(256, generator=gen)).half()
    y_ref, h_ref = op.reference(F, shape, x, w, None, 1e-5, r)
    assert y_ref.dtype == h_ref.dtype == torch.float64
    y_an, h_an = autonorm.add_rms_norm(x.numpy(), r.numpy(), w.numpy(), 1e-5)
    np.testing.assert_array_equal(h_ref.numpy(), h_an.astype(np.float64))
    # autonorm's NumPy path is the float64 reference rounded once to fp16: within half an
    # ulp, relative for normal numbers, absolute (2^-25) for subnormal ones.
    np.testing.assert_allclose(y_an.astype(np.float64), y_ref.numpy(), rtol=2.0**-11,
                               atol=2.0**-25)
    # The eager and compiled forms return (y, h) in x's dtype, within the tolerance.
    for y, h in (op.eager(F, shape, x, w, None, 1e-5, r)(),
                 op.compiled(F)(x, w, None, 1e-5, r)):
        assert y.dtype == h.dtype == torch.float16
        assert torch.equal(h.double(), h_ref)
        assert float((y.double() - y_ref).norm() / y_ref.norm()) < constants.TOL["fp16"]


def test_check_outputs_flags_a_wrong_h_and_reports_an_inexact_one():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(2)
    h_ref = torch.randn(4, 64, generator=gen).double()  # a sum rounded to fp32, as the check's
    y_ref = h_ref / h_ref.pow(2).mean(-1, keepdim=True).sqrt()
    refs = (y_ref, h_ref)
    norms = tuple(t.norm() for t in refs)
    shape = shapes.Shape("sweep", "fp32", 64, 4, "add_rms_norm")

    def checked(y, h):
        rec = shapes.new_record(shape, "eager")
        checks.check_outputs(rec, (y.float(), h.float()), refs, norms)
        return rec

    good = checked(y_ref, h_ref)
    assert good["status"] == "ok" and good["h_max_abs_err"] == 0.0
    assert good["h_rel_err"] < 1e-7 and good["out_dtype"] == "float32"
    nudged = h_ref.clone()
    nudged[1, 3] += 1e-3  # within the tolerance, but no longer the rounded sum
    off = checked(y_ref, nudged)
    assert off["status"] == "ok" and off["h_max_abs_err"] == pytest.approx(1e-3, rel=1e-3)
    wrong = checked(y_ref, -h_ref)  # y right, h wrong: the record is WRONG all the same
    assert wrong["status"] == "WRONG" and wrong["h_rel_err"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="1 outputs, expected 2"):
        checks.check_outputs(shapes.new_record(shape, "eager"), y_ref, refs, norms)


@pytest.fixture
def on_the_cpu(monkeypatch):
    """peers with CPU tensors and no CUDA: the torch reference, no synchronizing."""
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(constants, "DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return torch


def _run_one_shape(suite: str, names: list[str]):
    """Measure one fused-add shape on the CPU; return its records by impl and the inputs
    ``Impls.make`` was given (x, w, r) per impl."""
    impls = Impls(names, "none", "add_rms_norm")
    assert impls.unavailable == {}
    given = {}
    make = impls.make

    def spy(impl, shape, x, w, b, eps, r=None):
        given[impl] = (x.clone(), w, r.clone())
        return make(impl, shape, x, w, b, eps, r)

    impls.make = spy
    shape = shapes.Shape(suite, "bf16", 512, 32, "add_rms_norm")
    records = measurement.run_shape(shape, impls, names, seed=7, log=lambda line: None)
    return {r["impl"]: r for r in records}, records, given


def test_one_shape_runs_with_h_exact_and_the_in_place_form_on_inputs_put_back(
    on_the_cpu, monkeypatch
):
    torch = on_the_cpu
    calls = []

    def fake_flushed_ms(fn, flush, restore=None):
        calls.append((flush, restore is not None))
        for _ in range(20):
            if restore is not None:
                restore()
            out = fn()
        if restore is not None:  # the in-place form's last launch, on inputs put back
            ys.append(out)
        return 1.0, 0.9, 1.1

    ys = []
    monkeypatch.setattr(measurement, "flushed_ms", fake_flushed_ms)
    names = ["autonorm-inplace", "autonorm", "eager"]  # in place first: the others come after
    with torch.no_grad():
        by, records, given = _run_one_shape("llm", names)
    assert set(by) == set(names)
    assert calls == [("read", True), ("zero", True)] + [("read", False), ("zero", False)] * 2
    for name, r in by.items():
        # Checked on fresh inputs: an in-place form checked after its probe launch, or a
        # peer reading inputs the in-place form had overwritten, would be WRONG here.
        assert r["status"] == "ok", (name, r["error"], r["rel_err"], r["h_rel_err"])
        assert r["h_max_abs_err"] == 0.0 and r["rel_err"] < constants.TOL["bf16"], r
        assert r["bytes"] == 4 * 32 * 512 * 2 + 512 * 2 and r["ms"] == 1.0
        assert "restore" not in r and "finite_after_timing" not in r
        assert torch.equal(given[name][0], given["autonorm-inplace"][0])
    assert by["autonorm"]["path"] == "torch" and by["autonorm-inplace"]["path"] == "torch"
    # The in-place form's last launch in each timing gave what the functional form gives on
    # the checked inputs.
    import autonorm.torch as an_torch

    x, w, r = given["autonorm"]
    y_once, h_once = an_torch.add_rms_norm(x, r, w, constants.EPS)
    assert len(ys) == 2
    for y, h in ys:
        assert torch.equal(y, y_once) and torch.equal(h, h_once)
    lines = summary.residual_lines(records)
    assert lines == ["h = x + residual: largest |h - the float64 sum rounded to the dtype| over "
                     "the shapes: autonorm 0 (1/1 shapes exact); autonorm-inplace 0 (1/1 shapes "
                     "exact); eager 0 (1/1 shapes exact)"]


def test_latency_puts_the_in_place_inputs_back_and_says_how_far_they_grew(
    on_the_cpu, monkeypatch
):
    torch = on_the_cpu
    import autonorm.torch as an_torch

    def back_to_back(fn, *args, **kwargs):
        for _ in range(40):
            fn()
        return 1e-3, None, None

    monkeypatch.setattr(measurement, "bench_ms", back_to_back)
    monkeypatch.setattr(measurement, "graph_ms", back_to_back)
    monkeypatch.setattr(measurement, "host_us", lambda fn: back_to_back(fn)[0] * 1e3)
    with torch.no_grad():
        by, records, given = _run_one_shape("latency", ["autonorm-inplace", "eager"])
    grown = by["autonorm-inplace"]
    assert grown["status"] == by["eager"]["status"] == "ok"
    assert grown["ms"] == 1e-3 and grown["graph_us"] == 1.0 and grown["host_us"] == 1.0
    # Each measurement starts from the checked inputs and makes 40 launches, then one more to
    # look: the largest value is that of 41 launches from the start, not of 3 x 41.
    x, w, r = given["autonorm-inplace"]
    peaks = []
    for _ in range(3 * 41):
        an_torch.add_rms_norm(x, r, w, constants.EPS, in_place=True)
        peaks.append(max(float(x.abs().max()), float(r.abs().max())))
    assert grown["max_abs_after_timing"] == peaks[40] and grown["finite_after_timing"] is True
    assert peaks[-1] > 2 * peaks[40]  # without putting them back it would have kept growing
    assert "finite_after_timing" not in by["eager"]
    assert "max |x|, |r| after timing" in measurement.progress_line(grown)
    assert "finite at every shape" in summary.residual_lines(records)[1]


def test_largest_magnitude_says_inf_for_nan_and_inf():
    torch = pytest.importorskip("torch")
    a = torch.tensor([1.0, -3.0])
    assert checks.largest_magnitude((a, a * 2)) == 6.0
    for bad in (float("nan"), float("inf")):
        assert checks.largest_magnitude((a, torch.tensor([bad, 1.0]))) == float("inf")


def test_without_autonorm_only_the_forms_asked_for_are_unavailable(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "autonorm", None)  # import autonorm fails
    impls = Impls(["autonorm-inplace", "eager"], "none", "add_rms_norm")
    assert set(impls.unavailable) == {"autonorm-inplace"}
    assert "autonorm" in impls.unavailable["autonorm-inplace"]
    shape = shapes.Shape("llm", "fp32", 64, 2, "add_rms_norm")
    with pytest.raises(Unavailable):
        impls.make("autonorm-inplace", shape, None, None, None, 1e-5, None)
