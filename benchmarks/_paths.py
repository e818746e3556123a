"""Paths in benchmark results, named relative to the repository (never one machine's layout)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def relative(path: Path) -> str:
    """``path`` relative to the repository root when inside it, else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
