"""dspark: train, export, serve, benchmark and publish DSpark speculative-decoding drafts."""

__version__ = "0.1.0"
