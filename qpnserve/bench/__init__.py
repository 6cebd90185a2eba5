"""The server benchmark: `bench smoke`, `bench compare`, `bench ab`.

client.py (effects: HTTP streaming), summarize.py (pure metrics), smoke.py (the run),
compare.py (pure deltas), render.py (tables), ab.py (route off vs on through the lifecycle).
Nothing is imported here so `import qpnserve.bench.summarize` stays light.
"""
