"""Storage interfaces (ports.py) and their backends: embedded SQLite and Cassandra."""
