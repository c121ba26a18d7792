"""What a task is: its config and spec hash, the presets (models, data, optimizers), its inputs'
digests. Data files ride along: ``presets/`` (example tasks) and
``calibrated/`` (each preset's divergence bands)."""
