"""Exports for a kind of GPU (``--arch``) and the compute capability an exported source needs.

``autonorm export --arch sm_XX`` takes the winners of that kind of GPU from the tuning databases
(their devices table records each device's compute capability), else the family's default for
the kind's limits; the manifest and the command line say which compute capability the source
needs. nvcc checks both claims on the CPU: each export compiles for its architecture, and each
kernel compiles for the oldest architecture it claims to need (and not for the one below, where
a feature sets the claim).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from autonorm import cli
from autonorm.codegen.environment import kernel_digest
from autonorm.errors import AutonormError
from autonorm.export import arch, export_from_db, render_export, write_export
from autonorm.fallback import leaner_defaults
from autonorm.ops import registry
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config
from autonorm.runtime import offline
from autonorm.runtime.device import DeviceInfo
from autonorm.runtime.limits import H200 as H200_LIMITS
from autonorm.store.db import TuningDB, TuningKey

H200 = DeviceInfo("NVIDIA H200", 90, 132, 62914560, 232448, 6144, 3201000)
A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", 80, 108, 41943040, 166912, 5120, 1593000)
RTX4090 = DeviceInfo("NVIDIA GeForce RTX 4090", 89, 128, 75497472, 101376, 384, 10501000)
PROBLEM = Problem(16384, "bfloat16")
H200_CONFIG = KernelConfig(256, 8, 1, "registers", "welford", 2, 0)
A100_CONFIG = KernelConfig(512, 8, 1, "registers", "two_pass", 1, 0)


def _nvcc_archs() -> set[int]:
    nvcc = offline.nvcc_path()
    if nvcc is None:
        return set()
    proc = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=False)
    return {int(line.split("_")[1]) for line in proc.stdout.split() if line.startswith("compute_")}


NVCC_ARCHS = _nvcc_archs()


def _compile(source: Path, cc: int) -> subprocess.CompletedProcess:
    """Compile an exported .cu for ``sm_<cc>`` (skip where nvcc lacks that architecture)."""
    if cc not in NVCC_ARCHS:
        pytest.skip(f"nvcc {'is missing' if not NVCC_ARCHS else f'has no sm_{cc}'}")
    return subprocess.run(
        [offline.nvcc_path(), f"-arch=sm_{cc}", "-std=c++17", "-c", source.name, "-o",
         f"{source.stem}_sm{cc}.o"],
        cwd=source.parent, capture_output=True, text=True, check=False,
    )


@pytest.fixture
def dbs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user DB in tmp_path; no shipped DB."""
    path = tmp_path / "user.db"
    monkeypatch.setenv("AUTONORM_DB", str(path))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    return path


def _add_winner(path: Path, device: DeviceInfo, config: KernelConfig) -> None:
    key = TuningKey.for_problem(device.fingerprint, PROBLEM, 1024)
    kernel = FAMILY.render(config, PROBLEM, device.limits()).source
    with TuningDB(path) as db:
        db.record_device(device)
        db.set_winner(key, config.to_dict(), {"median_us": 20.0}, kernel_digest(kernel))


def _manifest(paths: list[Path]) -> dict:
    return json.loads(next(p for p in paths if p.suffix == ".json").read_text())


@pytest.mark.parametrize(("text", "cc"), [("sm_80", 80), ("sm90", 90), ("SM_100", 100),
                                          ("compute_90", 90), ("90", 90), ("8.9", 89),
                                          ("sm_90a", 90), (" sm_120 ", 120)])
def test_parse_arch(text: str, cc: int) -> None:
    assert arch.parse_arch(text) == cc


@pytest.mark.parametrize("text", ["", "sm_", "sm_7", "ampere", "9", "sm_1000", "9.10"])
def test_parse_arch_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a GPU architecture"):
        arch.parse_arch(text)


