"""benchmarks/backward.py without a GPU: its command line, its table rows and Liger's absence.

The timing needs a CUDA GPU; what the table says about the figures (the best peer, the speed,
a missing peer) is plain Python, checked here on synthetic GB/s.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "backward.py"

# benchmarks/ is not a package, and "backward" is too plain a name to put on sys.path.
_spec = importlib.util.spec_from_file_location("bench_backward", SCRIPT)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

COPY = 4000.0


def _cells(line: str) -> list[str]:
    assert line.startswith("| ") and line.endswith(" |"), line
    return line[2:-2].split(" | ")


def _row(ours: float, **peers: float | None) -> dict[str, str]:
    header = _cells(bench.table_header()[0])
    cells = _cells(bench.format_row("layer_norm", "bf16", 4096, COPY, ours, peers))
    assert len(cells) == len(header)
    return dict(zip(header, cells, strict=True))


def test_the_header_has_a_column_per_peer_and_a_matching_rule():
    head, rule = bench.table_header()
    header = _cells(head)
    assert header[:5] == ["op", "dtype", "hidden", "autonorm GB/s", "% copy"]
    assert header[5:8] == ["eager GB/s", "compile GB/s", "liger GB/s"]
    assert header[8:] == ["best % copy", "speed"]
    assert rule == "|" + "---|" * len(header)


@pytest.mark.parametrize("winner", ["eager", "compile", "liger"])
def test_the_best_is_the_fastest_peer_whichever_it_is(winner):
    peers = {"eager": 1000.0, "compile": 1500.0, "liger": 1200.0}
    peers[winner] = 2000.0
    row = _row(3000.0, **peers)
    assert row["best % copy"] == "50.0"  # 2000 / 4000
    assert row["speed"] == "1.50x"  # 3000 / 2000
    assert row["autonorm GB/s"] == "3000" and row["% copy"] == "75.0"
    assert [row[f"{p} GB/s"] for p in ("eager", "compile", "liger")] == [
        f"{peers[p]:.0f}" for p in ("eager", "compile", "liger")]


def test_a_missing_liger_shows_a_dash_and_is_left_out_of_the_best():
    absent = _row(1800.0, eager=1000.0, compile=1200.0)
    none = _row(1800.0, eager=1000.0, compile=1200.0, liger=None)
    assert absent == none
    assert none["liger GB/s"] == "-"
    assert none["best % copy"] == "30.0"  # compile's 1200, not a Liger figure
    assert none["speed"] == "1.50x"


def test_a_faster_liger_sets_the_best_and_lowers_the_speed():
    with_liger = _row(1800.0, eager=1000.0, compile=1200.0, liger=2400.0)
    assert with_liger["best % copy"] == "60.0"
    assert with_liger["speed"] == "0.75x"


def test_a_non_positive_figure_counts_as_not_measured():
    # A compile or Liger time from a difference of two timings can come out <= 0 (noise).
    row = _row(1000.0, eager=500.0, compile=0.0, liger=-3.0)
    assert row["compile GB/s"] == row["liger GB/s"] == "-"
    assert row["speed"] == "2.00x"
    assert bench.best_peer({"eager": 500.0, "compile": 0.0, "liger": -3.0}) == 500.0


def test_no_peer_at_all_leaves_best_and_speed_blank():
    row = _row(1000.0)
    assert [row[c] for c in ("eager GB/s", "compile GB/s", "liger GB/s")] == ["-"] * 3
    assert row["best % copy"] == row["speed"] == "-"
    assert row["autonorm GB/s"] == "1000"
    assert bench.best_peer({}) is None


def test_best_peer_ignores_names_that_are_not_peers():
    assert bench.best_peer({"eager": 10.0, "autonorm": 99.0}) == 10.0


def test_liger_counts_as_absent_when_it_does_not_import(monkeypatch, capsys):
    for name in ("liger_kernel", "liger_kernel.ops", "liger_kernel.ops.layer_norm",
                 "liger_kernel.ops.rms_norm"):
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: import fails
    assert bench.liger_functions() is None
    assert "Liger-Kernel not used" in capsys.readouterr().err
    assert bench._liger_norms(None) == {"layer_norm": None, "rms_norm": None}


def test_liger_forwards_pass_its_default_arguments():
    calls = []

    class Fake:
        @staticmethod
        def apply(*args):
            calls.append(args)
            return "y"

    norms = bench._liger_norms((Fake, Fake))
    assert norms["layer_norm"]("x", "w", "b") == "y"
    assert norms["rms_norm"]("x", "w", "b") == "y"
    assert calls == [("x", "w", "b", 1e-5), ("x", "w", 1e-6, 0.0, "llama", True)]


def test_parse_args_defaults_and_overrides():
    args = bench.parse_args([])
    assert args.hidden == "1024,4096,16384,65536" and args.dtypes == "bf16,fp32"
    assert args.elements == 1 << 26
    args = bench.parse_args(["--hidden", "768", "--dtypes", "fp16", "--elements", "4096"])
    assert (args.hidden, args.dtypes, args.elements) == ("768", "fp16", 4096)


def test_help_parses_and_names_every_peer():
    # Wide enough that argparse does not break "Liger-Kernel" at its hyphen.
    env = {**os.environ, "COLUMNS": "200"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: backward.py")
    for word in ("--hidden", "--dtypes", "--elements", "torch.compile", "Liger-Kernel"):
        assert word in run.stdout, word


def in_place_norm(torch, record):  # noqa: ANN001, ANN201
    """``y = x * w + b`` whose backward writes dx over the gradient, as Liger's RMSNorm does;
    each backward passes the gradients it is asked for (``needs_input_grad``) to ``record``."""

    class InPlace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):  # noqa: ANN001, ANN205
            ctx.save_for_backward(x, w)
            return x * w + b

        @staticmethod
        def backward(ctx, dy):  # noqa: ANN001, ANN205
            x, w = ctx.saved_tensors
            record(ctx.needs_input_grad)
            dw, db = (dy * x).sum(0), dy.sum(0)
            return dy.mul_(w), dw, db

    return InPlace.apply


def test_backward_time_is_both_less_forward_with_every_gradient_and_dy_untouched():
    torch = pytest.importorskip("torch")

    seen, timed = [], []
    in_place = in_place_norm(torch, seen.append)

    def do_bench(fn, rep):  # noqa: ANN001, ANN202
        fn()
        timed.append(fn.__name__)
        return {"both": 5.0, "forward": 2.0}[fn.__name__]

    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    w, b = torch.randn(8), torch.randn(8)
    before = dy.clone()
    assert bench._backward_ms(in_place, x, dy, w, b, do_bench) == 3.0
    assert timed == ["both", "forward"]
    # Every input's gradient asked for, so the column sums are part of what is timed.
    assert seen and all(needs == (True, True, True) for needs in seen)
    assert torch.equal(dy, before)
    assert not (x.requires_grad or w.requires_grad or b.requires_grad)


def test_mode_defaults_to_backward_and_takes_training():
    assert bench.parse_args([]).mode == "backward"
    assert bench.parse_args(["--mode", "training"]).mode == "training"
    assert bench.parse_args(["--mode", "backward", "--hidden", "512"]).mode == "backward"


def test_an_unknown_mode_is_an_argparse_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--mode", "forward"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --mode" in err and "invalid choice: 'forward'" in err


def test_help_names_the_modes():
    env = {**os.environ, "COLUMNS": "200"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr
    assert "--mode {backward,training}" in run.stdout


def test_the_title_names_the_mode():
    backward, training = bench.mode_title("backward"), bench.mode_title("training")
    assert backward.startswith("mode backward:") and training.startswith("mode training:")
    assert "forward + backward" in training and "forward" not in backward
    with pytest.raises(ValueError, match="mode"):
        bench.mode_title("inference")


@pytest.mark.parametrize(("op", "backward", "training"), [
    # backward: x, dy read and dx written (3 rows), the weight read, a column sum per parameter;
    # training adds the forward's x read and y written (2 rows) and each parameter read.
    ("layer_norm", 3 * 8 + 1 + 2, 3 * 8 + 1 + 2 + 2 * 8 + 2),
    ("rms_norm", 3 * 8 + 1 + 1, 3 * 8 + 1 + 1 + 2 * 8 + 1),
])
def test_bytes_counted_per_mode(op, backward, training):
    assert bench.norm_bytes("backward", op, 8, 16, 2) == backward * 16 * 2
    assert bench.norm_bytes("training", op, 8, 16, 2) == training * 16 * 2
    assert bench.norm_bytes("training", op, 8, 16, 4) == 2 * bench.norm_bytes("training", op, 8,
                                                                                16, 2)


def test_bytes_for_an_unknown_mode_raise():
    with pytest.raises(ValueError, match="mode"):
        bench.norm_bytes("forward", "rms_norm", 8, 16, 2)


def test_training_time_is_one_timed_step_with_fresh_gradients_and_dy_untouched():
    torch = pytest.importorskip("torch")
    calls = []
    in_place = in_place_norm(torch, lambda needs: calls.append(("backward", needs)))

    def norm(x, w, b):  # noqa: ANN001, ANN202
        # The gradients each step starts from: None where the previous step cleared them.
        calls.append(("forward", (x.grad, w.grad, b.grad), torch.is_grad_enabled()))
        leaves.append((x, w, b))
        return in_place(x, w, b)

    leaves, timed = [], []

    def do_bench(fn, rep):  # noqa: ANN001, ANN202
        timed.append((fn.__name__, rep))
        fn()
        return 7.5

    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    w, b = torch.randn(8), torch.randn(8)
    before = dy.clone()
    assert bench._training_ms(norm, x, dy, w, b, do_bench) == 7.5
    # One timed call of the whole step (a warm-up before it), no forward subtracted.
    assert timed == [("both", 200)]
    assert [c[0] for c in calls] == ["forward", "backward", "forward", "backward"]
    for forward, backward in (calls[0:2], calls[2:4]):
        assert forward[1] == (None, None, None) and forward[2]
        assert backward[1] == (True, True, True)
    # Same leaves each step, every gradient cleared after it rather than accumulated.
    assert all(a is c for a, c in zip(*leaves, strict=True))
    assert all(t.requires_grad and t.is_leaf and t.grad is None for t in leaves[1])
    assert torch.equal(dy, before)
    assert not (x.requires_grad or w.requires_grad or b.requires_grad)


def test_training_times_every_implementation_and_leaves_out_an_absent_liger():
    torch = pytest.importorskip("torch")
    last = []

    def fake(name):  # noqa: ANN001, ANN202
        def norm(x, w, b):  # noqa: ANN001, ANN202
            last.append(name)
            return x * w + b
        return norm

    speeds = {"autonorm": 1.0, "eager": 2.0, "compile": 3.0, "liger": 4.0}

    def do_bench(fn, rep):  # noqa: ANN001, ANN202
        fn()
        return speeds[last[-1]]

    x, dy, w, b = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8), torch.randn(8)
    norms = {name: fake(name) for name in speeds}
    assert bench._training_peers_ms("layer_norm", norms, x, dy, w, b, do_bench) == speeds
    norms["liger"] = None
    assert bench._training_peers_ms("layer_norm", norms, x, dy, w, b, do_bench) == {
        "autonorm": 1.0, "eager": 2.0, "compile": 3.0}


def test_a_failing_liger_is_not_measured_but_a_failing_autonorm_propagates(capsys):
    torch = pytest.importorskip("torch")

    def ok(x, w, b):  # noqa: ANN001, ANN202
        return x * w

    def broken(x, w, b):  # noqa: ANN001, ANN202
        raise RuntimeError("hidden too large")

    def do_bench(fn, rep):  # noqa: ANN001, ANN202
        fn()
        return 2.0

    x, dy, w, b = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8), torch.randn(8)
    ms = bench._training_peers_ms("rms_norm", {"autonorm": ok, "eager": ok, "liger": broken},
                                  x, dy, w, b, do_bench)
    assert ms == {"autonorm": 2.0, "eager": 2.0, "liger": None}
    assert "Liger rms_norm at (4, 8)" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="hidden too large"):
        bench._training_peers_ms("rms_norm", {"autonorm": broken, "liger": ok}, x, dy, w, b,
                                 do_bench)


def test_the_timer_reports_the_median() -> None:
    # Triton's do_bench reports the mean unless asked for another statistic.
    def modern(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):  # noqa: ANN001, ANN202, ARG001
        return {"mean": 9.0, "median": 2.0}[return_mode]

    def quantiled(fn, warmup=25, rep=100, quantiles=None):  # noqa: ANN001, ANN202, ARG001
        return [3.0] if quantiles == [0.5] else 9.0

    def plain(fn, rep=100):  # noqa: ANN001, ANN202, ARG001
        return 4.0

    assert bench.median_bench(modern)(lambda: None, rep=200) == 2.0
    assert bench.median_bench(quantiled)(lambda: None, rep=200) == 3.0
    assert bench.median_bench(plain)(lambda: None, rep=200) == 4.0
