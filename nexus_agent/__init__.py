"""The Nexus agent loop and the `nexus` command line."""
