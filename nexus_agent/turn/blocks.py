"""The candidates' schema KV, spliced: each tool's JSON in the tools section is a block, compiled on first use.

A candidate's JSON is tokenized on its own (`Tokenizer.encode_chat_tools`), so it is the same tokens wherever
it stands in the tools section. The first time a tool is shown it is prefilled as text in place and its KV
range is exported into `ToolBlocks` (an LRU keyed by the tool's tokens); every later time the block is spliced
at its new depth (`splice.splicer.splice_or_text`: the keys re-anchored by RoPE, the first `head` tokens decoded
as text, which repairs most of what a block computed after other tools gets wrong: DESIGN section 6). The
template's text after the tools (Qwen2.5's `</tools>`, its call-format instructions, the user turn's opener) is
the same under every tool list: it is a block too, spliced with `epilogue_plan`. The prompt's head (system text,
tools preamble) and the conversation are prefilled as text, the head usually reused from the live context's
prefix.

With a `folder` (`decider_for` gives the Nexus home's `blocks/<fingerprint>/<backend>/tools`), blocks outlive
the process: a block compiled during a request is written out by `save` (called while idle, off the request
path; in a process without idle work, every SAVE_AFTER blocks and at its close), a block not in memory is read
back from its file (checked: `splice.block.load_block`), and the folder is kept under `disk_bytes`, least
recently used first out. `queue` + `idle_step` compile a tool list's blocks while the server has nothing else
to do, so a tool's first showing can splice as well.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from splice.block import BlockError, BlockKey, load_block, read_header, write_block
from splice.profile import RepairPlan
from splice.splicer import splice_or_text, tokens_match

# The repairs, measured on Qwen2.5-Coder-0.5B at 250 tools, top 5, 30 items (seed 2; README, *Deciding*): with the
# text after the tools spliced after a 16-token repair and a 48-token head per tool, the same decision as text
# prefill for 29 (the shipped decide profile; the text after the tools prefilled: 30), p(call) 0.019 from text's
# on average (0.012), spliced prefill p50 3.0 s (3.35 s; text 10.0 s). 32- and 24-token heads: 27 and 26 of 30
# in 2.35 and 2.0 s, picking another tool for relevant requests (16 leaves the names misread).
DEFAULT_HEAD = 48
EPILOGUE_HEAD = 16
MAX_BLOCKS = 512  # ~1-2 MB each for a 0.5B model: an upper bound of ~1 GB
SAVE_AFTER = 16  # unsaved blocks written at once where no idle work writes them (nexus run, nexus mcp)
IDLE_CHUNK = 64  # tokens per prefill call while idle: a request that arrives waits at most one chunk (~0.5 s)
DISK_BYTES = 4 << 30  # the folder's bound: ~2,000 tools of a 0.5B model (1.9 MB each), ~900 of the 1.5B

log = logging.getLogger(__name__)


@dataclass
class SpliceStats:
    spliced: int = 0  # blocks spliced
    compiled: int = 0  # tool segments prefilled as text and kept as blocks
    text_tokens: int = 0  # tokens prefilled as text (head, tail, repairs, first sights)
    ms: float = 0.0
    refused: str | None = None  # the backend's reason when it refused a block (the tool went in as text)
    exact: int = 0  # of the spliced, blocks computed after the very tokens before them: spliced without repair


class ToolBlocks:
    """An LRU of tool blocks for one backend (tokens -> KVRange), over a folder of block files when given."""

    def __init__(self, backend, head: int = DEFAULT_HEAD, capacity: int = MAX_BLOCKS, folder: Path | None = None,
                 disk_bytes: int = DISK_BYTES):
        self.backend, self.capacity, self.disk_bytes = backend, capacity, disk_bytes
        self.folder = Path(folder) if folder is not None else None
        self.plan = RepairPlan("head", head)
        self.epilogue_plan = RepairPlan("head", EPILOGUE_HEAD)
        self.blocks: OrderedDict[str, object] = OrderedDict()
        self.after: dict[str, str] = {}  # key -> key of the tokens the block was computed after
        self.unsaved: OrderedDict[str, object] = OrderedDict()  # compiled, not written yet (`save`)
        self.todo: deque = deque()  # (render, tool) to compile while idle (`queue`, `idle_step`)
        self.scratch: tuple | None = None  # (head, session) of the last compile
        self.loaded = self.saved = self.compiled = 0

    @staticmethod
    def key(tokens: list[int]) -> str:
        return hashlib.blake2b(repr(tokens).encode(), digest_size=16).hexdigest()

    def _path(self, k: str) -> Path:
        return self.folder / f"{k}.kvb"

    def _expect(self, k: str) -> BlockKey:
        b = self.backend
        return BlockKey(backend=b.name, fingerprint=b.info.fingerprint, tokenizer=b.tokenizer.digest, tool="",
                        schema_hash=k)

    def get(self, tokens: list[int]):
        k = self.key(tokens)
        kv = self.blocks.get(k)
        if kv is not None:
            self.blocks.move_to_end(k)
        elif k in self.unsaved:  # out of the memory LRU before its file was written
            kv = self.unsaved[k]
            self._hold(k, kv)
        elif self.folder is not None and self._path(k).exists():
            try:
                header, kv = load_block(self._path(k), self._expect(k))
            except BlockError as e:  # corrupt or foreign: compiled again, the file replaced
                log.warning("%s", e)
                self._path(k).unlink(missing_ok=True)
                return None
            os.utime(self._path(k))  # most recently used: pruned last
            self.loaded += 1
            self._hold(k, kv, header.get("after"))
        return kv

    def held(self, tokens: list[int]) -> bool:
        k = self.key(tokens)
        return k in self.blocks or k in self.unsaved or (self.folder is not None and self._path(k).exists())

    def computed_after(self, tokens: list[int], before: list[int]) -> bool:
        """Whether the block of `tokens` is held (memory or folder) and was computed right after `before`."""
        k = self.key(tokens)
        if k in self.after:
            return self.after[k] == self.key(before)
        if self.folder is None or not self._path(k).exists():
            return False
        try:
            return read_header(self._path(k))[0].get("after") == self.key(before)
        except BlockError:
            return False

    def put(self, tokens: list[int], kv, after: list[int] | None = None) -> None:
        """Hold `kv`, the block of `tokens` computed after the tokens `after` (when known)."""
        k = self.key(tokens)
        self._hold(k, kv, self.key(after) if after is not None else None)
        self.compiled += 1
        if self.folder is not None:
            self.unsaved[k] = kv
            if len(self.unsaved) >= SAVE_AFTER:  # a process without idle time must not hold them all
                self.save()

    def _hold(self, k: str, kv, after: str | None = None) -> None:
        self.blocks[k] = kv
        if after is not None:
            self.after[k] = after
        while len(self.blocks) > self.capacity:
            gone, _ = self.blocks.popitem(last=False)
            if gone not in self.unsaved:
                self.after.pop(gone, None)

    def save(self) -> int:
        """Write the blocks compiled since the last save into the folder, then keep the folder under `disk_bytes`
        (least recently used files out); how many were written."""
        if self.folder is None or not self.unsaved:
            return 0
        b, n = self.backend, 0
        while self.unsaved:
            k, kv = self.unsaved.popitem(last=False)
            header = {"backend": b.name, "fingerprint": b.info.fingerprint, "tokenizer": b.tokenizer.digest,
                      "tool": "", "schema_hash": k, "context": 0, "after": self.after.get(k)}
            try:
                write_block(self._path(k), header, kv)
                n += 1
            except OSError as e:  # a full disk costs the block its file, not the request
                log.warning("tool block not saved: %s", e)
            if k not in self.blocks:  # out of memory already: its file holds the rest
                self.after.pop(k, None)
        self.saved += n
        files = []
        for f in self.folder.glob("*.kvb"):
            try:
                st = f.stat()
            except OSError:  # another process (nexus mcp, a second server) pruned it meanwhile
                continue
            files.append((st.st_mtime, st.st_size, f))
        files.sort()
        total = sum(size for _, size, _ in files)
        for _, size, f in files:
            if total <= self.disk_bytes:
                break
            f.unlink(missing_ok=True)
            total -= size
        return n

    def queue(self, render: Callable[[object], tuple[list[int], list[int]]], tools: Iterable) -> None:
        """Queue the blocks of `tools` to compile while idle; `render(tool) -> (head, segment)` gives a tool's
        tokens and the prompt before the tools section's first tool, called when its turn comes (rendering a
        thousand tools on the request path would cost seconds)."""
        self.todo.extend((render, t) for t in tools)

    @property
    def pending(self) -> int:
        """Blocks queued to compile or waiting to be written."""
        return len(self.todo) + len(self.unsaved)

    def idle_step(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """One unit of idle work: write what is unsaved, or compile the next queued block, IDLE_CHUNK tokens at a
        time; `stop()` true between chunks (a request is waiting) drops the partial block and requeues its tool
        first. Whether work remains."""
        if self.unsaved:
            self.save()
        while self.todo and not stop():
            render, tool = self.todo.popleft()
            head, seg = render(tool)
            if self.computed_after(seg, head):  # a block shown first deeper in a prompt is compiled again here:
                continue  # right after the head, it splices as is wherever it is the first candidate
            if not self._compile_one(head, seg, stop):
                self.todo.appendleft((render, tool))
                return True
            break
        if not self.todo:
            self.close_scratch()
        return self.pending > 0

    def compile(self, head: list[int], segments: list[list[int]]) -> int:
        """Compile the blocks of `segments` (tool JSON tokens) not held yet, each right after `head` (the
        prompt up to the tools section's first tool) in a scratch session: the canonical place, as
        `nexus compile` does for schema segments. Returns how many were compiled."""
        todo = [s for s in segments if not self.held(s)]
        if not todo:
            return 0
        for seg in todo:
            self._compile_one(head, seg)
        return len(todo)

    def _compile_one(self, head: list[int], seg: list[int], stop: Callable[[], bool] = lambda: False) -> bool:
        """Prefill `seg` after `head` in the scratch session, IDLE_CHUNK tokens at a time, and keep its block;
        False (nothing kept, the scratch back to `head`) when `stop()` turned true between chunks."""
        session = self._scratch(head, len(seg))
        m0 = session.n_past
        for i in range(0, len(seg), IDLE_CHUNK):
            if stop():
                session.remove(m0, session.n_past)
                return False
            session.prefill(list(seg[i:i + IDLE_CHUNK]))
        self.put(list(seg), session.export_kv(m0, m0 + len(seg)), head)
        session.remove(m0, session.n_past)
        return True

    def _scratch(self, head: list[int], longest: int):
        """A scratch session holding `head`, kept for the next compile after the same head (idle work compiles
        one block per step)."""
        if self.scratch is not None:
            held, session = self.scratch
            if held == tuple(head) and session.n_ctx >= len(head) + longest + 8:
                return session
            self.close_scratch()
        session = self.backend.new_session(len(head) + max(longest, 2048) + 8)
        session.prefill(list(head))
        self.scratch = (tuple(head), session)
        return session

    def close_scratch(self) -> None:
        if self.scratch is not None:
            self.scratch[1].close()
            self.scratch = None

    def close(self) -> None:
        """Write what is unsaved and free the scratch session (at the end of a server or an agent)."""
        self.save()
        self.close_scratch()

    def prefill(self, live, ids: list[int], spans: list[tuple[int, int]], epilogue: bool = False) -> tuple:
        """Make `live` hold `ids` with every span in `spans` spliced from its block (or prefilled and kept);
        (logits after `ids`, SpliceStats). `epilogue`: the last span is the template's text after the tools,
        spliced with `epilogue_plan`."""
        t0 = time.perf_counter()
        st = SpliceStats()
        session = live.session
        keep = 0
        for a, b in zip(live.ids, ids):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)
        for a, b in spans:  # a tool whose first tokens are cached (its JSON opens like the last prompt's tool):
            if a < keep < b and self.held(ids[a:b]):  # splice it whole rather than prefill its rest as text
                keep = a
        if keep < session.n_past:
            session.remove(keep, session.n_past)
        live.ids = list(ids[:keep])
        pos = keep
        for i, (a, b) in enumerate(spans):
            if b <= pos:
                continue
            plan = self.epilogue_plan if epilogue and i == len(spans) - 1 else self.plan
            seg = list(ids[max(a, pos):b])
            if a < pos:  # a tool partly cached already: its rest as text
                session.prefill(seg)
                st.text_tokens += len(seg)
            else:
                lead = list(ids[pos:a])  # text between tools: decoded with the next block's head, in one pass
                st.text_tokens += len(lead)
                kv = self.get(seg)
                if kv is not None and tokens_match(kv, seg):
                    # computed after these very tokens at these positions: what text prefill would compute
                    exact = int(kv.positions[0]) == a == session.n_past + len(lead) and \
                        self.after.get(self.key(seg)) == self.key(ids[:a])
                    n, refused = splice_or_text(session, kv, RepairPlan("none", 0) if exact else plan, lead)
                    st.exact += exact and not refused
                    st.text_tokens += n
                    if refused:
                        st.refused = refused
                        self.blocks.pop(self.key(seg), None)  # it would be refused again
                    else:
                        st.spliced += 1
                else:
                    if lead:
                        session.prefill(lead)
                    start = session.n_past
                    session.prefill(seg)
                    self.put(seg, session.export_kv(start, start + len(seg)), ids[:a])
                    st.text_tokens += len(seg)
                    st.compiled += 1
            pos = b
        logits = session.prefill(list(ids[pos:]))
        st.text_tokens += len(ids) - pos
        live.ids = list(ids)
        st.ms = (time.perf_counter() - t0) * 1e3
        return logits, st
