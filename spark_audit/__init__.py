"""spark_audit package."""
