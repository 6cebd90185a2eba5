"""Print the sm_70 register/spill report of the operator (NVRTC + ptxas 12.8 from PyPI).

    python scripts/sm70_gate.py [--json]

Exit 0 when every kernel that runs on sm_70 is spill-free with 128-bit loads, 1 otherwise.
"""

from __future__ import annotations

import sys

from qpnserve.kernels.sm70_gate import main

if __name__ == "__main__":
    sys.exit(main())
