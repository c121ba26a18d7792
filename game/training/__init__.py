"""Deterministic training core: rounding, rounding log, hashing, RNG, presets, profiles, step engine."""
