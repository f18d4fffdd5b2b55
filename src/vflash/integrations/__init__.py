"""Adapters that run vflash inside other frameworks (each imports its framework lazily)."""
