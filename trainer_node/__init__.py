"""The trainer agent (see docs/architecture.md)."""
