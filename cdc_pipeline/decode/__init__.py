"""Decode: a batch's event index and row images, and the offsets of each source type."""
