"""Splice on both backends: exactness at the anchor, fidelity vs text with repair, incremental compile,
bit-stable logits across runs and threads, profile plans."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from splice_fixtures import TOOL

from registry.store import RegistryStore
from splice.block import load_block
from splice.compiler import artefact_kind, block_key, block_path, compile_blocks, compile_stale
from splice.fidelity import CaseRunner, kl_top1, make_case
from splice.profile import RepairPlan, SpliceProfile, load_profile
from splice.prompt import CONTEXTS, context_for
from splice.splicer import splice_tool


def _block(backend):
    compile_blocks(backend, [TOOL], progress=False)
    return load_block(block_path(backend, TOOL), block_key(backend, TOOL))[1]


def test_splice_at_the_anchor_matches_text(backend):
    """Depth 0 (right after the system prompt, where the block was compiled) needs no repair."""
    kv = _block(backend)
    r = CaseRunner(backend, make_case(backend.tokenizer, TOOL, 0))
    ref = r.reference()
    kl, top1 = kl_top1(ref, r.run(kv, RepairPlan("none", 0))[0])
    r.close()
    assert kl < 2e-3 and top1 == 1.0


def test_roundtrip_floor_is_rounding_only(backend):
    """The eval's floor: the exact KV re-anchored +1 and back. MLX keeps float32 keys, so it is all but exact;
    llama.cpp's float16 cache rounds each rotation, which moves the logits a little (and never by the bar)."""
    r = CaseRunner(backend, make_case(backend.tokenizer, TOOL, 64))
    try:
        ref = r.reference()
        kl, _ = kl_top1(ref, r.roundtrip())
        assert r.session.n_past == r.base  # it leaves the session as it found it
    finally:
        r.close()
    if backend.name == "mlx":
        assert kl < 1e-8
    else:
        assert 1e-5 < kl < 0.01


def test_text_noise_floor_is_the_decode_path(backend):
    """The eval's `text` floor prefills the segment again in one-token batches. The segment in one batch (then the
    user turn in another) is a different batch split from the reference's single batch: equal up to float rounding,
    whose size depends on the BLAS kernel the CPU gets (0 on some, ~4e-12 nats on others). llama.cpp's one-token
    batches take other kernels, which moves the logits measurably."""
    r = CaseRunner(backend, make_case(backend.tokenizer, TOOL, 64))
    try:
        ref = r.reference()
        whole, _ = kl_top1(ref, r.text_in_batches(size=len(r.case.segment)))
        kl, _ = kl_top1(ref, r.text_in_batches())
        assert r.session.n_past == r.base
    finally:
        r.close()
    assert whole < 1e-8
    if backend.name == "mlx":
        assert kl < 1e-5
    else:
        assert 1e-5 < kl < 0.01


def test_reanchor_and_head_repair_beat_bare_at_depth(mlx_backend):
    kv = _block(mlx_backend)
    r = CaseRunner(mlx_backend, make_case(mlx_backend.tokenizer, TOOL, 300))
    ref = r.reference()
    kls = {name: kl_top1(ref, r.run(kv, plan)[0])[0] for name, plan in {
        "bare": RepairPlan("none", 0, rotate=False), "reanchored": RepairPlan("none", 0),
        "head32": RepairPlan("head", 32), "head32+tail4": RepairPlan("head", 32, tail=4),
        "text": RepairPlan("text")}.items()}
    r.close()
    assert kls["text"] < 1e-4  # MLX prefills are batch-invariant here
    assert kls["head32"] < kls["reanchored"] < kls["bare"] / 3
    # the block's closing tokens re-read in context (measured: they deviate most after a head repair)
    assert kls["head32+tail4"] < kls["head32"]


