"""One module per revision of mlrc's tables (``schema_N``: mlrc_meta.schema_version N)."""
