"""The replication audit: brokers write events (events.py, schema.py); a PySpark job reads them
(lag.py) and reports lag, loss, duplicates and order (report.py). design/audit-events.md."""
