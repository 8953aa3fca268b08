"""untuned.py's output: the device's meta and the JSON of every number."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .failures import short_error
from .report import clean_json


def device_meta() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    meta = {"device": props.name, "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count, "torch": torch.__version__,
            "cuda_runtime": torch.version.cuda}
    for name in ("triton", "cupy", "autonorm"):
        try:
            meta[name] = getattr(__import__(name), "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            meta[name] = f"unavailable: {short_error(exc)}"
    return meta


def write_results(path: Path | None, meta: dict, tuning: list[dict], records: list[dict],
           figures: list[dict] | None) -> None:
    if path is None:
        return
    data = {"meta": meta, "tuning": tuning, "cases": records, "summary": figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(clean_json(data), indent=1, default=str))
    os.replace(tmp, path)
