"""`qpnserve verify`: the route's numerics acceptance on the user's own checkpoint.

Modules (read in this order):
    samples.py    the seeded synthetic samples: router picks and activations per (layer, prefix)
    export.py     reads the checkpoint's exported AWQ tensors (qweight, qzeros, scales) per expert
    reference.py  the FP64 reference decoded from those tensors (contract section 4's roundings)
    prepare.py    qpnserve's own bank preparation (contract section 3), with deliberate faults
    bounds.py     the fraction of the retained rounding bound used (pure)
    offline.py    `verify --offline`: plan, cost, run the operator, compare, report
    report.py     the report record, its table and its verdict

Importing this package stays trivial (no torch, no numpy).
"""
