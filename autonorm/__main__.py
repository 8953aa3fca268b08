"""``python -m autonorm`` runs the CLI."""

from __future__ import annotations

from autonorm.cli import run as main

if __name__ == "__main__":
    main()
