"""The V100 (sm_70) projection of the AWQ M1 op, calibrated on the host's own sm_70 kernels.

wheels: fetch registry wheels by name into a user cache (never into the tree).
sass: pure parsing of cuobjdump listings. model: the pure V100 timing model.
builds: compile our kernels and read the host's. cli.py is the entry point
(``python -m tools.sm70proj``).
"""
