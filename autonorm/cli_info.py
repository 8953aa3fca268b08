"""``autonorm info``: what this machine gives autonorm, for a setup check or a bug report.

The version and Python, the GPU (or why there is none), CuPy, PyTorch and nvcc, both tuning
databases (where they are, how many winners, for this GPU too), the cache and the settings
given in the environment, a misspelt ``AUTONORM_*`` name among them. Never fails for a missing
piece: each line says what is missing and what it costs.
"""

from __future__ import annotations

import json
import platform
import sys
import warnings
from pathlib import Path
from typing import Any

import click

from autonorm import __version__, settings
from autonorm.errors import BadSettingWarning

# What a missing piece costs, said after it.
_COSTS = {
    "gpu": "tune and run kernels need one; show, export and render work without",
    "torch": "autonorm.torch needs it (pip install 'autonorm[torch]')",
    "nvcc": "only the offline compile tests and benchmarks/default_spills.py use it",
}


def _gpu() -> dict[str, Any]:
    from autonorm.runtime.device import NoGPUError, query_device

    try:
        info = query_device()
    except NoGPUError as exc:
        return {"available": False, "reason": str(exc)}
    return {"available": True, "name": info.name, "arch": info.arch, "sms": info.sm_count,
            "usable_sms": _usable_sms(info.sm_count), "l2_mib": info.l2_bytes / 2**20,
            "fingerprint": info.fingerprint}


def _usable_sms(sm_count: int) -> int:
    """The SMs this process's context may use: fewer under MPS or in a green context.

    The backward kernels size their grids to these (:func:`autonorm.runtime.driver.
    context_sm_count`); a count below the device's explains grids that fill less of it.
    """
    from autonorm.runtime.driver import usable_sm_count

    try:
        import cupy

        cupy.cuda.runtime.free(0)  # makes the context the driver is asked about current
    except Exception:  # noqa: BLE001 - no CuPy or no GPU: the driver cannot say
        pass
    return usable_sm_count(sm_count)


def _cupy() -> dict[str, Any]:
    try:
        import cupy
    except ImportError:
        return {"installed": False}
    found: dict[str, Any] = {"installed": True, "version": cupy.__version__}
    try:
        found["cuda_runtime"] = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception as exc:  # noqa: BLE001 - CuPy raises several CUDA error types
        found["cuda_runtime_error"] = str(exc)
    return found


def _torch() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"installed": False}
    return {"installed": True, "version": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": bool(torch.cuda.is_available())}


def _database(opener: Any, path: Any, fingerprint: str | None) -> dict[str, Any]:
    from autonorm.errors import AutonormError

    found: dict[str, Any] = {"path": None if path is None else str(path)}
    try:
        store = opener()
    except AutonormError as exc:
        return {**found, "error": str(exc)}
    if store is None:
        return {**found, "winners": None}
    with store:
        found.update(winners=len(store.winners()), read_only=store.read_only,
                     devices=sorted({d["name"] for d in store.devices()}))
        if fingerprint is not None:
            found["winners_here"] = len(store.winners(fingerprint))
    return found


def gather() -> dict[str, Any]:
    """Return everything ``autonorm info`` reports, as plain data."""
    from autonorm.runtime.offline import nvcc_path
    from autonorm.store.db import TuningDB

    gpu = _gpu()
    fingerprint = gpu.get("fingerprint")
    known, unknown = settings.variables_set()
    with warnings.catch_warnings():
        # A setting it cannot read is among info's own lines (lines()), not on stderr besides.
        warnings.simplefilter("ignore", BadSettingWarning)
        shipped = _database(TuningDB.open_shipped, settings.shipped_db_path(), fingerprint)
    return {
        "autonorm": __version__,
        "package": str(Path(__file__).resolve().parent),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "gpu": gpu,
        "cupy": _cupy(),
        "torch": _torch(),
        "nvcc": nvcc_path(),
        "user_db": _database(TuningDB.open_user_to_read, settings.user_db_path(), fingerprint),
        "shipped_db": shipped,
        "cache_dir": str(settings.cache_dir()),
        "settings": known,
        "unknown_settings": unknown,
    }


def _db_line(found: dict[str, Any], missing: str) -> str:
    if "error" in found:
        return f"{found['path']}: {found['error']}"
    if found["path"] is None:
        return missing
    if found["winners"] is None:
        return f"{found['path']} (not created yet: the first tuning creates it)"
    here = (f", {found['winners_here']} for this GPU" if "winners_here" in found else "")
    devices = f"; tuned on {', '.join(found['devices'])}" if found["devices"] else ""
    mode = ", read-only" if found["read_only"] else ""
    return f"{found['path']} ({found['winners']} winners{here}{devices}{mode})"


def lines(found: dict[str, Any]) -> list[str]:
    """The report for a person, a fact a line."""
    gpu, cupy, torch = found["gpu"], found["cupy"], found["torch"]
    rows = [("autonorm", f"{found['autonorm']} ({found['package']})"),
            ("python", f"{found['python']} on {found['platform']}")]
    if gpu["available"]:
        shared = (f" ({gpu['usable_sms']} usable by this process: MPS or a green context)"
                  if gpu["usable_sms"] < gpu["sms"] else "")
        rows.append(("GPU", f"{gpu['name']}, {gpu['arch']}, {gpu['sms']} SMs{shared}, "
                            f"{gpu['l2_mib']:.0f} MiB L2"))
    else:
        rows.append(("GPU", f"none: {gpu['reason']} ({_COSTS['gpu']})"))
    if cupy["installed"]:
        runtime = cupy.get("cuda_runtime")
        cuda = (f"CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}" if runtime
                else f"CUDA runtime unusable: {cupy.get('cuda_runtime_error')}")
        rows.append(("CuPy", f"{cupy['version']} ({cuda})"))
    else:
        rows.append(("CuPy", "not installed (pip install 'autonorm[cuda12]' or '[cuda13]')"))
    if torch["installed"]:
        cuda = (f"CUDA {torch['cuda']}, " if torch["cuda"] else "CPU build, ")
        usable = "a GPU usable" if torch["cuda_available"] else "no GPU usable"
        rows.append(("PyTorch", f"{torch['version']} ({cuda}{usable})"))
    else:
        rows.append(("PyTorch", f"not installed ({_COSTS['torch']})"))
    rows.append(("nvcc", found["nvcc"] or f"not found ({_COSTS['nvcc']})"))
    rows.append(("user DB", _db_line(found["user_db"], "none")))
    rows.append(("shipped DB", _db_line(found["shipped_db"],
                                        "switched off (AUTONORM_NO_SHIPPED_DB)")))
    rows.append(("cache", found["cache_dir"]))
    given = ", ".join(f"{name}={value}" for name, value in found["settings"].items())
    rows.append(("settings", given or "none set (defaults)"))
    rows += [("warning", message) for message in settings.unknown_variable_messages()]
    rows += [("warning", message) for message in settings.flag_messages()]
    width = max(len(key) for key, _ in rows)
    return [f"{key:<{width}}  {value}" for key, value in rows]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of lines.")
def info(as_json: bool) -> None:
    """Show the GPU, libraries, databases and settings autonorm finds here.

    For a setup check or a bug report: each missing piece says what it costs.
    """
    found = gather()
    if as_json:
        click.echo(json.dumps(found, indent=1))
        return
    click.echo("\n".join(lines(found)))
