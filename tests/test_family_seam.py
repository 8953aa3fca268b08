"""A second kernel family, defined in this file alone, served by every generic layer.

The toy family scales a row by a constant (``y = a * x``). It registers itself, is tuned with a
fake evaluator (the search, the trial records and the store of ``tune_and_store``), looked up
(``autonorm.lookup``, as dispatch does), exported as standalone CUDA (compiled by nvcc where
nvcc exists) and shown by the CLI, without a line of the package written for it. CPU only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from autonorm import cli, lookup
from autonorm.codegen.environment import environment, kernel_digest
from autonorm.codegen.kernel import LaunchPlan, RenderedKernel
from autonorm.errors import ConfigError
from autonorm.export.tuned import export_tuned
from autonorm.ops import registry
from autonorm.ops.base import rows_bucket
from autonorm.results import Outcome, Timing
from autonorm.runtime.device import DeviceInfo
from autonorm.runtime.limits import H200, DeviceLimits
from autonorm.store.db import TuningDB, TuningKey
from autonorm.tune.search import TuneSettings
from autonorm.tune.session import tune_and_store

pytestmark = pytest.mark.usefixtures("quiet_optuna")

TEMPLATES = Path(__file__).resolve().parent / "toy_scale"
THREADS = (64, 128, 256, 512)
VECS = (1, 2, 4)

DEVICE = DeviceInfo(
    name=H200.name, cc=H200.cc, sm_count=H200.sm_count, l2_bytes=H200.l2_bytes,
    smem_optin=H200.max_smem_optin, mem_bus_bits=6144, mem_clock_khz=3201000,
)


@dataclass(frozen=True)
class ScaleProblem:
    """Rows of ``hidden`` fp32 elements, each multiplied by a scalar."""

    hidden: int
    dtype: str = "float32"

    op: ClassVar[str] = "toy_scale"

    def fields(self) -> dict[str, Any]:
        return {"hidden": self.hidden, "dtype": self.dtype}

    def describe(self) -> str:
        return f"{self.dtype} hidden {self.hidden}"


@dataclass(frozen=True)
class ScaleConfig:
    """Threads per block and elements per thread and step."""

    threads: int = 128
    vec: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def label(self) -> str:
        return f"t{self.threads}v{self.vec}"


class ScaleFamily:
    """The whole family: problem, config, space rules, templates and launch plan."""

    op = "toy_scale"
    template_dir = TEMPLATES

    def problem(self, **fields: Any) -> ScaleProblem:
        return ScaleProblem(**fields)

    def config_from_dict(self, data: dict[str, Any]) -> ScaleConfig:
        return ScaleConfig(**{k: v for k, v in data.items() if k in ("threads", "vec")})

    def suggest(self, trial: Any) -> ScaleConfig:
        return ScaleConfig(trial.suggest_categorical("threads", THREADS),
                           trial.suggest_categorical("vec", VECS))

    def check(self, config: ScaleConfig, problem: ScaleProblem, device: DeviceLimits) -> list:
        reasons = []
        if config.threads not in THREADS:
            reasons.append(f"threads must be one of {THREADS}")
        if config.vec not in VECS or problem.hidden % config.vec:
            reasons.append(f"vec must be one of {VECS} and divide the hidden size")
        return reasons

    def space(self, problem: ScaleProblem, device: DeviceLimits) -> list[ScaleConfig]:
        every = (ScaleConfig(t, v) for t in THREADS for v in VECS)
        return [c for c in every if not self.check(c, problem, device)]

    def default(self, problem: ScaleProblem, device: DeviceLimits, rows=None) -> ScaleConfig:
        return ScaleConfig()

    def seeds(self, problem, device, rows=None) -> list[ScaleConfig]:
        return [self.default(problem, device)]

    def render(self, config, problem, device) -> RenderedKernel:
        reasons = self.check(config, problem, device)
        if reasons:
            raise ConfigError("; ".join(reasons))
        text = repr((sorted(config.to_dict().items()), problem.fields()))
        name = "toy_scale_" + hashlib.sha256(text.encode()).hexdigest()[:12]
        source = environment(self.template_dir).get_template("scale.cu.j2").render(
            name=name, label=config.label(), hidden=problem.hidden, dtype=problem.dtype,
            threads=config.threads, vec=config.vec)
        plan = LaunchPlan(threads=config.threads, smem_bytes=0, cluster=1, rows_per_block=1,
                          blocks_per_sm=0)
        return RenderedKernel(name, source, config, problem, plan)

    def code_version(self) -> str:
        return "toy-1"

    def bytes_moved(self, problem: ScaleProblem, rows: int) -> int:
        return 2 * rows * problem.hidden * 4


def fake_timing(config: ScaleConfig) -> Timing:
    """A deterministic 'time': 256 threads and 4-element vectors are fastest."""
    us = 10.0 + abs(math.log2(config.threads) - 8) + 1.5 * abs(math.log2(config.vec) - 2)
    gbps = 2 * 1024 * 4096 * 4 / (us * 1e-6) / 1e9
    return Timing(median_us=us, p20_us=us, p80_us=us, cv=0.001, gbps=gbps, share=gbps / 4000,
                  samples=10)


class FakeScaleEvaluator:
    """The evaluator contract without a GPU: every candidate verifies; v1 at 64 fails."""

    def __init__(self) -> None:
        self.seen: list[ScaleConfig] = []

    def prepare(self, configs) -> None:
        pass

    def evaluate(self, config: ScaleConfig) -> Outcome:
        self.seen.append(config)
        if config == ScaleConfig(64, 1):
            return Outcome("verification", error="rel_l2 1e-1 (tol 2e-6)", max_rel_err=0.1)
        return Outcome("ok", timing=fake_timing(config), max_rel_err=1e-7)

    def retime(self, configs, rounds):
        return [fake_timing(c) for c in configs]

    def close(self) -> None:
        pass


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy family registered, a fresh user DB and no shipped DB."""
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    family = registry.register(ScaleFamily())
    yield family
    registry.unregister(family.op)


