"""Configuration: the settings model (environment variables), its value types and docs, and the Policy built from it."""
