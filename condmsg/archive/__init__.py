"""The Parquet archive: its layout (which the Spark audit reads) and ``condmsg export``."""
