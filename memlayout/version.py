"""The release, in the base layer so that every layer can name it without importing the public API."""

__version__ = "0.1.0"
