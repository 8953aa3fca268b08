"""Implementations: each one's callable factory, or the reason it is unavailable.

Everything here imports torch lazily: --selftest needs none of it.
"""

from __future__ import annotations

import glob
import subprocess
import sys
import time

from .constants import DEFAULT_OP, DTYPES, HERE, IN_PLACE_IMPLS, REPO
from .failures import short_error, sync_quietly
from .ops import OPS, put_repo_on_path
from .shapes import Shape


class Unavailable(Exception):
    """An implementation cannot run at all in this environment."""


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def as_torch(y):
    """A torch tensor of an output (CuPy through DLPack); a tuple of them for ``(y, h)``."""
    import torch

    if isinstance(y, torch.Tensor):
        return y
    if isinstance(y, tuple):
        return tuple(as_torch(t) for t in y)
    return torch.from_dlpack(y)


def _install_liger(spec: str) -> str:
    """Try to install a Liger wheel without network; return what was done."""
    if spec == "none":
        return "not installed (--liger-wheel none)"
    if spec == "auto":
        patterns = [
            REPO / ".whl" / "liger_kernel-*.whl",
            REPO / "shared" / "device" / "wheels" / "liger_kernel-*.whl",
            REPO.parent / "shared" / "device" / "wheels" / "liger_kernel-*.whl",
        ]
        found = [f for pat in patterns for f in sorted(glob.glob(str(pat)))]
        if not found:
            return "no liger_kernel wheel found in .whl/ or shared/device/wheels/"
        wheel = found[-1]
    else:
        wheel = spec
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", wheel]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except Exception as exc:  # noqa: BLE001 - report and carry on
        return f"pip install {wheel} failed: {short_error(exc)}"
    if proc.returncode != 0:
        return f"pip install {wheel} failed: {(proc.stderr or proc.stdout)[-300:]}"
    return f"installed {wheel}"


