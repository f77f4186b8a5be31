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


def _files(folder) -> list:
    return sorted(folder.glob("*.kvb"))


def _like_text(b, ids: list[int], got: np.ndarray) -> None:
    """The logits after `ids` in a context with spliced blocks are those of text prefill (KL < 0.1 nats, the same
    next token)."""
    text = LiveContext(b, None, 1024)
    want = text.prefill(ids)
    text.close()
    assert kl(want[None], got[None]).max() < 0.1 and int(np.argmax(got)) == int(np.argmax(want))


def _three_compiled(b, folder):
    """ToolBlocks over `folder` after a prompt showed the three tools (compiled in place, not yet written)."""
    blocks = ToolBlocks(b, head=8, folder=folder)
    live = LiveContext(b, None, 1024)
    blocks.prefill(live, *_prompt(b.tokenizer, [0, 1, 2]))
    live.close()
    return blocks


def test_blocks_are_written_while_idle_and_read_back_by_another_process(llamacpp_backend, tmp_path):
    b = llamacpp_backend
    first = _three_compiled(b, tmp_path)
    assert first.pending == 3 and _files(tmp_path) == []  # nothing written on the request path
    assert first.save() == 3 and len(_files(tmp_path)) == 3 and first.pending == 0
    again = ToolBlocks(b, head=8, folder=tmp_path)  # as a restarted server: nothing in memory
    moved, spans2 = _prompt(b.tokenizer, [2, 0, 1])
    other = LiveContext(b, None, 1024)
    got, st = again.prefill(other, moved, spans2)
    assert (st.compiled, st.spliced, again.loaded, again.pending) == (0, 3, 3, 0)
    _like_text(b, moved, got)
    other.close()


def test_a_corrupt_block_file_is_compiled_again_and_the_folder_kept_under_its_bound(llamacpp_backend, tmp_path):
    b = llamacpp_backend
    _three_compiled(b, tmp_path).save()
    victim = _files(tmp_path)[0]
    all_three = sum(f.stat().st_size for f in _files(tmp_path))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the payload: the checksum refuses it
    victim.write_bytes(bytes(data))
    fresh = ToolBlocks(b, head=8, folder=tmp_path)
    other = LiveContext(b, None, 1024)
    _, st = fresh.prefill(other, *_prompt(b.tokenizer, [2, 0, 1]))
    assert (st.compiled, st.spliced, fresh.loaded) == (1, 2, 2) and not victim.exists()
    fresh.disk_bytes = all_three - 1  # room for two of the three files (the same sizes once recompiled)
    assert fresh.save() == 1 and len(_files(tmp_path)) == 2 and victim.exists()  # the newest file stays
    other.close()


def test_idle_work_compiles_queued_blocks_a_chunk_at_a_time_and_gives_way(llamacpp_backend, tmp_path, monkeypatch):
    import nexus_agent.turn.blocks as blocks_mod

    b = llamacpp_backend
    monkeypatch.setattr(blocks_mod, "IDLE_CHUNK", 8)  # the tools' ~40 tokens take several chunks
    blocks = ToolBlocks(b, head=8, folder=tmp_path)

    def render(i: int):
        ids, ((a, z),) = _prompt(b.tokenizer, [i])
        return ids[:a], ids[a:z]

    blocks.queue(render, [0, 1, 2])
    answers = iter([False, False, True])  # free, then one chunk, then a request arrives
    assert blocks.idle_step(lambda: next(answers)) is True
    head, session = blocks.scratch
    assert len(blocks.todo) == 3 and blocks.compiled == 0 and session.n_past == len(head)  # the partial block dropped
    steps = 1
    while blocks.idle_step():
        steps += 1
    assert steps == 4 and blocks.compiled == 3 and len(_files(tmp_path)) == 3 and blocks.scratch is None
    ids, spans = _prompt(b.tokenizer, [1, 2, 0])
    live = LiveContext(b, None, 1024)
    got, st = blocks.prefill(live, ids, spans)
    assert (st.compiled, st.spliced) == (0, 3)
    _like_text(b, ids, got)
    live.close()


def test_without_idle_work_blocks_are_written_every_few(llamacpp_backend, tmp_path, monkeypatch):
    import nexus_agent.turn.blocks as blocks_mod

    monkeypatch.setattr(blocks_mod, "SAVE_AFTER", 2)  # as nexus mcp, which has no idle loop to write them
    blocks = _three_compiled(llamacpp_backend, tmp_path)
    assert len(_files(tmp_path)) == 2 and blocks.pending == 1


def test_a_block_computed_after_the_same_tokens_is_spliced_without_repair(llamacpp_backend):
    b = llamacpp_backend
    blocks = ToolBlocks(b, head=8)
    ids, spans = _prompt(b.tokenizer, [1, 0])
    (a1, z1), (a2, z2) = spans
    blocks.compile(ids[:a1], [ids[a1:z1], ids[a2:z2]])  # both right after the system text, as idle work does
    live = LiveContext(b, None, 1024)
    got, st = blocks.prefill(live, ids, spans)
    # the first tool stands where it was compiled, after the same tokens: imported as is; the second is repaired
    assert (st.spliced, st.exact, st.compiled) == (2, 1, 0)
    assert st.text_tokens == a1 + 8 + (len(ids) - z2)
    _like_text(b, ids, got)
    live.close()
