"""CLI commands: build (placeholder; filled by its issue)."""

from __future__ import annotations
