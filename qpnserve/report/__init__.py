"""`qpnserve report`: one archive (tar.gz) with what a maintainer needs for a bug report, every
piece redacted (redact.py) before it is written; weights, prompts and completions never.

``write_report(out: Path | None, log_lines=200) -> ReportResult``: gathers (collect.py), checks
that no known secret value survived, writes the archive atomically (mode 0600).
"""

from __future__ import annotations

from qpnserve.report.archive import ReportResult, default_out, write_report

__all__ = ["ReportResult", "default_out", "write_report"]
