"""Mamba ops on state slots in the shared buffer (filled in by the Mamba work)."""