def test_the_known_kinds_are_the_datasheet_values() -> None:
    assert arch.KNOWN[90] is H200_LIMITS
    assert sorted(arch.KNOWN) == [75, 80, 86, 89, 90, 100, 120]
    a100, b200 = arch.KNOWN[80], arch.KNOWN[100]
    assert (a100.cc, a100.sm_count, a100.max_smem_optin, a100.l2_bytes) == (
        80, 108, 166912, 40 * 2**20)
    assert a100.max_smem_optin == A100.smem_optin  # what an A100 reports
    assert (b200.cc, b200.sm_count, b200.max_smem_optin, b200.l2_bytes) == (
        100, 148, 232448, 126 * 2**20)
    # Turing holds 1024 threads and 64 KB an SM; Ampere's and Ada's smaller parts and consumer
    # Blackwell 1536 threads and 100 KB, a block taking 99 KB of it (as an RTX 4090 reports).
    t4 = arch.KNOWN[75]
    assert (t4.max_threads_per_sm, t4.smem_per_sm, t4.max_smem_optin) == (1024, 65536, 65536)
    for cc in (86, 89, 120):
        kind = arch.KNOWN[cc]
        assert kind.cc == cc
        assert (kind.max_threads_per_sm, kind.smem_per_sm) == (1536, 102400)
        assert kind.max_smem_optin == RTX4090.smem_optin
    for cc, kind in arch.KNOWN.items():
        assert kind.cc == cc and kind.regs_per_sm == 65536


def test_arch_picks_that_kinds_winner(dbs: Path, tmp_path: Path) -> None:
    _add_winner(dbs, A100, A100_CONFIG)
    _add_winner(dbs, H200, H200_CONFIG)
    for cc, config, device in ((80, A100_CONFIG, A100), (90, H200_CONFIG, H200)):
        manifest = _manifest(export_from_db(16384, "bf16", tmp_path / f"sm{cc}", arch=cc))
        assert (manifest["source"], manifest["config"]) == ("user", config.to_dict())
        assert manifest["tuned_for"]["device"] == device.fingerprint
        assert manifest["target"]["arch"] == f"sm_{cc}"
        assert manifest["device_limits"] == dataclasses.asdict(device.limits())


@pytest.mark.parametrize("cc", sorted(set(arch.KNOWN) - {90}))
def test_arch_without_winners_exports_the_default_for_its_limits(
    dbs: Path, tmp_path: Path, cc: int
) -> None:
    _add_winner(dbs, H200, H200_CONFIG)  # another kind's winner: not taken
    limits = arch.KNOWN[cc]
    with pytest.warns(UserWarning, match=f"nothing is tuned .* on any sm_{cc} device"):
        manifest = _manifest(export_from_db(16384, "bf16", tmp_path / "out", arch=cc))
    assert manifest["source"] == "default"
    assert manifest["config"] == default_config(PROBLEM, limits).to_dict()
    assert manifest["device_limits"]["name"] == limits.name
    assert manifest["target"]["arch"] == f"sm_{cc}"
    assert any(limits.name in note["message"] for note in manifest["notes"])


def test_arch_of_a_recorded_device_uses_its_limits(dbs: Path, tmp_path: Path) -> None:
    with TuningDB(dbs) as db:
        db.record_device(RTX4090)
    with pytest.warns(UserWarning, match="nothing is tuned"):
        manifest = _manifest(export_from_db(16384, "bf16", tmp_path / "out", arch=89))
    # The recorded part, not the kind's datasheet one (an L40S).
    assert manifest["device_limits"]["name"] == "NVIDIA GeForce RTX 4090"
    assert manifest["device_limits"]["sm_count"] == RTX4090.sm_count


def test_an_unknown_arch_is_refused(dbs: Path, tmp_path: Path) -> None:
    with pytest.raises(AutonormError, match="knows the limits of sm_75, sm_80, sm_86, sm_89, "
                                            "sm_90, sm_100, sm_120 only"):
        export_from_db(16384, "bf16", tmp_path / "out", arch=87)


