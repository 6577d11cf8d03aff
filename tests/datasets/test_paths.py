"""Data-directory resolution order and the missing-file message."""
from pathlib import Path

import pytest

from refbayes.datasets import load_australian, resolve_data_dir, user_cache_dir
from refbayes.datasets.paths import require_file


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("REFBAYES_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_explicit_argument_wins(clean_env, monkeypatch):
    monkeypatch.setenv("REFBAYES_DATA", str(clean_env / "env"))
    assert resolve_data_dir(clean_env / "arg") == clean_env / "arg"
    assert resolve_data_dir(str(clean_env / "arg")) == clean_env / "arg"


def test_environment_before_cache(clean_env, monkeypatch):
    monkeypatch.setenv("REFBAYES_DATA", str(clean_env / "env"))
    assert resolve_data_dir() == clean_env / "env"


def test_xdg_cache(clean_env):
    assert resolve_data_dir() == clean_env / "xdg" / "refbayes" / "data"
    assert user_cache_dir() == clean_env / "xdg" / "refbayes" / "data"


@pytest.mark.parametrize("xdg", ["", "relative/dir"])
def test_home_cache_when_xdg_unset_or_relative(clean_env, monkeypatch, xdg):
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    monkeypatch.setenv("HOME", str(clean_env / "home"))
    assert resolve_data_dir() == clean_env / "home" / ".cache" / "refbayes" / "data"


def test_empty_environment_variable_is_unset(clean_env, monkeypatch):
    monkeypatch.setenv("REFBAYES_DATA", "")
    assert resolve_data_dir() == clean_env / "xdg" / "refbayes" / "data"


@pytest.mark.parametrize("bad", ["", 3])
def test_bad_data_dir(bad):
    with pytest.raises(ValueError, match="data_dir: expected a non-empty path"):
        resolve_data_dir(bad)


def test_missing_file_message_names_everything(clean_env, monkeypatch):
    monkeypatch.setenv("REFBAYES_DATA", str(clean_env / "env"))
    with pytest.raises(FileNotFoundError) as info:
        load_australian()
    msg = str(info.value)
    assert "dataset 'australian'" in msg
    assert str(clean_env / "env" / "australian" / "australian_scale") in msg
    assert "--data-dir: not given" in msg
    assert f"REFBAYES_DATA: {clean_env / 'env'}   <- used" in msg
    assert f"user cache: {clean_env / 'xdg' / 'refbayes' / 'data'}" in msg
    assert "refbayes data fetch australian" in msg


def test_missing_file_with_explicit_dir(clean_env):
    with pytest.raises(FileNotFoundError, match=r"(?s)--data-dir: .*nowhere   <- used.*not set"):
        require_file("yacht", "uci_regression/yacht/data/data.txt", clean_env / "nowhere")


def test_present_file_is_returned(clean_env):
    (clean_env / "d" / "x").mkdir(parents=True)
    (clean_env / "d" / "x" / "f").write_text("")
    assert require_file("x", "x/f", clean_env / "d") == Path(clean_env / "d" / "x" / "f")