class Impls:
    """Holds each implementation's callable factory, or the reason it is unavailable."""

    def __init__(self, names: list[str], liger_wheel: str, op: str = DEFAULT_OP) -> None:
        import torch
        import torch.nn.functional as F  # noqa: N812

        self.torch = torch
        self.F = F
        self.names = names
        self.op = OPS[op]
        self.unavailable: dict[str, str] = {
            name: f"no {op} implementation" for name in names if name not in self.op.impls}
        self.versions: dict[str, str | None] = {}
        self.notes: dict[str, str] = {}
        self._compiled: dict[str, object] = {}
        self._autonorm = None
        self._autonorm_torch = None
        self._liger = None
        self._triton_ln = None

        if any(name in ("autonorm", *IN_PLACE_IMPLS) for name in names):
            self._load_autonorm()
        if "compile" in names:
            self._setup_compile()
        if "triton" in names and "triton" not in self.unavailable:
            try:
                sys.path.insert(0, str(HERE))
                import triton_tutorial_ln

                self._triton_ln = triton_tutorial_ln.layer_norm
            except Exception as exc:  # noqa: BLE001
                self.unavailable["triton"] = short_error(exc)
        if "liger" in names:
            self._load_liger(liger_wheel)

    # -- loading ---------------------------------------------------------------------------

    def _load_autonorm(self) -> None:
        put_repo_on_path()
        entry = self.op.entry
        errors = []
        try:
            import autonorm

            self.versions["autonorm"] = getattr(autonorm, "__version__", None)
            self.notes["autonorm_file"] = getattr(autonorm, "__file__", None) or "?"
        except Exception as exc:  # noqa: BLE001
            self._autonorm_unavailable(short_error(exc))
            return
        try:
            self._autonorm = getattr(autonorm, entry)  # lazy attribute: imports autonorm.dispatch
        except Exception as exc:  # noqa: BLE001
            errors.append(f"autonorm.{entry}: {short_error(exc)}")
        try:
            import autonorm.torch as an_torch

            if not hasattr(an_torch, entry):
                raise AttributeError(f"autonorm.torch has no {entry}")
            self._autonorm_torch = getattr(an_torch, entry)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"autonorm.torch.{entry}: {short_error(exc)}")
        if errors:
            self.notes["autonorm_import"] = "; ".join(errors)
        if self._autonorm is None and self._autonorm_torch is None:
            self._autonorm_unavailable("; ".join(errors))

    def _autonorm_unavailable(self, why: str) -> None:
        """Mark autonorm's forms that were asked for (functional, in place) unavailable."""
        for name in ("autonorm", *IN_PLACE_IMPLS):
            if name in self.names:
                self.unavailable.setdefault(name, why)

    def _setup_compile(self) -> None:
        torch = self.torch
        try:
            import torch._dynamo as dynamo

            cfg = dynamo.config
            # One compiled function, recompiled per shape and dtype (dynamic=False): allow
            # enough cache entries, and fail loudly instead of silently running eager.
            settings = (
                (("recompile_limit", "cache_size_limit"), 512),
                (("accumulated_recompile_limit", "accumulated_cache_size_limit"), 4096),
                (("fail_on_recompile_limit_hit",), True),
                (("suppress_errors",), False),
            )
            for aliases, val in settings:
                for name in aliases:
                    if hasattr(cfg, name):
                        setattr(cfg, name, val)
                        break
        except Exception as exc:  # noqa: BLE001
            self.notes["compile_config"] = short_error(exc)
        norm = self.op.compiled(self.F)
        try:
            for dt in DTYPES:
                self._compiled[dt] = torch.compile(norm, dynamic=False)
        except Exception as exc:  # noqa: BLE001
            self.unavailable["compile"] = short_error(exc)

    def _load_liger(self, wheel_spec: str) -> None:
        module, function = self.op.liger

        def attempt():
            import importlib

            return getattr(importlib.import_module(module), function)

        try:
            fn = attempt()
        except Exception as exc:  # noqa: BLE001
            first = short_error(exc)
            self.notes["liger_install"] = _install_liger(wheel_spec)
            if not self.notes["liger_install"].startswith("installed"):
                self.unavailable["liger"] = f"{first}; {self.notes['liger_install']}"
                return
            import importlib

            importlib.invalidate_caches()
            try:
                fn = attempt()
            except Exception as exc2:  # noqa: BLE001
                self.unavailable["liger"] = short_error(exc2)
                return
        self._liger = fn
        try:
            from importlib.metadata import version

            self.versions["liger"] = version("liger-kernel")
        except Exception:  # noqa: BLE001
            self.versions["liger"] = "?"

    # -- factories: return (fn, info); fn() computes y from the bound inputs -----------------

    def make(self, impl: str, shape: Shape, x, w, b, eps: float, r=None):
        """Return (fn, info): fn() computes the op's outputs from the bound inputs.

        ``r`` is the residual of an op with one (None otherwise).
        """
        if impl in self.unavailable:
            raise Unavailable(self.unavailable[impl])
        if impl == "eager":
            return self.op.eager(self.F, shape, x, w, b, eps, r), {}
        if impl == "compile":
            cfn = self._compiled[shape.dtype]
            return (lambda: cfn(x, w, b, eps, r)), {}
        if impl == "triton":
            tfn = self._triton_ln
            return (lambda: tfn(x, w, b, eps)), {}
        if impl == "liger":
            return self.op.liger_call(self._liger, x, w, b, eps, r), {}
        if impl == "autonorm":
            return self._make_autonorm(x, w, b, eps, r)
        if impl in IN_PLACE_IMPLS:
            return self._make_autonorm(x, w, b, eps, r, in_place=True)
        raise ValueError(impl)

    def _make_autonorm(self, x, w, b, eps: float, r=None, in_place: bool = False):
        """Find a way in that works, in this order, and say which one ran (``path``).

        ``torch``: ``autonorm.layer_norm`` (``rms_norm``: the op's function) on the torch
        tensors; ``autonorm.torch``: ``autonorm.torch.layer_norm`` on them; ``dlpack``:
        ``autonorm.layer_norm`` on CuPy views (``cupy.from_dlpack``) run on torch's current
        stream, result back through DLPack.

        ``in_place`` (the op's ``in_place_call``) runs on copies of x and the residual, which
        every launch overwrites: the other implementations keep reading the originals. The
        copies are restored after the probe, so the first call after this (the check) sees
        the inputs every other implementation saw.
        """
        torch = self.torch
        an, an_torch = self._autonorm, self._autonorm_torch
        bind = self.op.in_place_call if in_place else self.op.autonorm_call

        def restore() -> None:
            pass

        if in_place:
            x_in, r_in = x, r
            x, r = x_in.clone(), r_in.clone()

            def restore() -> None:
                x.copy_(x_in)
                r.copy_(r_in)

        def on_torch(fn):
            call = bind(fn, x, w, b, eps, r)
            return lambda: as_torch(call())

        # (path, builder); a builder returns the callable to time.
        candidates = []
        if an is not None:
            candidates.append(("torch", lambda: on_torch(an)))
        if an_torch is not None:
            candidates.append(("autonorm.torch", lambda: on_torch(an_torch)))
        if an is not None:
            candidates.append(("dlpack", lambda: self._dlpack_fn(bind, an, x, w, b, eps, r)))
        info: dict = {}
        failures = []
        for path, build in candidates:
            t0 = time.perf_counter()
            try:
                fn = build()
                fn()
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{path} path: {short_error(exc, 200)}")
                sync_quietly()
                continue
            restore()  # a failed path's partial writes are undone here too
            info["path"] = path
            if in_place:
                info["restore"] = restore  # run_shape takes it out: not a record field
            info["probe_s"] = time.perf_counter() - t0
            if failures:
                info["failed_paths"] = "; ".join(failures)
            return fn, info
        raise RuntimeError("; ".join(failures) or "no autonorm entry point")

    def _dlpack_fn(self, bind, an, x, w, b, eps: float, r=None):
        """Return a callable running ``an`` (bound by ``bind``) on CuPy views of the tensors."""
        torch = self.torch
        import cupy

        from autonorm.runtime.driver import wrap_stream

        def view(t):
            return None if t is None else cupy.from_dlpack(t)

        call = bind(an, view(x), view(w), view(b), eps, view(r))

        def dlpack_path():
            # Run on torch's current stream so do_bench events and graph capture see the work.
            stream = wrap_stream(torch.cuda.current_stream().cuda_stream)
            with stream:
                y = call()
            return as_torch(y)

        return dlpack_path
