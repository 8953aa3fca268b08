"""untuned.py on the GPU: every implementation at one shape, checked against float64, then timed."""

from __future__ import annotations

import math
import time

from .checks import rel_error
from .constants import TOL
from .failures import short_error, sync_quietly
from .impls import Unavailable, torch_dtype
from .shapes import gbps_of
from .timing import flushed_ms, graph_ms
from .untuned_constants import EPS, GRAPH_REP_MS, OFFSET_MEAN, OFFSET_SPREAD, PEER_NAMES
from .untuned_modes import Modes, check_mode
from .untuned_records import autonorm_key, new_impl, new_record
from .untuned_shapes import Case
from .untuned_tables import number_or_dash


def _inputs(case: Case, seed: int):
    import torch
    import torch.nn.functional as F  # noqa: N812

    dtype = torch_dtype(case.dtype)
    torch.manual_seed(seed)
    x = torch.randn(case.rows, case.hidden, device="cuda", dtype=dtype)
    w = (1.0 + 0.1 * torch.randn(case.hidden, device="cuda")).to(dtype)
    b = (0.1 * torch.randn(case.hidden, device="cuda")).to(dtype)
    wd, bd = w.double(), b.double()
    ref = F.layer_norm(x.double(), (case.hidden,), wd, bd, EPS)
    offset = None
    if case.dtype == "fp32":
        xo = OFFSET_MEAN + OFFSET_SPREAD * torch.randn(case.rows, case.hidden, device="cuda")
        ro = F.layer_norm(xo.double(), (case.hidden,), wd, bd, EPS)
        offset = (xo, ro, ro.norm())
    return x, w, b, ref, ref.norm(), offset


def _time(fn, case: Case, r: dict) -> None:
    ms, p20, p80 = (flushed_ms(fn, "read") if case.kind == "bulk"
                    else graph_ms(fn, rep_ms=GRAPH_REP_MS))
    r.update(us=ms * 1e3, us_p20=p20 and p20 * 1e3, us_p80=p80 and p80 * 1e3,
             gbps=gbps_of(case.shape().bytes, ms))


def _run_autonorm(case: Case, mode: str, modes: Modes, data: tuple) -> dict:
    """Verify (output poisoned first, and fp32 offset rows) and time autonorm in ``mode``."""
    import torch

    import autonorm.torch as ant
    from autonorm import dispatch
    from autonorm.dtypes import normalize_dtype
    from autonorm.ops.layer_norm.problem import Problem

    x, w, b, ref, ref_norm, offset = data
    r = new_impl()
    modes.enter(mode)
    poison = torch.full_like(x, float("nan"))
    ptr = poison.data_ptr()
    del poison  # the allocator hands this block to y, so rows the kernel skips stay NaN
    t0 = time.perf_counter()
    y = ant.layer_norm(x, w, b, EPS)
    torch.cuda.synchronize()
    r["first_call_s"] = time.perf_counter() - t0
    r["poisoned"] = y.data_ptr() == ptr
    r["rel_err"] = rel_error(y, ref, ref_norm)
    del y
    choice = dispatch.chosen(Problem(case.hidden, normalize_dtype(case.dtype)), case.rows)
    source = choice.source if choice is not None else "?"
    r["choice"] = f"{source} {choice.config.label()}" if choice is not None else None
    if offset is not None:
        xo, ro, ro_norm = offset
        r["offset_err"] = rel_error(ant.layer_norm(xo, w, b, EPS), ro, ro_norm)
    ok = math.isfinite(r["rel_err"]) and r["rel_err"] <= TOL[case.dtype]
    r["status"] = "ok" if ok else "WRONG"
    wrong_mode = check_mode(mode, source)
    if wrong_mode:
        r.update(status="error", error=wrong_mode)
        return r
    _time(lambda: ant.layer_norm(x, w, b, EPS), case, r)
    return r


def _run_peer(case: Case, name: str, impls, data: tuple) -> dict:
    import torch

    x, w, b, ref, ref_norm, _ = data
    r = new_impl()
    try:
        fn, _ = impls.make(name, case.shape(), x, w, b, EPS)
    except Unavailable as exc:
        r.update(status="unavailable", error=str(exc))
        return r
    t0 = time.perf_counter()
    y = fn()
    torch.cuda.synchronize()
    r["first_call_s"] = time.perf_counter() - t0
    r["rel_err"] = rel_error(y, ref, ref_norm)
    del y
    ok = math.isfinite(r["rel_err"]) and r["rel_err"] <= TOL[case.dtype]
    r["status"] = "ok" if ok else "WRONG"
    _time(fn, case, r)
    return r


def measure(case: Case, seed: int, modes_on: list[str], modes: Modes, impls, log) -> dict:
    """Every implementation at one shape: autonorm in each of ``modes_on``, then the peers."""
    import torch

    rec = new_record(case)
    data = _inputs(case, seed)
    runs = [(autonorm_key(m), m) for m in modes_on] + [(n, None) for n in PEER_NAMES]
    for key, mode in runs:
        try:
            if mode is not None:
                r = _run_autonorm(case, mode, modes, data)
            else:
                r = _run_peer(case, key, impls, data)
        except Exception as exc:  # noqa: BLE001 - one implementation's failure, not the run's
            r = new_impl()
            r["error"] = short_error(exc)
            sync_quietly()
        rec["impls"][key] = r
        what = r["error"] if r["status"] in ("error", "unavailable") else (
            f"{r['status']} {number_or_dash(r['us'], '.1f', ' us')} "
            f"err {number_or_dash(r['rel_err'], '.1e')}"
            + (f" offset {r['offset_err']:.1e}" if r["offset_err"] is not None else "")
            + (f" [{r['choice']}]" if r["choice"] else ""))
        log(f"{case.label():28s} {key:20s} {what}")
    del data
    torch.cuda.empty_cache()
    return rec
