"""Where Optuna studies live: study names, journal files and storage URLs.

A study is a cache of measurements of one problem on one GPU with one version of its family's
templates (docs/tuning.md). Its name says all of that in a form that is readable and safe as a
file name, because the default storage is one journal file per study.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from autonorm import settings
from autonorm.ops.base import Problem

__all__ = ["JOURNAL_SUFFIX", "open_storage", "storage_scheme", "study_name_for"]

JOURNAL_SUFFIX = ".journal"

# The readable part of a name keeps the GPU model only; the digest covers the whole fingerprint.
_MAX_GPU_CHARS = 40


def _slug(text: str) -> str:
    """Lower-case ``text`` and keep only characters that are safe in file names."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")


def _field_part(name: str, value: Any) -> str:
    """Write one problem field for a study name: ``name1``/``name0`` for flags, else name-value."""
    if isinstance(value, bool):
        return f"{_slug(name)}{int(value)}"
    return f"{_slug(name)}-{_slug(str(value)) or 'none'}"


def study_name_for(
    device_fingerprint: str, version: str, problem: Problem, rows_bucket: int
) -> str:
    """Return the study name of one (GPU, family version, problem, rows bucket).

    The name is readable and safe as a file name: the GPU model and a hash of its whole
    fingerprint (``nvidia-h200-1a2b3c4d``), the version, the op, the dtype and hidden size
    every problem has, the problem's other fields by name, and the rows bucket, e.g.
    ``<gpu>-<hash>_v<version>_layer-norm_bfloat16_h4096_has-bias1_has-weight1_r1024``.

    Args:
        device_fingerprint: :attr:`autonorm.runtime.device.DeviceInfo.fingerprint`.
        version: the family's :meth:`~autonorm.ops.base.Family.code_version` (kernels of other
            templates are another study).
        problem: what is tuned (its op and :meth:`~autonorm.ops.base.Problem.fields`).
        rows_bucket: :func:`autonorm.ops.base.rows_bucket` of the row count.

    Raises:
        ValueError: ``rows_bucket`` is not a positive integer.

    """
    if not isinstance(rows_bucket, int) or rows_bucket < 1:
        raise ValueError(f"rows_bucket must be a positive integer, got {rows_bucket!r}")
    gpu = _slug(device_fingerprint.split("|", 1)[0])[:_MAX_GPU_CHARS] or "gpu"
    digest = hashlib.sha1(device_fingerprint.encode()).hexdigest()[:8]
    fields = problem.fields()
    others = [_field_part(k, fields[k]) for k in sorted(fields) if k not in ("dtype", "hidden")]
    parts = [
        f"{gpu}-{digest}",
        f"v{_slug(version) or 'unknown'}",
        _slug(type(problem).op),
        _slug(str(problem.dtype)),
        f"h{problem.hidden}",
        *others,
        f"r{rows_bucket}",
    ]
    return "_".join(parts)


def storage_scheme(url: str) -> str:
    """Return a URL's scheme without a driver suffix (``postgresql+psycopg2`` -> postgresql).

    A plain path has none (``""``).
    """
    if "://" not in url:
        return ""
    return url.split("://", 1)[0].lower().split("+", 1)[0]


def _study_file(folder: Path, study_name: str) -> Path:
    """Return the journal file of a study inside ``folder``."""
    return folder / (re.sub(r"[^A-Za-z0-9._-]+", "_", study_name) + JOURNAL_SUFFIX)


def _journal_file(path: Path) -> JournalStorage:
    """Open (creating it and its folder) a journal file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def _journal_at(location: str, study_name: str) -> JournalStorage:
    """Open the journal file at ``location``; a directory gets one file per study inside it."""
    path = Path(location).expanduser()
    if path.is_dir() or location.endswith(("/", os.sep)):
        path = _study_file(path, study_name)
    return _journal_file(path)


def open_storage(url: str | None, study_name: str) -> BaseStorage:
    """Open the Optuna storage named by ``url``.

    Args:
        url: where studies live.

            * None: a journal file ``<studies_dir>/<study_name>.journal``.
            * a path, or ``journal:///abs/path``: a journal file there (a directory gets
              ``<study_name>.journal`` inside it). Many local processes may share one.
            * ``redis://...``: Optuna's Redis journal backend (needs ``pip install redis``);
              for workers on several machines.
            * ``postgresql://...``, ``mysql://...``: an Optuna RDB storage.
            * ``sqlite:///...``: an RDB storage for one worker only (see
              :func:`autonorm.tune.workers.run_workers`).
        study_name: the study that will be opened in it (names the default journal file).

    Raises:
        ImportError: a Redis URL without the redis package installed.
        ValueError: an unsupported URL scheme.

    """
    if url is None:
        return _journal_file(_study_file(settings.studies_dir(), study_name))
    scheme = storage_scheme(url)
    if scheme == "":
        return _journal_at(url, study_name)
    if scheme == "journal":
        return _journal_at(url.split("://", 1)[1], study_name)
    if scheme in ("redis", "rediss", "unix"):
        # Imported here: redis is optional, and only multi-machine tuning needs it.
        try:
            import redis  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                f"storage {url!r} needs the redis package: pip install redis "
                "(or use a journal file shared by the local processes)"
            ) from exc
        from optuna.storages.journal import JournalRedisBackend

        return JournalStorage(JournalRedisBackend(url))
    if scheme in ("postgresql", "postgres", "mysql", "sqlite"):
        return RDBStorage(url)
    raise ValueError(
        f"unsupported storage URL {url!r}: use a journal file path, journal:///path, "
        "redis://, postgresql://, mysql:// or (one worker only) sqlite:///"
    )
