"""The referee's instruments: frozen CSV schema, SNR, timing, shapes, quick_test_bench and gate.

A campaign never edits these files; their hash is recorded in every benchmark sidecar.
"""

# Imported first: on a machine without a GPU it turns the Triton interpreter on, which must happen
# before anything imports triton.
import kernels  # noqa: F401