def test_llamacpp_head_repair_imports_a_sub_range(llamacpp_backend):
    kv = _block(llamacpp_backend)
    r = CaseRunner(llamacpp_backend, make_case(llamacpp_backend.tokenizer, TOOL, 200))
    ref = r.reference()
    plans = {"reanchored": RepairPlan("none", 0), "head": RepairPlan("head", 32), "suffix": RepairPlan("suffix", 20),
             "head+tail": RepairPlan("head", 32, tail=4)}
    got, redecoded = {}, {}
    for n, p in plans.items():
        logits, _, redecoded[n] = r.run(kv, p)
        got[n] = kl_top1(ref, logits)[0]
    assert r.session.n_past == r.base  # variants leave the prefix intact
    r.close()
    assert redecoded == {"reanchored": 0, "head": 32, "suffix": 20, "head+tail": 36}
    assert got["head"] < got["reanchored"] and got["head+tail"] < got["reanchored"]
    assert all(v < 0.2 for v in got.values())


def test_compile_is_incremental(mlx_backend, nexus_home):
    """Only stale tools are compiled; a block missing for one context, or written in an older format, makes its
    tool stale too (all its contexts are rewritten)."""
    with RegistryStore() as store:
        store.add_tools([TOOL])
        assert len(compile_stale(mlx_backend, store, progress=False)) == len(CONTEXTS)
        mtime = block_path(mlx_backend, TOOL).stat().st_mtime_ns
        assert compile_stale(mlx_backend, store, progress=False) == []
        assert not store.stale_tools(artefact_kind(mlx_backend))
        block_path(mlx_backend, TOOL, context=256).unlink()
        assert len(compile_stale(mlx_backend, store, progress=False)) == len(CONTEXTS)
        assert block_path(mlx_backend, TOOL).stat().st_mtime_ns >= mtime
        p = block_path(mlx_backend, TOOL)
        p.write_bytes(p.read_bytes().replace(b'"format_version": 2', b'"format_version": 1', 1))
        assert len(compile_stale(mlx_backend, store, progress=False)) == len(CONTEXTS)
        load_block(p, block_key(mlx_backend, TOOL))  # rewritten in the current format


def _spliced_logits(backend, profile):
    s = backend.new_session(n_ctx=768)
    s.prefill(make_case(backend.tokenizer, TOOL, 100).prefix)
    res = splice_tool(s, backend, TOOL, depth=100, profile=profile)
    out = s.forward_logits(backend.tokenizer.encode("Read README.md please"))
    s.close()
    assert res.fallback is None
    return out


def test_splice_is_bit_stable_across_runs_and_threads(llamacpp_backend):
    b = llamacpp_backend
    compile_blocks(b, [TOOL], progress=False)
    profile = SpliceProfile("llamacpp", b.info.fingerprint, curve=[[512, 16]], max_depth=512)
    first = _spliced_logits(b, profile)  # the same computation again, in this process on this CPU: bit-exact
    np.testing.assert_array_equal(first, _spliced_logits(b, profile))
    results, errors = [None] * 3, []

    def work(i):
        try:
            results[i] = _spliced_logits(b, profile)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results:
        np.testing.assert_array_equal(first, r)


def test_profile_plans_grow_with_depth_and_fail_closed():
    p = SpliceProfile("mlx", "fp", curve=[[0, 0], [256, 16], [1024, 64]], max_depth=1024)
    assert p.plan_for(0, 200) == RepairPlan("none", 0)
    assert p.plan_for(100, 200) == RepairPlan("head", 16)
    assert p.plan_for(1024, 200) == RepairPlan("head", 64)
    assert p.plan_for(1025, 200).mode == "text"
    assert p.plan_for(1000, 50).mode == "text"  # repairing the whole block is a text prefill
    with pytest.raises(ValueError):
        RepairPlan("tail", 3)


