"""Study and preset schema, YAML loading (arrives with the end-to-end study issue)."""
