"""PySpark jobs over the store (compaction, reports); they arrive with the analytics work."""
