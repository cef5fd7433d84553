"""What a dataset holds: the Unischema, field dtypes, codecs, validation, inference and their JSON form."""