def test_blend_recomputes_the_most_deviating_tokens_in_place(mlx_backend):
    """CacheBlend repair on MLX: recomputing every spliced token reproduces the text prefill (slow reference);
    recomputing 15% picks ceil(0.15 T) positions inside the block and beats the plain re-anchored splice."""
    kv = _block(mlx_backend)
    r = CaseRunner(mlx_backend, make_case(mlx_backend.tokenizer, TOOL, 64))
    ref = r.reference()
    got = {n: kl_top1(ref, r.run(kv, p)[0]) for n, p in {
        "reanchored": RepairPlan("none", 0), "blend15": RepairPlan("blend", 0, frac=0.15),
        "blend100": RepairPlan("blend", 0, frac=1.0)}.items()}
    start = r.session.n_past
    r.session.import_kv(kv)
    picked = r.session.recompute_kv(start, r.session.n_past, 0.15)
    r.close()
    assert len(picked) == int(np.ceil(0.15 * len(kv))) and start <= picked.min() and picked.max() < start + len(kv)
    assert got["blend100"][0] < 1e-3 and got["blend100"][1] == 1.0
    assert got["blend15"][0] < got["reanchored"][0]


def test_blend_runs_as_head_repair_without_recompute(llamacpp_backend):
    """llama.cpp cannot rewrite cached cells: a blend plan there re-decodes only its head (capability says so)."""
    assert not llamacpp_backend.capabilities.can_recompute_kv
    kv = _block(llamacpp_backend)
    r = CaseRunner(llamacpp_backend, make_case(llamacpp_backend.tokenizer, TOOL, 64))
    _, _, redecoded = r.run(kv, RepairPlan("blend", 16, frac=0.2))
    r.close()
    assert redecoded == 16


def test_profile_curve_with_tail_entries():
    p = SpliceProfile("llamacpp", "fp", curve=[[0, 0], [256, 16, 0, 4], [1024, 64, 0, 0]], max_depth=1024)
    assert p.curve == [[0, 0], [256, 16, 0, 4], [1024, 64]]  # trailing zeros dropped
    assert p.plan_for(100, 200) == RepairPlan("head", 16, tail=4)
    assert p.plan_for(100, 20).mode == "text"  # head + tail cover the block
    assert p.plan_for(1024, 200) == RepairPlan("head", 64)
    with pytest.raises(ValueError, match="tail"):
        SpliceProfile("mlx", "fp", curve=[[0, 16, 10, 4]])  # a blend entry has no tail
    with pytest.raises(ValueError, match="entries"):
        SpliceProfile("mlx", "fp", curve=[[0, 16, 0, 4, 1]])
    with pytest.raises(ValueError, match="tail"):
        RepairPlan("suffix", 8, tail=4)


def test_profile_curve_with_blend_entries():
    p = SpliceProfile("mlx", "fp", curve=[[0, 0], [256, 0, 15], [1024, 16, 20]], max_depth=1024)
    assert p.plan_for(100, 200) == RepairPlan("blend", 0, frac=0.15)
    assert p.plan_for(1024, 200) == RepairPlan("blend", 16, frac=0.2)
    with pytest.raises(ValueError):
        RepairPlan("blend", 0)  # blend needs a share to recompute
    with pytest.raises(ValueError):
        SpliceProfile("mlx", "fp", curve=[[0, 0, 150]])


