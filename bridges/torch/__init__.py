"""PyTorch: Petastorm's loaders, torch datasets over unihub readers, and the batches workers hand over."""
