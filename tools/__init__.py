"""Maintainer tools, not shipped in the dspark package."""
