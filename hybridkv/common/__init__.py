"""Leaf helpers shared by every layer: byte units, environment settings, optional extras,
user-facing errors. Imports nothing else of hybridkv."""
