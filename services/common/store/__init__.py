"""Storage interfaces (ports_*.py, one per store) and their backends: embedded SQLite and
Cassandra."""
