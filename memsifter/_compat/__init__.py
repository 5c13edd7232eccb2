"""Compatibility shims for third-party packages that lag behind our pinned dependencies."""
