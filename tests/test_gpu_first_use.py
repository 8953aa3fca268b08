"""GPU: tuning on first use, end to end, and the capture check it relies on.

A process whose first call meets a shape no database holds tunes it within its budget and stores
the winner in a temporary user database; a second process finds the winner and tunes nothing.
Both outputs match the float64 reference. The shipped database is switched off, so the shape is
unknown on any GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from autonorm.store.db import TuningDB
from autonorm.tune import first_use

pytestmark = pytest.mark.gpu

HIDDEN = 2880
ROWS = 3000  # bucket 4096
DTYPE = "float16"

# One process's first call of the shape: its output against the float64 reference, and what
# dispatch chose for it.
CHILD = """
import json, sys
import cupy
import numpy as np
import autonorm
from autonorm import dispatch
from autonorm.numerics import measure_error
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.reference import layer_norm_reference

hidden, rows, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
x = (0.5 + rng.standard_normal((rows, hidden))).astype(dtype)
w = (1.0 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
b = (0.1 * rng.standard_normal(hidden)).astype(dtype)
y = autonorm.layer_norm(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), eps=1e-5)
f64 = [a.astype(np.float64) for a in (x, w, b)]
err = measure_error(cupy.asnumpy(y).astype(np.float64), layer_norm_reference(*f64, 1e-5))
choice = dispatch.chosen(Problem(hidden, dtype), rows)
print(json.dumps({"source": choice.source, "label": choice.config.label(),
                  "within": bool(err.within(dtype)), "error": str(err)}))
"""


def first_call(env: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(HIDDEN), str(ROWS), DTYPE],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("autonorm: ")]
    return json.loads(proc.stdout.strip().splitlines()[-1]), said


def test_the_first_call_tunes_and_a_second_process_finds_the_winner(tmp_path):
    db_path = tmp_path / "user.db"
    env = {
        **os.environ,
        "AUTONORM_DB": str(db_path),
        "AUTONORM_CACHE_DIR": str(tmp_path / "cache"),
        "AUTONORM_NO_SHIPPED_DB": "1",
        "AUTONORM_TUNE_ON_FIRST_USE": "1",
        "AUTONORM_FIRST_USE_BUDGET_S": "10",
    }
    env.pop("AUTONORM_NO_KEEP_X", None)
    first, said = first_call(env)
    assert first["within"], first["error"]
    assert first["source"] == "user", said
    assert len(said) == 2 and "tuning it within about 10 s" in said[0], said
    assert first["label"] in said[1] and "source user" in said[1]
    with TuningDB(db_path) as db:
        (winner,) = db.winners()
        trials = len(db.trials())
    assert winner.key.hidden == HIDDEN and winner.key.rows_bucket == 4096
    assert trials >= 1

    second, said = first_call(env)
    assert second["within"], second["error"]
    assert (second["source"], second["label"]) == ("user", first["label"])
    assert said == []  # nothing tuned, nothing waited for
    with TuningDB(db_path) as db:
        assert len(db.trials()) == trials


def test_capture_is_seen_on_cupy_and_torch_streams():
    cupy = pytest.importorskip("cupy")
    a = cupy.zeros(4, dtype=cupy.float32)
    a += 1  # compiled and loaded before the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    seen = []
    with stream:
        seen.append(first_use.capturing())
        stream.begin_capture()
        try:
            a += 1
            seen.append(first_use.capturing())
        finally:
            stream.end_capture()
        seen.append(first_use.capturing())
    assert seen == [False, True, False]

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.zeros(4, device="cuda")
    t.add_(1)
    graph = torch.cuda.CUDAGraph()
    seen = []
    with torch.cuda.graph(graph):
        t.add_(1)
        seen.append(first_use.capturing())
    seen.append(first_use.capturing())
    assert seen == [True, False]
