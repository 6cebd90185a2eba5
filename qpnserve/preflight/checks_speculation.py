"""toolchain.speculation: will the server speculate, and what that means for the route.

The verdict is qpnserve.speculation's (the one rule); this check only turns it into a row.
`check` alone does not know the server's arguments, so it judges the host's automatic rule
(the environment, the checkpoint's config, the GPU) and says the arguments were not seen;
`up` passes them.
"""

from __future__ import annotations

from collections.abc import Sequence

from qpnserve.preflight.facts import Facts
from qpnserve.preflight.report import CheckResult, result
from qpnserve.speculation import decide, route_meaning

NAME = "toolchain.speculation"


def check_speculation(facts: Facts, server_args: Sequence[str] | None, awq_m1: bool) -> CheckResult:
    if facts.env is None:
        return result(NAME, "SKIP", "toolchain facts were not probed")
    config = facts.checkpoint.config if facts.checkpoint is not None else None
    devices = facts.gpu.devices if facts.gpu is not None else []
    capability = devices[0].compute_capability if devices else None
    package_dir = facts.host.package_dir if facts.host is not None else None
    spec = decide(
        server_args or [],
        facts.env,
        config,
        compute_capability=capability,
        host_package_dir=package_dir if facts.source == "probed" else None,
    )
    line = route_meaning(spec)
    unseen = (
        "; the server's own arguments are not known to `check` (`up` checks them)"
        if server_args is None
        else ""
    )
    if spec.on and awq_m1:
        return result(
            NAME,
            "WARN",
            line,
            "drop --speculative-config for the route to serve decode, or run without the route",
        )
    if spec.on is None and awq_m1:
        return result(
            NAME, "WARN", line + unseen, "pass --speculative-config explicitly, or leave it out"
        )
    return result(NAME, "PASS", line + unseen)
