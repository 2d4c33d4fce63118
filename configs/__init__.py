"""Shipped model layouts (YAML); installed as the data package ``hybridkv.configs``."""
