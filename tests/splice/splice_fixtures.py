"""A realistic tool schema shared by the splice tests."""

from registry.model import Tool

TOOL = Tool.from_mcp({
    "name": "files.read_file",
    "description": "Read a UTF-8 text file from the workspace and return its contents, optionally a line range.",
    "inputSchema": {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string", "description": "file path relative to the workspace root"},
        "start_line": {"type": "integer", "minimum": 1, "description": "first line to return (1-based)"},
        "end_line": {"type": "integer", "minimum": 1, "description": "last line to return (inclusive)"}}},
})
