"""Filesystems: local paths and URLs (s3://, gs://, hdfs://) as pyarrow filesystems, remote faults, atomic files."""
