"""The semantic lookaside buffer: INT8 tool embeddings, a Numba scan, a calibrated margin gate and a reranker."""
