"""The scenario: its schema, YAML loading with line numbers, cross-field checks, the generated reference."""
