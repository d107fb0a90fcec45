"""Evidence packages: building one handoff's package from the store, exporting many,
verifying them, and why each anomaly kind in a package flagged its handoff."""
