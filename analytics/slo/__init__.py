"""Service-level objectives: the rules file, burn-rate alerts, their counts from the store,
the health verdict and the weekly report's SLO section."""
