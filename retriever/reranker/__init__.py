"""The cross-encoder reranker, one model family in one place: `base.py` (what every runtime shares: the saved
model's layout, its decision boundary, the first stage its threshold is calibrated behind, pair scoring),
`model.py` (the model and its heads on PyTorch), `onnx.py` (its ONNX export and graph on ONNX Runtime, through the
backend of `index.onnx`), `training.py` (fine-tuning, best epoch by a dev score) and `losses.py` (its training
losses)."""
