"""Every problem some configuration can run has a default, valid on the device (CPU).

Dispatch runs the default where nothing is tuned and ``autonorm tune`` starts from it, so a
problem whose space holds kernels but whose default rule gives up cannot be run or tuned at
all. Both norms, every weight form and the fused add, the backwards, three dtypes, hidden
sizes from 1 to 2^22 (odd and even, where each row cache stops fitting), one row and many, on
every GPU kind autonorm knows (sm_75 to sm_120). Where the rule does give up, the space must be
empty and the error must say why in one line.
"""

from __future__ import annotations

import itertools

import pytest

from autonorm.dtypes import DTYPES
from autonorm.errors import ConfigError
from autonorm.export.arch import KNOWN
from autonorm.ops import registry

DEVICES = {f"sm_{cc}": limits for cc, limits in sorted(KNOWN.items())}
FORMS = {
    "layer_norm": ({}, {"has_bias": False}, {"has_weight": False, "has_bias": False},
                   {"residual": True}, {"residual": True, "residual_dtype": "float32"}),
    "rms_norm": ({}, {"weight_offset": True}, {"has_weight": False}, {"residual": True},
                 {"residual": True, "residual_dtype": "float32"}),
    "layer_norm_backward": ({}, {"has_bias": False}, {"residual": True}),
    "rms_norm_backward": ({}, {"weight_offset": True}, {"residual": True}),
}


def _hidden_sizes() -> list[int]:
    # Small and odd rows, the sizes where a cache stops fitting (the row in registers, then in
    # shared memory, then one block's Welford run), and rows past them up to 2^22.
    return [1, 3, 100, 1000, 4097, 12289, 40001, 60001, 65535, 65536, 65537, 131071, 131072,
            262143, 262145, 524288, 1048575, 4194304]


def _problems(op: str):
    family = registry.get(op)
    for form, dtype, hidden in itertools.product(FORMS[op], DTYPES, _hidden_sizes()):
        if form.get("residual_dtype") == dtype:
            continue  # x's own dtype: the plain add
        yield family, family.problem(hidden=hidden, dtype=dtype, **form)


@pytest.mark.parametrize("device", DEVICES.values(), ids=DEVICES.keys())
@pytest.mark.parametrize("op", FORMS)
def test_every_problem_with_kernels_has_a_valid_default(op, device):
    bad, refused = [], 0
    for family, problem in _problems(op):
        for rows in (1, 4096):
            try:
                config = family.default(problem, device, rows)
            except ConfigError as exc:
                message = str(exc)
                assert "\n" not in message and problem.dtype in message, message
                if family.space(problem, device):
                    bad.append((problem.describe(), rows, "no default", message[:100]))
                refused += 1
                break
            if family.check(config, problem, device):
                bad.append((problem.describe(), rows, config.label(),
                            family.check(config, problem, device)))
    assert not bad, bad[:8]
    # The sweep reaches rows that no kernel runs (a float32 residual row past shared memory).
    assert refused < len(list(_problems(op)))


def test_every_registered_family_is_swept():
    assert set(FORMS) == set(registry.known())
