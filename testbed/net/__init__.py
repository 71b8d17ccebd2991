"""Ground floor of the package: standard library only, imported by every layer above (docs/architecture.md)."""
