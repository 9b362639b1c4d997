"""TLX kernels for Hopper (sm_90a): the forward, the dK/dV kernel with its fused dQ, and the row statistics pass."""
