"""Numerics: rounding to the grid, the log's trits, the divergence bands and their checks, the RNG,
and the same kernels for CUDA in Triton (what every machine must compute bit for bit)."""
