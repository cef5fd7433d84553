"""``petastorm.etl``: the dataset-writing side of unihub under Petastorm's package."""
