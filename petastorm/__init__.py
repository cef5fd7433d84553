"""Petastorm compatibility: its pickled Unischema read without running it, and its metadata written back."""
