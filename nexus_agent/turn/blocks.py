"""The candidates' schema KV, spliced: each tool's JSON in the tools section is a block, compiled on first use.

A candidate's JSON is tokenized on its own (`Tokenizer.encode_chat_tools`), so it is the same tokens wherever
it stands in the tools section. The first time a tool is shown it is prefilled as text in place and its KV
range is exported into `ToolBlocks` (an LRU keyed by the tool's tokens); every later time the block is spliced
at its new depth (`splice.splicer.splice_or_text`: the keys re-anchored by RoPE, the first `head` tokens decoded
as text, which repairs most of what a block computed after other tools gets wrong: DESIGN section 6). The
prompt's head (system text, tools preamble) and tail (the conversation) are prefilled as text, the head
usually reused from the live context's prefix.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

from splice.profile import RepairPlan
from splice.splicer import splice_or_text, tokens_match

DEFAULT_HEAD = 48  # measured: 16 leaves the names misread, 48 matches text on Qwen2.5-Coder-0.5B
MAX_BLOCKS = 512  # ~1-2 MB each for a 0.5B model: an upper bound of ~1 GB


@dataclass
class SpliceStats:
    spliced: int = 0  # blocks spliced
    compiled: int = 0  # tool segments prefilled as text and kept as blocks
    text_tokens: int = 0  # tokens prefilled as text (head, tail, repairs, first sights)
    ms: float = 0.0
    refused: str | None = None  # the backend's reason when it refused a block (the tool went in as text)


class ToolBlocks:
    """An LRU of tool blocks for one backend: tokens -> KVRange."""

    def __init__(self, backend, head: int = DEFAULT_HEAD, capacity: int = MAX_BLOCKS):
        self.backend, self.capacity = backend, capacity
        self.plan = RepairPlan("head", head)
        self.blocks: OrderedDict[str, object] = OrderedDict()

    @staticmethod
    def key(tokens: list[int]) -> str:
        return hashlib.blake2b(repr(tokens).encode(), digest_size=16).hexdigest()

    def get(self, tokens: list[int]):
        k = self.key(tokens)
        kv = self.blocks.get(k)
        if kv is not None:
            self.blocks.move_to_end(k)
        return kv

    def put(self, tokens: list[int], kv) -> None:
        self.blocks[self.key(tokens)] = kv
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def compile(self, head: list[int], segments: list[list[int]]) -> int:
        """Compile the blocks of `segments` (tool JSON tokens) not held yet, each right after `head` (the
        prompt up to the tools section's first tool) in a scratch session: the canonical place, as
        `nexus compile` does for schema segments. Returns how many were compiled."""
        todo = [s for s in segments if self.get(s) is None]
        if not todo:
            return 0
        session = self.backend.new_session(len(head) + max(len(s) for s in todo) + 8)
        try:
            session.prefill(list(head))
            m0 = session.n_past
            for seg in todo:
                session.prefill(list(seg))
                self.put(list(seg), session.export_kv(m0, m0 + len(seg)))
                session.remove(m0, session.n_past)
        finally:
            session.close()
        return len(todo)

    def prefill(self, live, ids: list[int], spans: list[tuple[int, int]]) -> tuple:
        """Make `live` hold `ids` with every span in `spans` spliced from its block (or prefilled and kept);
        (logits after `ids`, SpliceStats)."""
        t0 = time.perf_counter()
        st = SpliceStats()
        session = live.session
        keep = 0
        for a, b in zip(live.ids, ids):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)
        if keep < session.n_past:
            session.remove(keep, session.n_past)
        live.ids = list(ids[:keep])
        pos = keep
        for a, b in spans:
            if b <= pos:
                continue
            seg = list(ids[max(a, pos):b])
            if a < pos:  # a tool partly cached already: its rest as text
                session.prefill(seg)
                st.text_tokens += len(seg)
            else:
                if a > pos:
                    session.prefill(list(ids[pos:a]))
                    st.text_tokens += a - pos
                kv = self.get(seg)
                if kv is not None and tokens_match(kv, seg):
                    n, refused = splice_or_text(session, kv, self.plan)
                    st.text_tokens += n
                    if refused:
                        st.refused = refused
                        self.blocks.pop(self.key(seg), None)  # it would be refused again
                    else:
                        st.spliced += 1
                else:
                    start = session.n_past
                    session.prefill(seg)
                    self.put(seg, session.export_kv(start, start + len(seg)))
                    st.text_tokens += len(seg)
                    st.compiled += 1
            pos = b
        logits = session.prefill(list(ids[pos:]))
        st.text_tokens += len(ids) - pos
        live.ids = list(ids)
        st.ms = (time.perf_counter() - t0) * 1e3
        return logits, st
