"""The benchmark scripts' own no-GPU self-tests, run so that CI catches a broken script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_peers_selftest_renders_both_flushes(tmp_path):
    # peers.py --selftest runs its parsing, shares, tables and JSON on synthetic numbers (no GPU)
    # and asserts on them itself; here it must finish and leave a JSON with both flushes' shares.
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "peers.py"), "--selftest", "--plain",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "selftest ok" in run.stdout
    data = json.loads((tmp_path / "peers.json").read_text())
    sweep = [m for m in data["measurements"] if m["suite"] == "sweep" and m["status"] == "ok"]
    assert sweep
    assert all(m["share"] > 0 and m["share_zero"] > 0 for m in sweep)
    assert {c["flush"] for c in data["meta"]["copy"]["used"]} == {"read", "zero"}
