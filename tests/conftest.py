import os
import sys
from pathlib import Path

import pytest

# Each pytest-xdist worker launches its Gradio servers from a port range of its own (gradio reads
# GRADIO_SERVER_PORT when it is imported and tries the next 100 ports). Two workers scanning one range raced
# for a port: the loser's uvicorn thread died with "address already in use" before gradio tried the next port,
# and that thread's exception fails the test (pytest.ini).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit() and "GRADIO_SERVER_PORT" not in os.environ:
    os.environ["GRADIO_SERVER_PORT"] = str(7860 + 200 * int(_WORKER[2:]))

import packed_ss  # noqa: F401  (before torch: bounds OpenMP's spin as the app does, packed_ss.threads)
import torch

sys.path.insert(0, str(Path(__file__).parent))
ROOT = Path(__file__).resolve().parents[1]
# Tiny test models run fastest on one thread (intra-op threading only adds overhead at this size).
torch.set_num_threads(1)
EMBEDDED = ROOT / "assets" / "model"


@pytest.fixture(scope="session")
def embedded_model():
    """The shipped embedded model (float32, CPU); skipped until assets/model holds weights."""
    from packed_ss.models import DualModeModel

    if not (EMBEDDED / "model.safetensors").exists():
        pytest.skip("assets/model has no weights yet")
    return DualModeModel.from_pretrained(EMBEDDED, device="cpu", dtype="float64")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random dual-mode model saved with ``save_pretrained`` (what the CLI, app and bench load)."""
    from helpers import tiny_llama

    folder = tmp_path_factory.mktemp("tiny-model")
    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    model.model.config.mask_token_id = 1
    model.model.float().save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def client(server):
    """A gradio_client on the ``server`` fixture (a URL) of the module that asks for it."""
    from gradio_client import Client

    return Client(server, verbose=False)


@pytest.fixture(scope="session")
def nld_dir(tmp_path_factory):
    """A tiny random checkpoint in Nemotron-Labs-Diffusion's format, with a peft drafter adapter in its
    ``linear_spec_lora`` subfolder (tests.helpers.write_nld_checkpoint)."""
    from helpers import write_lora_adapter, write_nld_checkpoint

    folder = tmp_path_factory.mktemp("nld-tiny")
    state = write_nld_checkpoint(folder)
    write_lora_adapter(folder / "linear_spec_lora", state)
    return folder


@pytest.fixture(scope="session")
def nld_model(nld_dir):
    """The tiny NLD checkpoint loaded through the project's loader (float64, CPU, no adapter)."""
    from packed_ss.models import DualModeModel

    return DualModeModel.from_pretrained(nld_dir, device="cpu", dtype="float64")


@pytest.fixture(scope="session")
def tiny_any_order_dir(tmp_path_factory):
    """A tiny random any-order model (``any_order: true`` in its config) saved as a folder."""
    from helpers import tiny_any_order

    folder = tmp_path_factory.mktemp("tiny-any-order")
    model = tiny_any_order(vocab_size=20, seed=1)
    model.model.config.mask_token_id = 1
    model.model.float().save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return folder
