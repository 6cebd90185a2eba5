"""The AWQ M=1 MoE operator: build/load the extension (build), call it (ops), check it (reference).

Nothing here imports torch at import time.
"""
