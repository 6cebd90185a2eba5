"""The vLLM general plugin (entry point ``vllm.general_plugins: qpnserve_awq_m1``).

vLLM calls register() once in every process it starts (API server, engine core, each tensor-
parallel worker), before the model loads. Import of this module is trivial (stdlib and qpnserve's
flag parser only): an import error would be logged by vLLM and the server would go on without the
plugin, so every check happens inside register(), where an exception stops the process.

- flag unset or "0": return at once; no extension lookup, no host import, no wrapping;
- any other value than "0"/"1": DispatchError naming the variable and the accepted values;
- "1": qpnserve.dispatch.runtime.activate() (host check, manifest drift check, prebuilt
  extension load, wrapping: fail closed). On a native host only an observer, which never
  raises: any failure is one warning line and the server goes on with its own route.
  Re-entrant: a second call in the same process finds the class marker and changes nothing.
  Never initialises CUDA.
"""

from __future__ import annotations

import os

from qpnserve.config import ROUTE_FLAG
from qpnserve.dispatch.flag import parse_route_flag


def register() -> None:
    if not parse_route_flag(os.environ.get(ROUTE_FLAG.name)):
        return
    from qpnserve.dispatch.runtime import activate

    activate()
