import os

import pytest

from dlstore import settings

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "settings.md")


def test_docs_are_generated_from_the_table():
    with open(DOC) as f:
        assert settings.markdown_table() in f.read(), "regenerate docs/settings.md from settings.markdown_table()"


def test_precedence_and_validation(monkeypatch):
    assert settings.get("chunk_size") == 8 << 20
    monkeypatch.setenv("DLSTORE_CHUNK_SIZE", "16M")
    assert settings.get("chunk_size") == 16 << 20
    assert settings.get("chunk_size", 1 << 20) == 1 << 20  # an explicit argument wins
    monkeypatch.setenv("DLSTORE_CHUNK_SIZE", "1k")
    with pytest.raises(ValueError, match="DLSTORE_CHUNK_SIZE"):
        settings.get("chunk_size")
    with pytest.raises(ValueError, match="io='fast'"):
        settings.get("io", "fast")