def test_the_cli_says_what_the_source_needs(dbs: Path, tmp_path: Path) -> None:
    _add_winner(dbs, H200, H200_CONFIG)
    result = CliRunner().invoke(cli.main, ["export", "--hidden", "16384", "-o",
                                           str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert ("needs a GPU of compute capability 9.0 (sm_90) or newer; made for sm_90 (NVIDIA "
            "H200): compile with nvcc -arch=sm_90") in result.stderr
    result = CliRunner().invoke(cli.main, ["export", "--hidden", "16384", "--arch", "sm_80",
                                           "-o", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    manifest = json.loads(next((tmp_path / "b").glob("*.json")).read_text())
    least = manifest["target"]["min_compute_capability"]
    assert (f"needs a GPU of compute capability {least // 10}.{least % 10} (sm_{least}) or "
            "newer; made for sm_80 (NVIDIA A100): compile with nvcc -arch=sm_80") in result.stderr


# -- nvcc checks the claims ---------------------------------------------------------------------


@pytest.mark.parametrize("cc", sorted(arch.KNOWN))
def test_an_export_for_an_arch_compiles_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cc: int
) -> None:
    """The repo's shipped database (H200 winners) exported for each kind, compiled for it."""
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    with warnings.catch_warnings(record=True):  # the default (other kinds) warns
        warnings.simplefilter("always")
        paths = export_from_db(16384, "bf16", tmp_path / "out", arch=cc)
    manifest = _manifest(paths)
    assert manifest["source"] == ("shipped" if cc == 90 else "default")
    proc = _compile(paths[0], cc)
    assert proc.returncode == 0, proc.stderr[-3000:]


# (configuration, problem, the oldest compute capability it needs, why)
CLAIMS = [
    (KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0), PROBLEM, 75, "plain"),
    (KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0, keep_x=True), PROBLEM, 80,
     "createpolicy"),
    (KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0), PROBLEM, 80, "cp.async fill"),
    (KernelConfig(256, 8, 1, "registers", "welford", 2, 0), PROBLEM, 90, "cluster"),
    (KernelConfig(256, 8, 4, "bulk", "two_pass", 1, 0, 3), Problem(2048, "bfloat16"), 90,
     "bulk copy"),
]


@pytest.mark.parametrize(("config", "problem", "least", "why"), CLAIMS,
                         ids=[c[3] for c in CLAIMS])
def test_a_kernel_compiles_for_the_oldest_arch_it_claims(
    tmp_path: Path, config: KernelConfig, problem: Problem, least: int, why: str
) -> None:
    exported = render_export(config, problem)
    assert exported.manifest["target"] == {"arch": "sm_90", "min_compute_capability": least}
    source = write_export(exported, tmp_path)[0]
    proc = _compile(source, least)
    assert proc.returncode == 0, proc.stderr[-3000:]
    below = {80: 75, 90: 89}.get(least)
    if below is not None and why in ("createpolicy", "bulk copy"):
        # The feature that sets the claim is what an older architecture refuses.
        assert _compile(source, below).returncode != 0


# -- a default that spills on the kind ------------------------------------------------------------


def test_an_export_takes_the_leaner_pick_where_nvcc_spills_the_default(
    dbs: Path, tmp_path: Path
) -> None:
    """16-bit LayerNorm backward of 4096 for sm_80: nvcc 13.0 spills its default (32 bytes)."""
    if 80 not in NVCC_ARCHS:
        pytest.skip("nvcc is missing or has no sm_80")
    backward = registry.get("layer_norm_backward")
    problem = backward.problem(hidden=4096, dtype="bfloat16")
    first = backward.default(problem, arch.KNOWN[80], 16384)
    with pytest.warns(UserWarning, match="nothing is tuned"):
        manifest = _manifest(export_from_db(4096, "bf16", tmp_path / "out", op=problem.op,
                                            rows=16384, arch=80))
    assert manifest["source"] == "default"
    assert manifest["config"] != first.to_dict()
    config = backward.config_from_dict(manifest["config"])
    assert config in list(leaner_defaults(problem, arch.KNOWN[80], 16384, first))
    notes = [note["message"] for note in manifest["notes"]]
    assert any(f"the default {first.label()} spills" in note and "under nvcc for sm_80" in note
               and f"exported {config.label()}" in note for note in notes), notes


def test_without_nvcc_an_export_takes_the_default_as_it_is(
    dbs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offline, "nvcc_path", lambda: None)
    backward = registry.get("layer_norm_backward")
    problem = backward.problem(hidden=4096, dtype="bfloat16")
    with pytest.warns(UserWarning, match="nothing is tuned"):
        manifest = _manifest(export_from_db(4096, "bf16", tmp_path / "out", op=problem.op,
                                            rows=16384, arch=80))
    assert manifest["config"] == backward.default(problem, arch.KNOWN[80], 16384).to_dict()
    assert not any("spills" in note["message"] for note in manifest["notes"])
