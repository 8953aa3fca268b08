"""``python -m autonorm`` runs the CLI."""

from __future__ import annotations

from autonorm.cli import main

if __name__ == "__main__":
    main()
