"""A tool call's arguments: decoded under the tool's JSON Schema (`constrained`: the llguidance grammar mask and
loop guard), tilted toward values copied from the request and tool results (`copying` with `copy_sources`,
`span_priors`, `key_choice`, `json_cursor`, `closers`; what they copy next drafted and verified in one pass:
`drafts`), in place after the decision's chosen name (`in_place`) or from a
compact signature prompt with the full schema on failure (`fullschema`), or on a text-only server (`text_path`)."""
