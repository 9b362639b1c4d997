"""What every TLX kernel shares: device-side jit helpers (``device``), host-side layout rules, TMA
descriptors and offline compile specs (``host``), and the execution targets launches go through
(``target``). Architecture-specific kernels live beside this package (``hopper/``)."""
