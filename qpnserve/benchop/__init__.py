"""`qpnserve bench op`: the operator against its read floor, the copy bandwidth and two baselines.

route_bytes (pure byte arithmetic), report (pydantic model, summarize, ratios, table), banks
(TP4-shaped random banks and the FP64 reference check), contenders (the PyTorch and dense FP16
baselines and the op and floor calls), runner (graphs, timing, the order of checks).
Importing this package imports no torch; the modules that need torch import it themselves.
"""
