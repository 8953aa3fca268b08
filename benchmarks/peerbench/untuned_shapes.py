"""untuned.py's shapes (no GPU): hidden sizes drawn with a seed, and the cases run at each.

None of the sizes drawn is one the shipped tuning database holds.
"""

from __future__ import annotations

import math
import os
import random
import sys
from dataclasses import dataclass

from .constants import REPO
from .shapes import Shape
from .untuned_constants import ELEMENTS, HIGH, LOW, ODD_FROM, ODD_KINDS


@dataclass(frozen=True)
class Case:
    """One shape: a dtype and (rows, hidden), bulk (2^26 elements) or a small row count."""

    dtype: str
    hidden: int
    rows: int
    kind: str  # "bulk" or "small"

    @property
    def odd(self) -> bool:
        return self.hidden % 8 != 0

    def label(self) -> str:
        return f"{self.dtype} h={self.hidden} rows={self.rows}"

    def shape(self) -> Shape:
        """The peers benchmark's shape: bytes, and the copy a bulk shape's share is taken of."""
        return Shape("sweep" if self.kind == "bulk" else "latency", self.dtype,
                           self.hidden, self.rows)


def _draw_one(rng: random.Random, modulus: int, residue: int, lo: int, hi: int,
              taken: set[int]) -> int:
    for _ in range(100_000):
        v = int(2 ** rng.uniform(math.log2(lo), math.log2(hi + 1)))
        v = v // modulus * modulus + residue
        if lo <= v <= hi and v not in taken:
            return v
    raise ValueError(f"no free hidden size = {residue} mod {modulus} in [{lo}, {hi}]")


def draw_hidden_sizes(seed: int, count: int, excluded: set[int] | frozenset[int] = frozenset(),
                      low: int = LOW, high: int = HIGH) -> list[int]:
    """Draw ``count`` distinct hidden sizes in [low, high], log-uniformly, none in ``excluded``.

    A third of them (rounded) are not a multiple of 8; of those, all but a third (rounded down)
    are drawn from ODD_FROM up and the rest below it, cycling through ODD_KINDS. The rest are
    multiples of 8. The same seed and exclusions give the same sizes.

    Returns:
        The sizes, smallest first.

    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    rng = random.Random(seed)
    odd = round(count / 3)
    below = odd // 3
    specs = [(8, 0, low, high)] * (count - odd)
    for i in range(odd):
        modulus, residue = ODD_KINDS[i % len(ODD_KINDS)]
        lo, hi = (ODD_FROM, high) if i < odd - below else (low, ODD_FROM - 1)
        specs.append((modulus, residue, lo, hi))
    taken = set(excluded)
    sizes = []
    for modulus, residue, lo, hi in specs:
        v = _draw_one(rng, modulus, residue, lo, hi, taken)
        taken.add(v)
        sizes.append(v)
    return sorted(sizes)


def shipped_hidden_sizes() -> set[int]:
    """Return every hidden size the shipped tuning database holds a winner for (any GPU)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from autonorm import settings
    from autonorm.store.db import TuningDB

    saved = os.environ.pop("AUTONORM_NO_SHIPPED_DB", None)  # the file, whatever the setting
    try:
        path = settings.shipped_db_path()
    finally:
        if saved is not None:
            os.environ["AUTONORM_NO_SHIPPED_DB"] = saved
    if path is None or not path.is_file():
        return set()
    with TuningDB(path, read_only=True, immutable=True, source="shipped") as db:
        return {w.key.hidden for w in db.winners()}


def build_cases(hiddens: list[int], dtypes: list[str], small_rows: list[int],
                elements: int = ELEMENTS, bulk: bool = True) -> list[Case]:
    """Bulk shapes first (every dtype, every size; none unless ``bulk``), then the small row
    counts, one at a time."""
    cases = [Case(d, h, max(1, elements // h), "bulk") for d in dtypes for h in hiddens
             if bulk]
    cases += [Case(d, h, r, "small") for r in small_rows for d in dtypes for h in hiddens]
    return cases
