"""The Jinja environment that renders kernels, and the digest that names what a kernel runs.

Each kernel family keeps its templates in its own folder; the device code they share (the
block and cluster reductions, the dtype conversions) lives in ``autonorm/codegen/templates``.
A family's environment searches its own folder first, then the shared one, so a template
imports ``reduce.cuh.j2`` by name wherever it lives.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

import jinja2

SHARED_TEMPLATES = Path(__file__).resolve().parent / "templates"

_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r"//[^\n]*")


@functools.cache
def environment(template_dir: Path) -> jinja2.Environment:
    """Return the Jinja environment over ``template_dir`` and the shared templates."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(template_dir), str(SHARED_TEMPLATES)]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
        lstrip_blocks=False,
        keep_trailing_newline=True,
        autoescape=False,
    )


def code_of(source: str) -> str:
    """Return ``source`` as the compiler reads it: comments, blank lines and trailing blanks gone.

    Comments explain a kernel; they do not change what runs. Rewording one must not make a
    tuned winner stale, so the digest below is taken over this text.
    """
    text = _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", source))
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())


def kernel_digest(source: str) -> str:
    """Return the SHA-256 (hex) of the code of a rendered kernel: what tuned winners are keyed by.

    Two renders with the same digest compile to the same kernel, whichever version of autonorm
    or of its templates produced them, so a winner stays valid across any change that leaves
    its kernel's code alone.
    """
    return hashlib.sha256(code_of(source).encode()).hexdigest()
