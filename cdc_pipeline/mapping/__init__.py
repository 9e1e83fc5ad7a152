"""Mapping: the object-mapping rules (names, types, transforms) and the guard on transforms."""