def test_the_registry_serves_the_toy_family(toy):
    assert registry.get("toy_scale") is toy
    assert "toy_scale" in registry.known()
    assert registry.family_of(ScaleProblem(4096)) is toy


def test_tune_store_look_up_and_export_a_toy_family(toy, tmp_path):
    problem = ScaleProblem(4096)
    evaluator = FakeScaleEvaluator()
    result = tune_and_store(
        problem, 1024, settings=TuneSettings(n_trials=12, batch=4, finals_top=3,
                                             finals_rounds=2),
        device=DEVICE, evaluator_factory=lambda p, r: evaluator, quiet=True)

    # The search ran through the family's space and rules, and found the fake optimum.
    assert evaluator.seen, "the evaluator was never asked"
    assert all(isinstance(c, ScaleConfig) for c in evaluator.seen)
    assert result.config == ScaleConfig(256, 4)
    assert result.kernel == kernel_digest(toy.render(result.config, problem, H200).source)
    assert result.failures.get("verification", 0) == (ScaleConfig(64, 1) in evaluator.seen)

    # Stored under its own op, problem and rows bucket, with every trial recorded.
    key = TuningKey.for_problem(DEVICE.fingerprint, problem, 1024)
    assert key.op == "toy_scale" and key.rows_bucket == rows_bucket(1024)
    with TuningDB.open_user() as store:
        winner = store.get_winner(key)
        trials = store.trials(key)
        assert winner is not None and winner.config == {"threads": 256, "vec": 4}
        assert winner.kernel == result.kernel
        assert {t["label"] for t in trials} >= {"t256v4"}

        # The lookup dispatch and export share finds it, exactly and from a nearby bucket.
        device = lookup.Device(DEVICE.fingerprint, DEVICE.limits())
        exact = lookup.choose(problem, 1000, device, [store])
        assert (exact.config, exact.source) == (ScaleConfig(256, 4), "user")
        near = lookup.choose(problem, 64, device, [store])
        assert (near.config, near.source) == (ScaleConfig(256, 4), "user-nearest")
        # Another problem of the family gets the family's default.
        other = lookup.choose(ScaleProblem(1000), 1024, device, [store])
        assert (other.config, other.source) == (ScaleConfig(), "default")

    # Exported as standalone CUDA: the kernel and a manifest naming op, problem and config.
    paths = export_tuned(problem, tmp_path / "out", rows=1024)
    names = sorted(p.name for p in paths)
    assert names == ["autonorm_toy_scale_fp32_h4096.cu", "autonorm_toy_scale_fp32_h4096.json"]
    manifest = json.loads((tmp_path / "out" / "autonorm_toy_scale_fp32_h4096.json").read_text())
    assert manifest["problem"] == {"hidden": 4096, "dtype": "float32"}
    assert manifest["config"] == {"threads": 256, "vec": 4}
    assert manifest["source"] == "user"
    source = (tmp_path / "out" / "autonorm_toy_scale_fp32_h4096.cu").read_text()
    assert "__launch_bounds__(256)" in source and "constexpr int V = 4;" in source
    nvcc = shutil.which("nvcc")
    if nvcc:
        done = subprocess.run([nvcc, "-arch=sm_90", "-c", "-o", str(tmp_path / "toy.o"),
                               str(tmp_path / "out" / "autonorm_toy_scale_fp32_h4096.cu")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_the_cli_shows_and_renders_the_toy_family(toy):
    problem = ScaleProblem(2048)
    tune_and_store(problem, 64, settings=TuneSettings(n_trials=4, batch=4, finals_top=0),
                   device=DEVICE, evaluator_factory=lambda p, r: FakeScaleEvaluator(),
                   quiet=True)
    runner = CliRunner()
    shown = runner.invoke(cli.main, ["show", "--json"])
    assert shown.exit_code == 0, shown.output
    rows = [r for r in json.loads(shown.output) if r.get("op") == "toy_scale"]
    assert len(rows) == 1 and rows[0]["hidden"] == 2048
    rendered = runner.invoke(cli.main, ["render", "--op", "toy_scale", "--hidden", "2048",
                                        "--config", '{"threads": 512, "vec": 2}'])
    assert rendered.exit_code == 0, rendered.output
    assert "__launch_bounds__(512)" in rendered.output
