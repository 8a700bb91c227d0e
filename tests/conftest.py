"""Shared fixtures: a tiny random model with the real SmolLM2 tokenizer, and the embedded model.

Tests never read or write the user's cache: before any test module is imported, SIEVERAG_CACHE
points at a temporary folder for the session (removed when it ends), and so do the cache and
config folders of the vLLM the tests start (which also sends no usage statistics) and the
folder where DeepSpeed compiles its ops. The embedded model is converted into it once per
session, and a second conversion fails the test that caused it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_paths import TESTS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SESSION_CACHE = Path(tempfile.mkdtemp(prefix="sieverag-test-cache-"))
os.environ["SIEVERAG_CACHE"] = str(SESSION_CACHE)
os.environ["VLLM_CACHE_ROOT"] = str(SESSION_CACHE / "vllm-cache")
os.environ["VLLM_CONFIG_ROOT"] = str(SESSION_CACHE / "vllm-config")
os.environ["VLLM_NO_USAGE_STATS"] = "1"
# DeepSpeed compiles its CPU ops (the multi-process tests' comm op) here, not in ~/.cache.
os.environ["TORCH_EXTENSIONS_DIR"] = str(SESSION_CACHE / "torch_extensions")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(SESSION_CACHE, ignore_errors=True)


# The slowest modules (each a minute or more), started first: under `make test`'s two
# pytest-xdist workers (--dist loadfile --no-loadscope-reorder) they run beside the rest
# instead of after it. Any other module keeps its place.
SLOWEST_FIRST = ("inference/llm/test_vllm_real.py", "training/test_train_multiprocess.py",
                 "serving/test_spans.py", "test_docs.py", "training/test_any_base_model.py",
                 "training/test_gpu_check.py", "data_gen/test_cxmi.py",
                 "training/test_train_command.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {module: place for place, module in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(TESTS).as_posix(), len(rank)))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_data_file(name: str) -> Path:
    """Path of a file in ../shared/data, skipping the test when the folder is absent."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"shared data file {path} absent")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama with SmolLM2's real tokenizer and chat template (no download)."""
    from tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session", autouse=True)
def embedded_model_converted_at_most_once() -> Iterator[None]:
    """Fail a test that would convert the embedded model a second time (~15 s each): one that
    points SIEVERAG_CACHE elsewhere and then loads the embedded model by name."""
    from sieverag.inference.llm import model_resolution

    convert = model_resolution._convert_gguf
    converted: list[Path] = []

    def convert_once(folder: Path, gguf_file: str, target: Path) -> None:
        if converted:
            pytest.fail(f"the embedded model is converted a second time this session, into "
                        f"{target} (first into {converted[0]}); use the embedded_model_dir "
                        "fixture, or keep SIEVERAG_CACHE where conftest.py set it")
        converted.append(target)
        convert(folder, gguf_file, target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_resolution, "_convert_gguf", convert_once)
        yield


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct, converted once into the session's cache."""
    from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where `filter_url`'s server saves its random filter adapter (which a module's
    in-process tests load too)."""
    return tmp_path_factory.mktemp("lora")


@pytest.fixture(scope="module")
def filter_url(tiny_model_dir: Path, lora_dir: Path) -> Iterator[str]:
    """The base URL of the rerank endpoint's clients' server (tests/rerank_server.py), one
    per test module that asks for it."""
    from rerank_server import serving_filter

    with serving_filter(tiny_model_dir, lora_dir) as url:
        yield url
