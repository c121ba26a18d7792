"""A trainer's transcript on disk: its layout (the one place that names its files), the manifest,
the threaded writer and the reader the auditor, the judge and the client use."""
