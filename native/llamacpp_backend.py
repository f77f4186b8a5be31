"""The llama.cpp backend through llama-cpp-python's low-level C API.

We drive `llama_decode` with our own batches and use the memory (KV) API directly: `llama_memory_seq_rm`
removes positions, `llama_memory_seq_add` shifts positions (llama.cpp re-rotates the shifted keys: a
re-anchor), `llama_memory_seq_cp` shares cells between sequences, and `llama_state_seq_get/set_data`
serialize one sequence's KV. Sequence 0 is the live sequence; sequence 1 is a scratch slot for imports
(`set_data` clears its destination, and cells must be shifted *before* they are shared with the live
sequence; DESIGN section 6). Where the model's RoPE is one Nexus models, an import's keys are rotated in the
state blob instead (`llamacpp_state.move_keys`): the K-shift rotates every cell of the cache, ~0.45 s per import
at 32k cells here, ~1 ms moved. No attention weights or key biases are reachable here: eviction is positional.
Capabilities: see this backend's entry in `native.registry.BACKENDS`.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import astuple, replace

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp as C

from native.base import BackendError, KVRange, KVSession, ModelError, ModelInfo, as_token_list
from native.gguf_header import read_gguf_header
from native.llamacpp_state import Rope, move_keys, set_v_layout
from native.model_files import fingerprint, resolve_model
from native.registry import BACKENDS, list_backends
from native.tokenizer import tokenizer_from_gguf

GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = 4, 5  # ggml.h's levels (NONE, DEBUG, INFO, WARN, ERROR, CONT)
_last_level = 0


@llama_cpp.llama_log_callback
def _log_errors(level: int, text: bytes, user_data) -> None:
    """llama.cpp's log, errors only: it logs every load step, and llama-cpp-python's own filter reads an older
    numbering of the levels (its "error" is ggml's WARN: "model default pooling_type is [-1]" on every session)."""
    global _last_level
    if level != GGML_LOG_LEVEL_CONT:
        _last_level = level
    if _last_level == GGML_LOG_LEVEL_ERROR:
        print(text.decode("utf-8", errors="replace"), end="", flush=True, file=sys.stderr)


C.llama_log_set(_log_errors, ctypes.c_void_p(0))
LIVE, SCRATCH = 0, 1
# A moved import may differ from a K-shifted one by this many times the K-shift's own error (logits after the
# import vs the same tokens prefilled at those positions). Measured at 1,000 positions: the two differ by 0.23
# (Qwen2.5 0.5B) and 0.57 (SmolLM2) where the shift's own error is 0.36 and 0.60; a wrong RoPE (pairs or base)
# differs by 9.4-13.6.
MOVE_SLACK = 3.0
_backend_ready = False


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has AMX tiles (the `amx_tile` flag of /proc/cpuinfo; False where it cannot be read)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    return any(line.startswith("flags") and "amx_tile" in line.split() for line in cpuinfo.splitlines())


def extra_buffers_allowed(cpuinfo: str | None = None) -> bool:
    """Whether llama.cpp may repack weights into its extra buffer types (AMX, CPU_REPACK).

    Off on CPUs with AMX: llama.cpp 0.3.36's AMX matmul segfaults in the first decode on some of them (every
    test that decodes crashed on a Xeon with amx_tile; with repacking off all pass; llama.cpp issue #20824,
    and PR #26954: worker threads run tile instructions without the XTILEDATA permission). Elsewhere the
    weights are repacked as usual. NEXUS_LLAMA_EXTRA_BUFTS=1 or 0 overrides.
    """
    forced = os.environ.get("NEXUS_LLAMA_EXTRA_BUFTS")
    if forced in ("0", "1"):
        return forced == "1"
    return not cpu_has_amx(cpuinfo)


def default_threads() -> tuple[int, int]:
    """(decode, batch) threads: llama-cpp-python's own defaults, overridable with NEXUS_THREADS.

    Never oversubscribe: OpenMP threads spinning on a busy core collapse decode speed (DESIGN section 3).
    """
    if os.environ.get("NEXUS_THREADS"):
        n = max(1, int(os.environ["NEXUS_THREADS"]))
        return n, n
    cpus = os.cpu_count() or 1
    return max(cpus // 2, 1), cpus


class LlamaCppBackend:
    """A GGUF model in llama.cpp; thread counts default to `default_threads()`."""

    name = "llamacpp"
    capabilities = BACKENDS["llamacpp"].capabilities

    def __init__(self, model: str | None = None, n_threads: int | None = None, n_threads_batch: int | None = None):
        global _backend_ready
        src = resolve_model(model)
        if src.format != "gguf":
            raise ModelError(f"{src.path}: the llama.cpp backend needs a GGUF file, not a model directory")
        header = read_gguf_header(src.path)
        meta = header.metadata
        arch = str(meta.get("general.architecture", "?"))  # any architecture llama.cpp implements
        if not _backend_ready:
            C.llama_backend_init()
            _backend_ready = True
        params = C.llama_model_default_params()
        params.use_extra_bufts = extra_buffers_allowed()
        self._model = C.llama_model_load_from_file(src.path.encode(), params)
        if not self._model:
            raise ModelError(f"{src.path}: llama.cpp could not load this model (architecture {arch!r})")
        try:
            self.tokenizer = tokenizer_from_gguf(meta, src.path)
        except ModelError:
            self.close()  # nothing half-loaded
            raise
        self._vocab = C.llama_model_get_vocab(self._model)
        self.n_vocab = C.llama_vocab_n_tokens(self._vocab)
        d_threads, b_threads = default_threads()
        self.n_threads, self.n_threads_batch = n_threads or d_threads, n_threads_batch or n_threads or b_threads

        def get(key, default=None):
            v = meta.get(f"{arch}.{key}", default)
            return v.item() if hasattr(v, "item") else v

        n_heads, d_model = int(C.llama_model_n_head(self._model)), int(C.llama_model_n_embd(self._model))
        rope_type = int(C.llama_model_rope_type(self._model))
        self.n_swa = int(C.llama_model_n_swa(self._model))  # > 0: some layers attend over a sliding window
        self.info = ModelInfo(
            path=src.path, format="gguf", fingerprint=fingerprint(src.path), architecture=arch,
            n_layers=int(C.llama_model_n_layer(self._model)), n_heads=n_heads,
            n_kv_heads=int(C.llama_model_n_head_kv(self._model)),
            head_dim=int(get("attention.key_length", d_model // n_heads)), d_model=d_model, vocab_size=self.n_vocab,
            n_ctx_train=int(C.llama_model_n_ctx_train(self._model)), rope_base=float(get("rope.freq_base", 10000.0)),
            rope_traditional=rope_type == C.LLAMA_ROPE_TYPE_NORM,
            rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        )
        self.rope_type = rope_type
        # Keys rotated in the imported state itself (`move_keys`) where the model's RoPE is one this code knows:
        # llama.cpp's K-shift rotates every cell of the cache at the next decode (~0.45 s for a 32k context here).
        self._rope = None
        if rope_type in (C.LLAMA_ROPE_TYPE_NORM, C.LLAMA_ROPE_TYPE_NEOX) and not self.n_swa:
            self._rope = Rope(self.info.head_dim, int(get("rope.dimension_count", self.info.head_dim)),
                              self.info.rope_base, traditional=self.info.rope_traditional)
        self._moves_keys: bool | None = None
        # Splicing re-anchors a block with llama.cpp's K-shift: architectures without RoPE (or whose memory
        # cannot shift) keep every other capability; a context's memory says whether it can (`can_shift`).
        self.capabilities = BACKENDS["llamacpp"].capabilities
        if rope_type == C.LLAMA_ROPE_TYPE_NONE:
            self.capabilities = replace(self.capabilities, can_splice=False)

    def moves_keys(self) -> bool:
        """Whether an import rotates its keys itself instead of asking llama.cpp for a K-shift.

        Checked once per model against llama.cpp's own K-shift: a few tokens exported, imported 1,000 positions
        later both ways, and the next token's logits compared, within `MOVE_SLACK` times the K-shift's own error
        (a RoPE variant this code does not model, such as scaled or per-frequency factors, differs by far more;
        such a model keeps the K-shift).
        """
        if self._moves_keys is None:
            self._moves_keys = self._rope is not None and self._probe_kept()
        return self._moves_keys

    def _probe_kept(self) -> bool:
        """The probe's verdict from the model's profile file (section "llamacpp"), probed and written there when
        absent or taken with another llama.cpp build or RoPE: each process that splices would otherwise pay it
        again on its first import. An unreadable file is left to its owners (decide, splice) to report."""
        from registry.home import read_model_profile, update_model_profile

        fp = self.info.fingerprint
        what = {"llama_cpp": llama_cpp.__version__, "rope": list(astuple(self._rope))}
        try:
            kept = read_model_profile(fp).get("llamacpp", {}).get("moves_keys")
        except ValueError:
            return self._probe_move()
        if isinstance(kept, dict) and {k: kept.get(k) for k in what} == what and isinstance(kept.get("ok"), bool):
            return kept["ok"]
        ok = self._probe_move()
        try:
            update_model_profile(fp, ("llamacpp", "moves_keys"), {**what, "ok": ok})
        except OSError:  # a read-only home: probed again by the next process
            pass
        return ok

    def _probe_move(self, delta: int = 1000) -> bool:
        probe = self.tokenizer.encode("Keys rotated before an import match llama.cpp's K-shift.")[:12]
        sessions = [LlamaCppSession(self, n_ctx=delta + 32, n_batch=32) for _ in range(4)]
        try:
            src, shifted, moved, direct = sessions
            src.prefill(probe)
            kv = src.export_kv(0, len(probe))
            out = []
            for s, move in ((shifted, False), (moved, True)):
                s._move, s.n_past = move, delta
                s.import_kv(kv)
                out.append(s.decode(probe[0]))
            direct.n_past = delta  # the same tokens computed at those positions: the K-shift's own error
            direct.prefill(probe)
            truth = direct.decode(probe[0])
            gap, noise = (float(np.max(np.abs(x - y))) for x, y in ((out[0], out[1]), (out[0], truth)))
            return gap <= MOVE_SLACK * noise + 0.05
        except BackendError:
            return False
        finally:
            for s in sessions:
                s.close()

    def new_session(self, n_ctx: int | None = None, n_batch: int = 512, flash_attn: bool = False
                    ) -> "LlamaCppSession":
        """`flash_attn`: run llama.cpp's flash attention, which also stores V untransposed (see the session)."""
        if not self._model:
            raise BackendError("the llama.cpp backend is closed")
        return LlamaCppSession(self, n_ctx or min(self.info.n_ctx_train, 8192), n_batch, flash_attn)

    def close(self) -> None:
        if getattr(self, "_model", None):
            C.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        self.close()


class LlamaCppSession(KVSession):
    """One live sequence in its own llama.cpp context (unified KV, 2 sequences: live + scratch).

    `recompute_kv` is the protocol's default (recomputes nothing): cached cells cannot be rewritten in place.
    """

    def __init__(self, backend: LlamaCppBackend, n_ctx: int, n_batch: int = 512, flash_attn: bool = False):
        self.backend, self.info, self.n_ctx, self.n_batch = backend, backend.info, n_ctx, n_batch
        self.flash_attn = flash_attn
        cp = C.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_threads, cp.n_threads_batch = backend.n_threads, backend.n_threads_batch
        cp.n_seq_max, cp.kv_unified = 2, True
        # Fixed per session, never "auto": the KV state layout depends on it (V is stored transposed without it)
        cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        # Sliding-window models: keep every layer's cells (the window is a mask), so removing, shifting and
        # exporting positions behind the window work as on any other model.
        cp.swa_full = True
        cp.pooling_type = C.LLAMA_POOLING_TYPE_NONE  # `last_hidden`: the token's own state, never a pooled one
        self._ctx = C.llama_init_from_model(backend._model, cp)
        if not self._ctx:
            raise BackendError(f"llama.cpp could not create a context of {n_ctx} tokens")
        self._mem = C.llama_get_memory(self._ctx)
        self.can_shift = bool(C.llama_memory_can_shift(self._mem)) and backend.capabilities.can_splice
        if not self.can_shift and backend.capabilities.can_splice:
            backend.capabilities = replace(backend.capabilities, can_splice=False)
        self._batch = C.llama_batch_init(n_batch, 0, 1)
        self.n_past = 0
        self.tokens: dict[int, int] = {}  # position -> token id of every cached position
        self._shift_pending = False  # llama.cpp rotates shifted keys at the next decode, not at seq_add
        self._move: bool | None = None  # imports rotate their own keys (backend.moves_keys(), asked on first use)

    # -- forward -------------------------------------------------------------------------------------------
    def _decode(self, tokens: list[int], all_logits: bool) -> np.ndarray:
        if self._ctx is None:
            raise BackendError("session is closed")
        if self.n_past + len(tokens) > self.n_ctx:
            raise BackendError(f"context full: {self.n_past} + {len(tokens)} tokens > n_ctx={self.n_ctx}")
        outs = []
        b = self._batch
        for s in range(0, len(tokens), self.n_batch):
            chunk = tokens[s : s + self.n_batch]
            last_chunk = s + self.n_batch >= len(tokens)
            b.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = self.n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = LIVE
                b.logits[i] = all_logits or (last_chunk and i == len(chunk) - 1)
            rc = C.llama_decode(self._ctx, b)
            if rc != 0:
                raise BackendError(f"llama_decode failed with code {rc} at position {self.n_past}")
            self._shift_pending = False
            if all_logits:
                ptr = C.llama_get_logits(self._ctx)
                outs.append(np.ctypeslib.as_array(ptr, shape=(len(chunk), self.backend.n_vocab)).copy())
            elif last_chunk:
                ptr = C.llama_get_logits_ith(self._ctx, -1)
                outs.append(np.ctypeslib.as_array(ptr, shape=(1, self.backend.n_vocab)).copy())
            for i, t in enumerate(chunk):
                self.tokens[self.n_past + i] = t
            self.n_past += len(chunk)
        return np.concatenate(outs) if all_logits else outs[-1][0]

    def prefill(self, tokens) -> np.ndarray:
        return self._decode(as_token_list(tokens), all_logits=False)

    def decode(self, token: int) -> np.ndarray:
        return self._decode([int(token)], all_logits=False)

    def forward_logits(self, tokens) -> np.ndarray:
        return self._decode(as_token_list(tokens), all_logits=True)

    def probe(self, prefix: int, tokens) -> np.ndarray:
        """The logits after the live sequence's first `prefix` positions followed by `tokens`, computed on the
        scratch sequence (its cells share the prefix's): the live sequence, `n_past` and `tokens` stay as they
        are."""
        tokens = as_token_list(tokens)
        if self._ctx is None:
            raise BackendError("session is closed")
        if not tokens or prefix > self.n_past or self.n_past + len(tokens) > self.n_ctx:
            raise BackendError(f"no room to probe {len(tokens)} tokens after {prefix} (n_past {self.n_past})")
        if self._shift_pending:
            self._apply_shift()
        C.llama_memory_seq_rm(self._mem, SCRATCH, -1, -1)
        C.llama_memory_seq_cp(self._mem, LIVE, SCRATCH, 0, prefix)
        b = self._batch
        try:
            for s in range(0, len(tokens), self.n_batch):
                chunk = tokens[s : s + self.n_batch]
                b.n_tokens = len(chunk)
                for i, t in enumerate(chunk):
                    b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, prefix + s + i, 1, SCRATCH
                    b.logits[i] = s + i == len(tokens) - 1
                rc = C.llama_decode(self._ctx, b)
                if rc != 0:
                    raise BackendError(f"llama_decode failed with code {rc} probing at position {prefix + s}")
            ptr = C.llama_get_logits_ith(self._ctx, -1)
            return np.ctypeslib.as_array(ptr, shape=(self.backend.n_vocab,)).copy()
        finally:
            C.llama_memory_seq_rm(self._mem, SCRATCH, -1, -1)

    def last_hidden(self) -> np.ndarray:
        """The model's final hidden state (after its output norm) at the last position of the live sequence, (d_model,)
        float32: that position is fed again with llama.cpp's embeddings output on (one decode step; the cache ends
        as it was)."""
        p = self.n_past - 1
        if self._ctx is None or p not in self.tokens:
            raise BackendError("no last position to read a hidden state at")
        token = self.tokens[p]
        self.remove(p, p + 1)
        C.llama_set_embeddings(self._ctx, True)
        try:
            self._decode([token], all_logits=False)
            ptr = C.llama_get_embeddings_ith(self._ctx, -1)
            if not ptr:
                raise BackendError("llama.cpp returned no hidden state")
            return np.ctypeslib.as_array(ptr, shape=(self.info.d_model,)).copy()
        finally:
            C.llama_set_embeddings(self._ctx, False)

    # -- KV ranges -------------------------------------------------------------------------------------------
    def export_kv(self, start: int, end: int) -> KVRange:
        """Serialize positions [start, end) of the live sequence (an opaque llama.cpp state blob)."""
        positions = np.array(sorted(p for p in self.tokens if start <= p < end), dtype=np.int64)
        if not len(positions):
            raise BackendError(f"no cached positions in [{start}, {end})")
        if self._shift_pending:
            self._apply_shift()
        C.llama_memory_seq_rm(self._mem, SCRATCH, -1, -1)
        C.llama_memory_seq_cp(self._mem, LIVE, SCRATCH, start, end)
        size = C.llama_state_seq_get_size(self._ctx, SCRATCH)
        buf = (ctypes.c_uint8 * size)()
        n = C.llama_state_seq_get_data(self._ctx, buf, size, SCRATCH)
        C.llama_memory_seq_rm(self._mem, SCRATCH, -1, -1)
        if n == 0:
            raise BackendError("llama.cpp returned an empty sequence state")
        tokens = np.array([self.tokens[int(p)] for p in positions], dtype=np.int64)
        return KVRange(positions=positions, tokens=tokens, blob=bytes(buf[:n]), meta=self._layout())

    def _apply_shift(self) -> None:
        """Rotate the keys of shifted cells now: the state would otherwise hold them at their old positions.

        llama.cpp applies a pending shift at the start of the next decode and has no C call that does only that,
        so decode one token into the (empty) scratch sequence, which attends to nothing live, and drop it.
        """
        b = self._batch
        b.n_tokens, b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = 1, 0, 0, 1, SCRATCH, 0
        C.llama_memory_seq_rm(self._mem, SCRATCH, -1, -1)
        rc = C.llama_decode(self._ctx, b)
        C.llama_memory_seq_rm(self._mem, SCRATCH, -1, -1)
        if rc != 0:
            raise BackendError(f"llama.cpp could not apply a pending position shift (decode code {rc}; context full?)")
        self._shift_pending = False

    def _layout(self) -> dict:
        return {"backend": "llamacpp", "fingerprint": self.info.fingerprint, "flash_attn": self.flash_attn,
                "kv_unified": True}

    def _own_layout(self, kv: KVRange) -> bytes:
        """kv's state blob in this session's layout: a state saved with flash attention on (V per cell) or off
        (V transposed) has its V rewritten in the other order (`native.llamacpp_state`); any other difference
        raises BackendError."""
        if kv.blob is None:
            raise BackendError("this KV range has no llama.cpp state (was it exported by another backend?)")
        mine = self._layout()
        if not kv.meta or kv.meta == mine:
            return kv.blob
        if {**kv.meta, "flash_attn": self.flash_attn} != mine:
            raise BackendError(f"KV range layout {kv.meta} does not match this session {mine}")
        return set_v_layout(kv.blob, transposed=not self.flash_attn)

    def import_kv(self, kv: KVRange, span: tuple[int, int] | None = None, rotate: bool = True) -> None:
        """Load a state blob into the scratch sequence, shift it to `n_past`, then share it with the live one.

        A blob saved by a session with the other `flash_attn` setting is converted to this one's V layout first.
        `span` = (a, b) imports only the entries kv[a:b] (indices into the range, not positions); entry a lands
        at `n_past`. Used by splice repair (a re-decoded head or suffix is decoded as text instead).
        `rotate=False` raises BackendError: llama.cpp re-rotates the keys of every shifted cell.
        """
        if not rotate:
            raise BackendError("llama.cpp cannot import a KV range without re-anchoring it (no can_skip_reanchor): "
                               "shifting cells re-rotates their keys; measure a bare splice on "
                               f"{' or '.join(list_backends(can_skip_reanchor=True))}")
        blob = self._own_layout(kv)
        a, b = span if span is not None else (0, len(kv))
        if not 0 <= a < b <= len(kv):
            raise BackendError(f"span {span} is outside this KV range of {len(kv)} entries")
        n = b - a
        if self.n_past + n > self.n_ctx:
            raise BackendError(f"context full: {self.n_past} + {n} tokens > n_ctx={self.n_ctx}")
        p0, p1 = int(kv.positions[a]), int(kv.positions[b - 1]) + 1
        delta = self.n_past - p0
        if delta and not self.can_shift:
            raise BackendError(f"llama.cpp cannot shift the KV cells of a {self.info.architecture} model "
                               "(no RoPE K-shift): a KV range imports only at its own positions; prefill the text")
        if delta and self._move is None:
            self._move = self.backend.moves_keys()
        moved = bool(delta and self._move)
        if moved:  # the cells arrive at their new positions with their keys rotated: no K-shift
            try:
                blob, p0, p1 = move_keys(blob, delta, self.backend._rope), p0 + delta, p1 + delta
            except BackendError:  # keys it cannot rotate (a quantized K cache), or a state llama.cpp will refuse
                moved = False
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if C.llama_state_seq_set_data(self._ctx, buf, len(blob), SCRATCH) == 0:
            raise BackendError("llama.cpp rejected the KV state (layout or model mismatch)")
        if a > 0:
            C.llama_memory_seq_rm(self._mem, SCRATCH, -1, p0)
        if b < len(kv):
            C.llama_memory_seq_rm(self._mem, SCRATCH, p1, -1)
        if delta and not moved:
            C.llama_memory_seq_add(self._mem, SCRATCH, p0, p1, delta)  # shift before sharing (cells are shared)
            self._shift_pending = True
        C.llama_memory_seq_cp(self._mem, SCRATCH, LIVE, -1, -1)
        C.llama_memory_seq_rm(self._mem, SCRATCH, -1, -1)
        for p, t in zip(kv.positions[a:b], kv.tokens[a:b]):
            self.tokens[int(p) + delta] = int(t)
        self.n_past = p1 + (0 if moved else delta)

    def remove(self, start: int, end: int) -> None:
        if not C.llama_memory_seq_rm(self._mem, LIVE, start, end):
            raise BackendError(f"llama.cpp could not remove positions [{start}, {end})")
        self.tokens = {p: t for p, t in self.tokens.items() if not start <= p < end}
        if end >= self.n_past:
            self.n_past = min(self.n_past, start)

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            C.llama_batch_free(self._batch)
            C.llama_free(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
