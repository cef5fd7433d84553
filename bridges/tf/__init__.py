"""TensorFlow: tf.data datasets over unihub readers, TF1 graph tensors, and reader positions in checkpoints."""
