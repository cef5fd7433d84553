"""``petastorm.tools``: unihub's dataset tools under Petastorm's package."""
