"""Data-directory resolution order and the missing-file message."""
from pathlib import Path

import pytest

from refbayes.datasets import load_australian, resolve_data_dir, user_cache_dir
from refbayes.datasets.paths import require_file


def test_explicit_argument_wins(no_data_env, monkeypatch):
    monkeypatch.setenv("REFBAYES_DATA", str(no_data_env / "env"))
    assert resolve_data_dir(no_data_env / "arg") == no_data_env / "arg"
    assert resolve_data_dir(str(no_data_env / "arg")) == no_data_env / "arg"


def test_environment_before_cache(no_data_env, monkeypatch):
    monkeypatch.setenv("REFBAYES_DATA", str(no_data_env / "env"))
    assert resolve_data_dir() == no_data_env / "env"


def test_xdg_cache(no_data_env):
    assert resolve_data_dir() == no_data_env / "cache" / "refbayes" / "data"
    assert user_cache_dir() == no_data_env / "cache" / "refbayes" / "data"


@pytest.mark.parametrize("xdg", ["", "relative/dir"])
def test_home_cache_when_xdg_unset_or_relative(no_data_env, monkeypatch, xdg):
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    monkeypatch.setenv("HOME", str(no_data_env / "home"))
    assert resolve_data_dir() == no_data_env / "home" / ".cache" / "refbayes" / "data"


def test_empty_environment_variable_is_unset(no_data_env, monkeypatch):
    monkeypatch.setenv("REFBAYES_DATA", "")
    assert resolve_data_dir() == no_data_env / "cache" / "refbayes" / "data"


@pytest.mark.parametrize("bad", ["", 3])
def test_bad_data_dir(bad):
    with pytest.raises(ValueError, match="data_dir: expected a non-empty path"):
        resolve_data_dir(bad)


def test_missing_file_message_names_everything(no_data_env, monkeypatch):
    monkeypatch.setenv("REFBAYES_DATA", str(no_data_env / "env"))
    with pytest.raises(FileNotFoundError) as info:
        load_australian()
    msg = str(info.value)
    assert "dataset 'australian'" in msg
    assert str(no_data_env / "env" / "australian" / "australian_scale") in msg
    assert "--data-dir: not given" in msg
    assert f"REFBAYES_DATA: {no_data_env / 'env'}   <- used" in msg
    assert f"user cache: {no_data_env / 'cache' / 'refbayes' / 'data'}" in msg
    assert "refbayes data fetch australian" in msg


def test_missing_file_with_explicit_dir(no_data_env):
    with pytest.raises(FileNotFoundError, match=r"(?s)--data-dir: .*nowhere   <- used.*not set"):
        require_file("yacht", "uci_regression/yacht/data/data.txt", no_data_env / "nowhere")


def test_present_file_is_returned(no_data_env):
    (no_data_env / "d" / "x").mkdir(parents=True)
    (no_data_env / "d" / "x" / "f").write_text("")
    assert require_file("x", "x/f", no_data_env / "d") == Path(no_data_env / "d" / "x" / "f")
