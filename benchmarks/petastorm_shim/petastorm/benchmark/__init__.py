"""``petastorm.benchmark``: unihub's reader throughput benchmark."""
