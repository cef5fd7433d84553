"""The canonical store: Parquet files described by a Unischema, written atomically and read back checked."""
