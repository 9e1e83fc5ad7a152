"""Per source type: what the pipeline knows of a source database outside Debezium."""
