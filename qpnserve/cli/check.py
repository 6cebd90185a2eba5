"""CLI commands: check (placeholder; filled by its issue)."""

from __future__ import annotations
