"""Bytes on disk: atomic writes and torch's zip archive. Nothing here knows about tensors."""
