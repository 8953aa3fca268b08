"""benchmarks/backward_latency.py without a GPU: its command line and its table rows.

The graph replays need a CUDA GPU; what the table says about the times (the fastest peer, the
speed, a missing peer) is plain Python, checked here on synthetic microseconds.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "backward_latency.py"

_spec = importlib.util.spec_from_file_location("bench_backward_latency", SCRIPT)
latency = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(latency)


def _cells(line: str) -> list[str]:
    assert line.startswith("| ") and line.endswith(" |"), line
    return line[2:-2].split(" | ")


def _row(ours: float, **peers: float | None) -> dict[str, str]:
    header = _cells(latency.table_header()[0])
    cells = _cells(latency.format_row("rms_norm", "bf16", 4096, 8, ours, peers))
    assert len(cells) == len(header)
    return dict(zip(header, cells, strict=True))


def test_the_header_names_rows_and_a_column_per_peer():
    head, rule = latency.table_header()
    header = _cells(head)
    assert header == ["op", "dtype", "hidden", "rows", "autonorm us", "eager us", "compile us",
                      "liger us", "speed"]
    assert rule == "|" + "---|" * len(header)


@pytest.mark.parametrize("winner", ["eager", "compile", "liger"])
def test_the_speed_is_over_the_fastest_peer_whichever_it_is(winner):
    peers = {"eager": 9.0, "compile": 12.0, "liger": 10.0}
    peers[winner] = 6.0
    row = _row(4.0, **peers)
    assert row["speed"] == "1.50x"  # 6.0 / 4.0
    assert row["autonorm us"] == "4.0" and row["rows"] == "8"
    assert row[f"{winner} us"] == "6.0"


def test_a_slower_autonorm_shows_a_speed_under_one():
    assert _row(8.0, eager=4.0, compile=5.0)["speed"] == "0.50x"


def test_missing_or_non_positive_peers_are_dashes_left_out_of_the_fastest():
    row = _row(2.0, eager=3.0, compile=-0.4, liger=None)
    assert row["compile us"] == row["liger us"] == "-"
    assert row["speed"] == "1.50x"
    assert latency.fastest_peer({"eager": 3.0, "compile": 0.0}) == 3.0
    assert latency.fastest_peer({"autonorm": 1.0}) is None
    none = _row(2.0)
    assert none["speed"] == "-"


def test_parse_args_defaults_and_overrides():
    args = latency.parse_args([])
    assert (args.hidden, args.rows, args.dtypes, args.configs) == (
        "4096,16384", "1,8,64,256", "bf16", "")
    args = latency.parse_args(["--hidden", "768", "--rows", "1,2", "--dtypes", "fp32",
                               "--configs", "t128v8-bulk-accregisters-p1-s2-c4"])
    assert (args.hidden, args.rows, args.dtypes) == ("768", "1,2", "fp32")
    assert args.configs == "t128v8-bulk-accregisters-p1-s2-c4"


def test_a_configuration_line_names_its_label_and_dashes_what_it_did_not_time():
    peers = {"eager": 6.0, "compile": 3.0}
    line = latency.format_row("rms_norm t128v8-bulk-accregisters-p1-s2-c4", "bf16", 4096, 8,
                              2.0, peers)
    assert _cells(line)[0] == "rms_norm t128v8-bulk-accregisters-p1-s2-c4"
    assert _cells(line)[-1] == "1.50x"  # 3.0 / 2.0
    cells = _cells(latency.format_row("rms_norm t1024v8-none-accsmem-p1", "bf16", 64, 8, None,
                                      peers))
    assert cells[4] == "-" and cells[-1] == "-"


def test_no_labels_need_no_gpu():
    assert latency._config_kernels("layer_norm", None, None, None, []) == {}


def test_help_parses_and_names_the_method():
    env = {**os.environ, "COLUMNS": "200"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: backward_latency.py")
    for word in ("--hidden", "--rows", "--dtypes", "CUDA-graph replay", "Liger-Kernel"):
        assert word in run.stdout, word
