"""Registry of MCP tool schemas: sources, validation, SQLite store, compressed signatures."""
