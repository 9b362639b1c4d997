"""TLX kernels for Hopper (sm_90a). Compile-verified offline only so far; see forward.py."""
