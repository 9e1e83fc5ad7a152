"""Capture: the Debezium runner (Java), the py4j bridge, the Spark session and the hand-over of batches."""
