"""What data looks like on disk: the Unischema, codecs, the Parquet store, foreign formats."""
