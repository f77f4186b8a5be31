"""Drafts of the request's next values (nexus_agent.arguments.drafts) fed ahead and verified by `generate_step`,
on the packaged Qwen model: the same copy, in fewer forward passes than tokens."""

from __future__ import annotations

import json

import pytest

from native.base import Session
from nexus_agent.arguments.constrained import generate_json
from nexus_agent.arguments.copy_sources import Source
from nexus_agent.arguments.drafts import SourceDraft, copy_processors, variants
from nexus_agent.prompts import argument_messages

MATMUL = {"type": "object", "properties": {
    "matA": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "matB": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}},
    "required": ["matA", "matB"]}
REQUEST = ("Multiply the matrix [[1, 2, 3], [4, 5, 6], [7, 8, 9]] by [[10, 11, 12], [13, 14, 15], [16, 17, 18]] "
           "for me.")


def test_variants_write_the_request_as_compact_json_too():
    assert variants("[[1, 2], [3, 4]] and {'a': 1}") == [b"[[1, 2], [3, 4]] and {'a': 1}",
                                                        b"[[1,2],[3,4]] and {'a':1}"]
    assert variants('say "hi"') == [b'say \\"hi\\"']  # as a JSON string holds it; nothing to compact


class Counting:
    """A session whose forward passes are counted (a pass: one decode, prefill or forward_logits call)."""

    def __init__(self, session: Session):
        self.s, self.passes = session, 0

    def __getattr__(self, name):
        return getattr(self.s, name)

    def _count(self, f, *a):
        self.passes += 1
        return f(*a)

    def prefill(self, tokens):
        return self._count(self.s.prefill, tokens)

    def decode(self, token):
        return self._count(self.s.decode, token)

    def forward_logits(self, tokens):
        return self._count(self.s.forward_logits, tokens)


def _matmul(backend, drafts: bool):
    tok = backend.tokenizer
    ids = tok.encode_chat(argument_messages("mat_mul(matA: int[][], matB: int[][])", REQUEST))
    s = backend.new_session(2048)
    try:
        logits = s.prefill(ids)
        counted = Counting(s)
        procs = copy_processors(tok, [Source("request", REQUEST)], MATMUL, 4.0, counted, drafts)
        r = generate_json(counted, ids, MATMUL, tok, 120, processors=procs, logits=logits)
    finally:
        s.close()
    assert r.error is None and r.complete, r
    return json.loads(r.text), len(r.tokens), counted.passes, procs[-1]


@pytest.mark.parametrize("backend_name", ["llamacpp", "mlx"])
def test_a_matrix_is_copied_in_fewer_passes_than_tokens(qwen_backends, backend_name):
    backend = qwen_backends(backend_name)
    value, n_tokens, passes, draft = _matmul(backend, drafts=True)
    assert value == {"matA": [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "matB": [[10, 11, 12], [13, 14, 15], [16, 17, 18]]}
    assert isinstance(draft, SourceDraft) and draft.log  # drafts were named and resolved
    assert sum(taken for _, taken in draft.log) >= 10  # drafted tokens the decode took
    plain, n_plain, passes_plain, _ = _matmul(backend, drafts=False)
    assert plain == value
    assert passes < n_tokens and passes < passes_plain, (passes, n_tokens, passes_plain)
