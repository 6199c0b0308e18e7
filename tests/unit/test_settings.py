import os

import pytest

from dlstore import settings
from dlstore.sources.source import ReadOptions

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "settings.md")

# verify_threads' formula, "cores - 1, at least 1, at most 4", written out for the cores simulated.
VERIFY_THREADS = {1: 1, 2: 1, 3: 2, 16: 4}


@pytest.fixture
def cores(monkeypatch, request):
    monkeypatch.setattr(settings, "available_cores", lambda: request.param)
    for s in settings.SETTINGS.values():
        monkeypatch.delenv(s.env, raising=False)
    return request.param


@pytest.mark.parametrize("cores", sorted(VERIFY_THREADS), indirect=True)
def test_docs_are_generated_from_the_table_whatever_the_cores(cores):
    with open(DOC) as f:
        assert settings.markdown_table() in f.read(), "regenerate docs/settings.md from settings.markdown_table()"
    assert settings.get("verify_threads") == VERIFY_THREADS[cores]


def test_precedence_and_validation(monkeypatch):
    monkeypatch.delenv("DLSTORE_CHUNK_SIZE", raising=False)
    assert settings.get("chunk_size") == 8 << 20
    monkeypatch.setenv("DLSTORE_CHUNK_SIZE", "16M")
    assert settings.get("chunk_size") == 16 << 20
    assert settings.get("chunk_size", 1 << 20) == 1 << 20  # an explicit argument wins
    monkeypatch.setenv("DLSTORE_CHUNK_SIZE", "1k")
    with pytest.raises(ValueError, match="DLSTORE_CHUNK_SIZE"):
        settings.get("chunk_size")
    with pytest.raises(ValueError, match="io='fast'"):
        settings.get("io", "fast")


@pytest.mark.parametrize("name, env, value", [
    ("chunk_size", "DLSTORE_CHUNK_SIZE", "inf"),     # int(float("inf")) overflows
    ("chunk_size", "DLSTORE_CHUNK_SIZE", "1e20"),    # more than a size_t holds
    ("chunk_size", "DLSTORE_CHUNK_SIZE", "1e12"),    # an allocation that fails
    ("block_size", "DLSTORE_BLOCK_SIZE", "nan"),      # a control: refused before the bounds too
    ("shuffle_buffer", "DLSTORE_SHUFFLE_BUFFER", "1e30"),
    ("read_timeout", "DLSTORE_READ_TIMEOUT", "inf"),  # overflowed the C++ wait: every read timed out at once
    ("read_timeout", "DLSTORE_READ_TIMEOUT", "1e10"),
    ("read_timeout", "DLSTORE_READ_TIMEOUT", "nan"),  # a control: refused before the bounds too (nan >= 0 fails)
    ("io_threads", "DLSTORE_IO_THREADS", "100000"),  # threads the C++ core could not start: a bare RuntimeError
    ("verify_threads", "DLSTORE_VERIFY_THREADS", "100000"),
])
def test_values_beyond_any_use_are_refused_in_one_line(monkeypatch, name, env, value):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=f"{name}='{value}' \\(from environment variable {env}\\) is not valid"):
        settings.get(name)


@pytest.mark.parametrize("name", ["io_threads", "verify_threads"])
def test_thread_counts_are_bounded_naming_the_limit(name):
    assert settings.get(name, settings.MAX_THREADS) == settings.MAX_THREADS == 1024
    with pytest.raises(ValueError, match=f"^{name}=1025 \\(from argument\\) is not valid: expected .*, at most 1024$"):
        settings.get(name, 1025)
    with pytest.raises(ValueError, match=f"^{name}=1025 "):
        ReadOptions(**{name: 1025})  # refused where the options are made, before any reader


@pytest.mark.parametrize("cores", [3], indirect=True)
def test_case_rules_change_defaults_only(cores):
    plan = settings.Case("buffered", in_order=False, mounts=3, reorders=True)
    assert settings.effective("depth", None, plan) == 12  # 4 x 2 for the shuffle buffer, then 4 per mount
    assert settings.effective("depth", 5, plan) == 5
    assert settings.effective("depth", None, settings.Case("buffered", in_order=False, reorders=True)) == 8
    assert settings.effective("chunk_size", None, settings.Case("mmap")) == 64 << 20
    assert settings.effective("chunk_size", None, settings.Case("mmap", in_order=False)) == 8 << 20
    assert settings.effective("verify_threads", None, settings.Case("buffered")) == 2


@pytest.mark.parametrize("cores", [3], indirect=True)
def test_direct_cache_keeps_the_crc_threads(cores, monkeypatch):
    # A warm file comes from the page cache at memory speed (direct_cache on, the default): the CRC needs
    # its helper threads there. With it off, every read is the device's, and the consumer keeps up alone.
    assert settings.effective("verify_threads", None, settings.Case("direct")) == 2
    assert settings.effective("verify_threads", None, settings.Case("io_uring")) == 2
    monkeypatch.setenv("DLSTORE_DIRECT_CACHE", "0")
    assert settings.effective("verify_threads", None, settings.Case("direct")) == 0
    assert settings.effective("verify_threads", None, settings.Case("io_uring")) == 0
    assert settings.effective("verify_threads", 1, settings.Case("io_uring")) == 1


@pytest.mark.parametrize("cores", [16], indirect=True)
def test_an_environment_variable_counts_as_a_choice(cores, monkeypatch):
    monkeypatch.setenv("DLSTORE_DEPTH", "3")
    assert settings.effective("depth", None, settings.Case("buffered", in_order=False, mounts=4)) == 3


@pytest.mark.parametrize("cores", [16], indirect=True)
def test_read_options_use_the_table(cores):
    core = ReadOptions().core("direct", in_order=False, mounts=2, reorders=True)
    assert (core.engine, core.depth, core.chunk_size, core.queue_depth) == ("direct", 8, 8 << 20, 0)
    assert not hasattr(core, "headroom")  # a read plan never joins a record split between reads
    core = ReadOptions(verify_threads=3, on_error="warn").core("mmap")
    assert (core.depth, core.verify_threads, core.chunk_size, core.headroom) == (4, 3, 64 << 20, 1 << 20)
    assert core.on_error == "skip"
    assert ReadOptions().core("io_uring").verify_threads == 4  # direct_cache on: the default's CRC threads


def test_core_options_are_typed():
    from dlstore import _C

    core = _C.PlanOptions()
    with pytest.raises(TypeError):
        core.chunk_size = "8M"
    with pytest.raises(ValueError, match="on_error must be"):
        core.on_error = "warn"


@pytest.mark.parametrize("text, on", [("", False), ("0", False), ("off", False), ("1", True), ("yes", True)])
def test_no_progress_switch(monkeypatch, text, on):
    monkeypatch.setenv("DLSTORE_NO_PROGRESS", text)
    assert settings.get("no_progress") is on


def test_build_variables_are_the_ones_setup_reads():
    with open(os.path.join(os.path.dirname(DOC), "..", "setup.py")) as f:
        setup = f.read()
    for env in settings.BUILD_VARIABLES:
        assert f'"{env}"' in setup, f"{env} is documented but setup.py does not read it"


def test_an_empty_cache_setting_is_the_default(monkeypatch):
    monkeypatch.setenv("DLSTORE_CACHE", "  ")  # it was the current directory: indexes under relative paths
    assert settings.get("cache_dir") == os.path.expanduser("~/.cache/dlstore")
