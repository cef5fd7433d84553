"""One subpackage per framework (torch, tf, dali, spark), each importing its framework lazily."""
