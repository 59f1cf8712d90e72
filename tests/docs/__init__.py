"""Tests of the documentation site's generated parts (docs_hooks/)."""
