"""The decision's candidate blocks (`nexus_agent.turn.blocks.ToolBlocks`) on the packaged SmolLM2 (llama.cpp):
a tool's JSON prefilled as text the first time it is shown is kept as a block; shown again at another depth it
is spliced (re-anchored, its head re-decoded as text) and the next-token logits stay those of text prefill; a
block the backend refuses goes in as text, with the reason, and is dropped."""

from __future__ import annotations

import dataclasses

import numpy as np
from logits import kl

from nexus_agent.memory import LiveContext
from nexus_agent.turn.blocks import ToolBlocks

SYSTEM = "You may call one of these tools.\n"
TOOLS = ['{"name": "get_weather", "description": "Get the weather forecast for a city and a day.", '
         '"parameters": {"city": {"type": "string"}, "day": {"type": "string"}}}',
         '{"name": "send_email", "description": "Send an email with a subject and a body to one recipient.", '
         '"parameters": {"to": {"type": "string"}, "subject": {"type": "string"}}}',
         '{"name": "set_timer", "description": "Start a countdown timer that rings after some minutes.", '
         '"parameters": {"minutes": {"type": "integer"}}}']
USER = "\nUser: will it rain in Oslo tomorrow?\nAssistant:"


def _prompt(tok, order: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    ids, spans = tok.encode(SYSTEM), []
    for i in order:
        seg = tok.encode("\n" + TOOLS[i])
        spans.append((len(ids), len(ids) + len(seg)))
        ids += seg
    return ids + tok.encode(USER), spans


def test_blocks_are_compiled_once_and_spliced_at_another_depth(llamacpp_backend):
    b = llamacpp_backend
    blocks = ToolBlocks(b, head=8)
    first, spans1 = _prompt(b.tokenizer, [0, 1, 2])
    live = LiveContext(b, None, 1024)
    _, st = blocks.prefill(live, first, spans1)
    assert (st.compiled, st.spliced, st.refused) == (3, 0, None) and len(blocks.blocks) == 3
    moved, spans2 = _prompt(b.tokenizer, [2, 0, 1])  # every tool at another depth
    other = LiveContext(b, None, 1024)
    got, st = blocks.prefill(other, moved, spans2)
    assert (st.compiled, st.spliced) == (0, 3) and other.ids == moved and other.session.n_past == len(moved)
    assert st.text_tokens < len(moved) - 3 * 20  # the blocks' bodies were not prefilled
    text = LiveContext(b, None, 1024)
    want = text.prefill(moved)
    # measured here: KL 0.008 nats with the 8-token head repair (0.019 with none), the same next token
    assert kl(want[None], got[None]).max() < 0.1 and int(np.argmax(got)) == int(np.argmax(want))
    for c in (live, other, text):
        c.close()


def test_a_refused_block_goes_in_as_text_and_is_dropped(llamacpp_backend):
    b = llamacpp_backend
    blocks = ToolBlocks(b, head=8)
    first, spans1 = _prompt(b.tokenizer, [0, 1])
    live = LiveContext(b, None, 1024)
    blocks.prefill(live, first, spans1)
    seg = first[spans1[1][0]:spans1[1][1]]
    kv = blocks.get(seg)
    blocks.put(seg, dataclasses.replace(kv, blob=kv.blob[: len(kv.blob) // 2]))  # a state llama.cpp cannot load
    moved, spans2 = _prompt(b.tokenizer, [1, 0])
    other = LiveContext(b, None, 1024)
    got, st = blocks.prefill(other, moved, spans2)
    assert st.refused and st.refused.startswith("the backend refused the block: ")
    assert st.spliced == 1 and blocks.get(seg) is None and other.session.n_past == len(moved)
    text = LiveContext(b, None, 1024)
    want = text.prefill(moved)
    assert int(np.argmax(got)) == int(np.argmax(want))
    for c in (live, other, text):
        c.close()
