"""The SQL the loaders run: the cohort window they share, the contract's fragments, the
anomaly passes, the settled tables, and the generators of the schema files in sql/ that
derive from them (`python -m analytics._sql.<module>`)."""
