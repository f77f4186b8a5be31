"""The dynamic INT8 embedder: its own model_id, unit vectors close to the float model's, and a buffer built with
it is routed with it."""

from __future__ import annotations

import numpy as np

from registry.store import RegistryStore
from slb.embedder import Embedder, EmbedderConfig

from .test_learn import TOOLS


def test_quantized_embedder_is_a_different_model_with_close_vectors():
    f, q = Embedder(EmbedderConfig()), Embedder(EmbedderConfig(quantize=True))
    assert f.model_id != q.model_id and "+qint8#" in q.model_id
    texts = ["find hotels in Rome for next week", "status of flight LH 400"]
    xf, xq = f.embed_texts(texts), q.embed_texts(texts)
    np.testing.assert_allclose(np.linalg.norm(xq, axis=1), 1.0, atol=1e-5)
    assert (np.sum(xf * xq, axis=1) > 0.85).all()
    assert float(xq[0] @ xq[1]) < 0.6  # still tells the two requests apart


def test_open_router_uses_the_embedder_the_buffer_was_built_with(nexus_home):
    from slb.service import build, open_router

    with RegistryStore() as store:
        store.add_tools(TOOLS)
        build(store, EmbedderConfig(quantize=True))
        router = open_router(tools=None)
    assert router.embedder.config.quantize
    assert router.route("is flight LH 400 delayed").tool == "flight_status"


def test_one_query_path_gives_the_batch_path_vectors(embedder):
    """`embed_query` runs the model's modules on one text without `encode`: the vectors `embed_texts` gives
    for that text alone, unit length, on the float and the INT8 model (float tolerance: measured 1 - 1e-7).
    In a batch of three the float model agrees too; the INT8 one does not (dynamic quantization scales each
    batch's activations together: cosine 0.97 measured)."""
    texts = ["find hotels in Rome for next week", "status of flight LH 400", "Add 12 and 30, then multiply by 3"]
    for e in (embedder, Embedder(EmbedderConfig(quantize=True))):
        alone = np.stack([e.embed_texts([t])[0] for t in texts])
        one = np.stack([e.embed_query(t) for t in texts])
        assert one.dtype == np.float32 and one.shape == alone.shape
        np.testing.assert_allclose(np.linalg.norm(one, axis=1), 1.0, atol=1e-5)
        assert (np.sum(one * alone, axis=1) > 0.9999).all()
    assert (np.sum(embedder.embed_texts(texts) * np.stack([embedder.embed_query(t) for t in texts]), axis=1)
            > 0.9999).all()
