"""The auditor agent (see docs/architecture.md)."""
