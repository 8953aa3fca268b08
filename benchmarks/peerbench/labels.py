"""Configurations named on a script's command line by their labels (``--configs``)."""

from __future__ import annotations


def parse_labels(config_type: type, text: str) -> list:
    """The configurations of comma-separated labels, e.g. ``t256v4r1-registers-two_pass-c8-p0``.

    Blank entries are skipped, and a label's surrounding spaces with them.

    Raises:
        ValueError: a label that is not one of ``config_type``'s (its ``from_label``'s error).

    """
    return [config_type.from_label(label.strip()) for label in text.split(",") if label.strip()]
