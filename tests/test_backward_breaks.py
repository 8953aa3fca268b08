"""Every broken backward kernel of the GPU tests is planted in the source it is meant for.

The GPU test (`test_gpu_backward.py`) compiles each break and asserts the verifier rejects it;
this CPU test renders the same kernels and checks each edit still finds its text and changes
the source, so a template change that moves the text fails here, in CI.
"""

from __future__ import annotations

import pytest
from backward_breaks import ALL_BREAKS, BROKEN_CONFIGS, NO_SHIFT, PLANTED, plant

from autonorm.ops import registry
from autonorm.runtime.limits import H200


@pytest.mark.parametrize(("form", "name"), PLANTED)
def test_each_break_finds_its_text(form: str, name: str) -> None:
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=4096, dtype="float32")
    source = family.render(family.config_from_dict(BROKEN_CONFIGS[form]), problem, H200).source
    broken = plant(source, name)
    assert broken != source
    for _, new in ALL_BREAKS[name]:
        assert new in broken


def test_every_break_is_planted_and_a_missing_text_is_an_error() -> None:
    assert {name for _, name in PLANTED} == set(ALL_BREAKS)
    assert {form for form, _ in PLANTED} == set(BROKEN_CONFIGS)
    with pytest.raises(ValueError, match="drop-mean"):
        plant("no such text", "drop-mean")
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=4096, dtype="float32")
    held = family.render(family.config_from_dict(BROKEN_CONFIGS["held"]), problem, H200).source
    assert NO_SHIFT[0] in held
