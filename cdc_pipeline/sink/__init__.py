"""Sink: the batch plan and its transaction in the destination, the catalog, the executors' staging."""
