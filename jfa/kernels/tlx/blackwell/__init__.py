"""sm_100a (Blackwell) TLX kernels: tensor memory accumulators, tcgen05 MMA completing on mbarriers.
Simulated on the CPU (``jfa.sim``, arch (10, 0)) and compile-gated for sm_100a; they run wherever a B200 is."""