def test_profile_fits_the_plan_to_the_block_length():
    """With calibration's options, plan_for redoes calibration's pick (above the speed floor the cheapest plan as
    quiet as the text floor, else the lowest KL; else the cheapest passing plan) for the block's own length: text
    time shrinks with the block, a head plan's does not."""
    plans = [[32, 0, 4, 0.005, 0.30], [64, 0, 0, 0.004, 0.42], [96, 0, 0, 0.003, 0.52]]
    opt = {"n_tokens": 200, "block_share": 0.8, "min_speedup": 1.9, "plans": plans}
    p = SpliceProfile("llamacpp", "fp", curve=[[256, 96]], max_depth=256, options={"256": opt})
    assert p.plan_for(256, 200) == RepairPlan("head", 96)  # calibration's own length: its curve entry
    assert p.plan_for(256, 400) == RepairPlan("head", 96)
    assert p.plan_for(100, 150) == RepairPlan("head", 64)  # 96 would give 0.8 / 0.52 = 1.54x
    assert p.plan_for(256, 100) == RepairPlan("head", 32, tail=4)  # 0.6 / 0.30 = 2.0x
    assert p.plan_for(256, 60) == RepairPlan("head", 32, tail=4)  # none reaches the floor: the cheapest that passed
    assert p.plan_for(256, 30).mode == "text"
    cheapest = SpliceProfile("llamacpp", "fp", curve=[[256, 32, 0, 4]], max_depth=256,
                             options={"256": {**opt, "min_speedup": 0}})
    assert cheapest.plan_for(256, 400) == RepairPlan("head", 32, tail=4)
    # a plan as quiet as the text floor ends the search: the cheapest such plan above the speed floor
    quiet = SpliceProfile("llamacpp", "fp", curve=[[256, 64]], max_depth=256,
                          options={"256": {**opt, "text_kl": 0.004}})
    assert quiet.plan_for(256, 200) == RepairPlan("head", 64)  # head 96 is quieter, but head 64 is quiet enough
    assert quiet.plan_for(256, 100) == RepairPlan("head", 32, tail=4)  # the only plan above the floor
    with pytest.raises(ValueError, match="options"):
        SpliceProfile("llamacpp", "fp", curve=[[256, 96]], options={"256": {**opt, "text_kl": -1}})
    assert p.describe((100, 200)) == ["depth <= 256 (floor 1.90x, 3 passing plans): 100 tokens -> head32+tail4, "
                                      "200 tokens -> head96"]
    for bad in ({**opt, "plans": []}, {**opt, "plans": [[32, 0, 4]]}, {**opt, "block_share": 2}, {"plans": plans}):
        with pytest.raises(ValueError, match="options"):
            SpliceProfile("llamacpp", "fp", curve=[[256, 96]], options={"256": bad})


def test_context_follows_depth():
    assert [context_for(d) for d in (0, 64, 255, 256, 2048)] == [0, 0, 0, 256, 256] and CONTEXTS == (0, 256)


def test_block_compiled_after_a_conversation_is_closer_at_depth(mlx_backend):
    """At depth 300 the block compiled after 256 generic conversation tokens (what the splicer picks there) is
    nearer the text prefill than the block compiled right after the system prompt, re-anchored or repaired."""
    compile_blocks(mlx_backend, [TOOL], progress=False)
    kv = {c: load_block(block_path(mlx_backend, TOOL, context=c), block_key(mlx_backend, TOOL, c))[1] for c in CONTEXTS}
    assert int(kv[256].positions[0]) == int(kv[0].positions[0]) + 256 and list(kv[256].tokens) == list(kv[0].tokens)
    r = CaseRunner(mlx_backend, make_case(mlx_backend.tokenizer, TOOL, 300))
    ref = r.reference()
    kls = {(c, p.n): kl_top1(ref, r.run(kv[c], p)[0])[0] for c in CONTEXTS
           for p in (RepairPlan("none", 0), RepairPlan("head", 32))}
    r.close()
    assert kls[256, 0] < kls[0, 0] and kls[256, 32] < kls[0, 32]


def test_profile_calibrated_for_other_contexts_is_not_used(mlx_backend, nexus_home):
    old = SpliceProfile("mlx", mlx_backend.info.fingerprint, curve=[[2048, 0]], measured={"0": {}}, contexts=[0])
    old.save()
    assert load_profile(mlx_backend) == SpliceProfile("mlx", mlx_backend.info.fingerprint)  # uncalibrated default
    SpliceProfile(**{**vars(old), "contexts": list(CONTEXTS)}).save()
    assert load_profile(mlx_backend).curve == [[2048, 0]]
