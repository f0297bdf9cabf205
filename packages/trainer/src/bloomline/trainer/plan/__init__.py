"""Planning: a recipe built for one rank of its real world size, on one CPU, without the
hardware. ``fake_world.py`` stands up torch.distributed with the fake backend (no peers, no
communication), ``rank_build.py`` builds that rank's model through the trainer's own
parallelization path on the meta device and reports what the rank holds. See README.md.
"""
