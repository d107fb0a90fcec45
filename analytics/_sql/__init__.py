"""The SQL the loaders run: the cohort window they share, the contract's fragments, the
anomaly passes, the settled tables and the schema files generated from them."""
