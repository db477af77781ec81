"""medfaq: training the retriever's bi-encoder and cross-encoder."""
