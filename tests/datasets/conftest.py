"""Fixtures of the dataset tests."""
import pytest


@pytest.fixture
def skip_data_verification(monkeypatch):
    """Loaders accept any file under a registered name without the registry check.

    For the tests that write small fake files under registered names (``yacht/data/data.txt``,
    ``digits/digits.csv.gz``, ...) to reach a reader's own validation and parse errors: with
    verify-on-load, a real damaged file is rejected before it is parsed, so those checks are a
    second line of defence that only such a test can reach. test_verify_on_load.py shows that the
    same fake files are rejected when the check is on.
    """
    from refbayes.datasets import integrity
    monkeypatch.setattr(integrity, "_verdict", lambda spec, path: ("ok", "not checked (test)", None))
