"""Tables and dashboards, read from the store only (arrives with the reporting issue)."""
