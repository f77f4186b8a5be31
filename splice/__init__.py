"""Precompiled tool-schema KV blocks: compile once, splice at any depth, re-anchor RoPE, repair."""
