"""benchmarks/template_ab.py without a GPU: its variants, the rendering in each checkout, its cells.

Compiling, verifying and timing need a GPU; which source each checkout renders, and what the
table says of the times, are checked here (a checkout is a copy of this one's autonorm/ with
one template edited).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import peerbench.gpu  # noqa: E402
import template_ab  # noqa: E402

from autonorm.ops import registry  # noqa: E402
from autonorm.runtime.limits import H200  # noqa: E402

TEMPLATE = Path("autonorm/ops/norm_backward/templates/norm_bwd.cu.j2")


@pytest.fixture(scope="module")
def edited(tmp_path_factory) -> Path:
    """A checkout whose backward template computes the row's rstd with an extra comment line."""
    root = tmp_path_factory.mktemp("edited")
    shutil.copytree(REPO / "autonorm", root / "autonorm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = root / TEMPLATE
    text = path.read_text()
    anchor = "    const float rstd = 1.0f / sqrtf(var + eps);\n"
    assert anchor in text
    path.write_text(text.replace(anchor, "    // edited\n" + anchor))
    return root


def _request(op: str, hidden: int, rows: int):
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype="bfloat16")
    config = family.default(problem, H200, rows)
    return family, problem, config


def test_each_checkout_renders_its_own_source_with_the_same_launch(edited):
    family, problem, config = _request("layer_norm_backward", 4096, 4096)
    mine = family.render(config, problem, H200)
    args = ("layer_norm_backward", dataclasses.asdict(problem), [config.to_dict()],
            dataclasses.asdict(H200))
    (here,) = template_ab.render_in(REPO, *args)
    (there,) = template_ab.render_in(edited, *args)
    assert here["source"] == mine.source and here["name"] == mine.name
    assert there["source"] != mine.source and "// edited" in there["source"]
    assert here["launch"] == there["launch"] == dataclasses.asdict(mine.launch)


def test_a_configuration_a_checkout_refuses_comes_back_as_an_error():
    family, problem, config = _request("layer_norm", 4096, 4096)
    broken = {**config.to_dict(), "threads": 3}
    (reply,) = template_ab.render_in(REPO, "layer_norm", dataclasses.asdict(problem), [broken],
                                     dataclasses.asdict(H200))
    assert set(reply) == {"error"}


def test_a_checkout_that_fails_to_import_says_so(tmp_path):
    (tmp_path / "autonorm").mkdir()
    (tmp_path / "autonorm" / "__init__.py").write_text("raise ImportError('half a checkout')\n")
    with pytest.raises(RuntimeError, match="half a checkout"):
        template_ab.render_in(tmp_path, "layer_norm", {"hidden": 1024, "dtype": "float32"}, [],
                              dataclasses.asdict(H200))


def test_variants_are_named_checkouts_two_or_more(tmp_path, capsys):
    args = template_ab.parse_args(["--variant", f"a={REPO}", "--variant", "b=."])
    assert list(args.variants) == ["a", "b"]
    for bad, says in ((["--variant", f"a={REPO}"], "two --variant"),
                      (["--variant", f"a={REPO}", "--variant", f"a={REPO}"], "given twice"),
                      (["--variant", f"a={REPO}", "--variant", str(REPO)], "NAME=DIR"),
                      (["--variant", f"a={REPO}", "--variant", f"b={tmp_path}"], "no autonorm/"),
                      (["--variant", f"a={REPO}", "--variant", "b=.", "--rounds", "0"],
                       "--rounds")):
        with pytest.raises(SystemExit):
            template_ab.parse_args(bad)
        assert says in capsys.readouterr().err


def test_cells_give_the_baselines_time_and_the_others_speed_over_it():
    cells = template_ab.speed_cells({"before": 10.0, "after": 8.0, "other": None},
                                    {"before": "ok", "after": "ok", "other": "verification"})
    assert cells == ["10.00", "8.00 (x1.250)", "verification"]
    cells = template_ab.speed_cells({"before": None, "after": 8.0},
                                    {"before": "other plan", "after": "ok"})
    assert cells == ["other plan", "8.00"]


class _Device:
    def limits(self):
        return H200


class _Pool:
    def close(self):
        pass


class _Evaluator:
    """The evaluator's contract as the benchmark uses it: a kernel's time is its source's length
    (in ns), and a source holding ``// broken`` fails verification."""

    def __init__(self, problem, rows, *, pool, render):
        self.render = render

    def prepare(self, keys):
        for key in keys:
            self.render(key)

    def evaluate(self, key):
        from autonorm.results import Outcome

        broken = "// broken" in self.render(key).source
        return Outcome("verification" if broken else "ok")

    def retime(self, keys, rounds):
        from autonorm.results import Timing

        times = [len(self.render(key).source) / 1000 for key in keys]
        return [Timing(us, us, us, 0.0, 1.0, 0.5, rounds) for us in times]


def test_main_times_each_variant_against_the_first(edited, tmp_path, monkeypatch, capsys):
    import autonorm.runtime.compiler
    import autonorm.runtime.device
    import autonorm.tune.evaluator

    broken = tmp_path / "broken"
    shutil.copytree(edited, broken)
    path = broken / TEMPLATE
    path.write_text(path.read_text().replace("// edited", "// broken"))
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda: _Device())
    monkeypatch.setattr(peerbench.gpu, "missing", lambda **_: None)
    monkeypatch.setattr(autonorm.runtime.compiler, "CompilePool", _Pool)
    monkeypatch.setattr(autonorm.tune.evaluator, "GpuEvaluator", _Evaluator)
    assert template_ab.main(["--variant", f"before={REPO}", "--variant", f"after={edited}",
                             "--variant", f"broken={broken}", "--op", "layer_norm_backward",
                             "--dtypes", "bf16", "--hidden", "2048,4096", "--rows", "64",
                             "--out", str(tmp_path / "out")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| layer")]
    assert len(lines) == 2
    family = registry.get("layer_norm_backward")
    for line, hidden in zip(lines, (2048, 4096), strict=True):
        problem = family.problem(hidden=hidden, dtype="bfloat16")
        config = family.default(problem, H200, 64)
        before = len(family.render(config, problem, H200).source) / 1000
        after = before + len("    // edited\n") / 1000
        assert line.split(" | ")[4] == config.label()
        assert line.endswith(f"| {before:.2f} | {after:.2f} (x{before / after:.3f}) "
                             "| verification |")
    records = json.loads((tmp_path / "out" / "template_ab.json").read_text())
    assert [r["variants"]["broken"]["status"] for r in records] == ["verification"] * 2
    assert all(r["variants"]["after"]["us"] > r["variants"]["before"]["us"] for r in records)
