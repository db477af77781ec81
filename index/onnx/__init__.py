"""The ONNX Runtime backend shared by the bi-encoder and the cross-encoder: `graph.py` (an export on disk and its
graph, run with onnxruntime + tokenizers), `export.py` (the exporter and its int8 quantisation, run once with
torch; `ensure_export`), `check.py` (a derived graph checked against its fp32 source before it is used) and
`encoder.py` (the bi-encoder on ONNX Runtime)."""
