"""Kernels: faster implementations of ops the model defines, chosen per call, never changing
what is computed beyond roundoff (and bit for bit on a given machine, so resumes repeat).

The model imports their entry points (torchtitan's "overrides" idea); the choice of kernel
is made here, not in ``model/``. ``cpu/`` holds the CPU ones: ``linear.py`` (fp32 products on
oneDNN where chosen), ``gelu.py`` (BLOOM's GELU in its sigmoid form, compiled),
``attention_core.py`` (the eager attention core as one autograd node), ``vector_math.py``
(the first call of MKL's vector math made once, where it cannot race). Measurements:
docs/perf/cpu-kernels.md.
"""
