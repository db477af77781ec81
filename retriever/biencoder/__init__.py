"""The bi-encoder family: the pair scorer, its training, distillation and the adapted encoder."""
