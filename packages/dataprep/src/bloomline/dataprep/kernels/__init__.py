"""The numba-compiled loops behind the sample and blend indices.

Empty on purpose: importing numba takes a noticeable while, so callers import a kernel module
at first use (``from bloomline.dataprep.kernels import blend``), and a ``dataprep`` command
that builds no large index never pays for it.
"""
