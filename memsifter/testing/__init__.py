"""Offline test helpers: tiny, seeded stand-ins for hub models so tests never download weights."""

from memsifter.testing.tiny_models import build_tiny_bge_m3, build_tiny_qwen3

__all__ = ["build_tiny_bge_m3", "build_tiny_qwen3"]
