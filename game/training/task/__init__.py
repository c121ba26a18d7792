"""What a task is: its config and spec hash, the presets (models, data, optimizers) and the hardware
profiles a party runs them on. Data files ride along: ``presets/`` (example tasks) and
``calibrated/`` (each preset's divergence bands)."""
