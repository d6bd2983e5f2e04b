"""Search spaces, the 4-fold objective, backends (arrives with the end-to-end study issue)."""
